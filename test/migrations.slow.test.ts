import { beforeAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import type { MigrateFunction, Workflow } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';
import { queueWorkers } from './helpers/cleanup.js';
import { runCli } from './helpers/cli.js';

/**
 * Run migrations in one process: what migrate_run refuses (and leaves unchanged), what a
 * migrate may return and what is refused as a failed migration, and the canary form.
 * (Migrations across real worker processes: test/engine/worker/versions.slow.test.ts.)
 */
const t = useTestEngine();
const { db } = t;
const startWorker = queueWorkers(() => t.engine, 'moving');

let plan: MigrateFunction = () => undefined;
let v1: Workflow<any, any>;
let other1: Workflow<any, any>;
beforeAll(() => {
  // Version 1: a run waits for the signal 'go' between two steps.
  v1 = t.engine.workflow({ name: 'moving', version: '1', queue: 'moving' }, async (ctx, input: { n: number }) => {
    const a = await ctx.step('a', () => {
      void ctx.stream('log').write(`a=${input.n}`); // a record tied to step position 0 (stored before the checkpoint)
      return input.n;
    });
    await ctx.waitForSignal('go');
    return ctx.step('b', () => `v1:${a}`);
  });
  t.engine.workflow(
    {
      name: 'moving',
      version: '2',
      queue: 'moving',
      input: z.object({ n: z.number() }),
      manifest: { prompt: 'p2' },
      migrations: { '1': (args) => plan(args) },
    },
    async (ctx, input) => {
      const a = await ctx.step('a', () => input.n);
      await ctx.waitForSignal('go');
      return ctx.step('b2', () => `v2:${a}`);
    },
  );
  // Two versions served, and no migration between them.
  other1 = t.engine.workflow({ name: 'other', version: '1', queue: 'moving' }, async (ctx) => ctx.waitForSignal('go'));
  t.engine.workflow({ name: 'other', version: '2', queue: 'moving' }, async (ctx) => ctx.waitForSignal('go'));
});

const runRow = async (runId: string) =>
  (
    await db.pool.query('select workflow_version, status, migrate_to, input, version_manifest from runledger.runs where run_id = $1', [
      runId,
    ])
  ).rows[0];
const steps = async (runId: string) =>
  (await db.pool.query('select seq, name, kind, status, output from runledger.steps where run_id = $1 order by seq', [runId])).rows;

async function waitingRun(n: number): Promise<string> {
  const handle = await t.engine.start(v1, { n });
  await waitFor('waiting for go', async () => ((await runRow(handle.runId)).status === 'WAITING' ? true : undefined));
  return handle.runId;
}

describe('migrate_run refuses', () => {
  it('an unknown run, a bad version, its own version, a version or migration no live worker has, and a finished run; nothing changes', async () => {
    await startWorker();
    const runId = await waitingRun(1);
    const before = [await runRow(runId), await steps(runId)];
    await expect(t.engine.migrateRun('no-such-run', '2')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    await expect(t.engine.migrateRun(runId, 'not a version!')).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(t.engine.migrateRun(runId, '1')).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining('already on version 1'),
    });
    await expect(t.engine.migrateRun(runId, '3')).rejects.toMatchObject({
      code: 'UNKNOWN_WORKFLOW',
      message: expect.stringContaining('no live worker serves moving@3'),
    });
    const otherRun = (await t.engine.start(other1, undefined)).runId;
    await waitFor('other waits', async () => ((await runRow(otherRun)).status === 'WAITING' ? true : undefined));
    await expect(t.engine.migrateRun(otherRun, '2')).rejects.toMatchObject({
      code: 'UNKNOWN_WORKFLOW',
      message: expect.stringContaining('no live worker has a migration of other from version 1 to 2'),
    });
    await expect(t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2', limit: 0 })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
    });
    expect([await runRow(runId), await steps(runId)]).toEqual(before);

    await t.engine.signal(runId, 'go');
    await waitFor('finished', async () => ((await runRow(runId)).status === 'SUCCEEDED' ? true : undefined));
    await expect(t.engine.migrateRun(runId, '2')).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining('a finished run stays on the version it finished on'),
    });
    const events = await db.pool.query(`select kind from runledger.events where run_id = $1 and kind like 'migrat%'`, [runId]);
    expect(events.rows).toEqual([]);
  });

  it('bad migrations at definition', () => {
    const define = (migrations: unknown) =>
      t.engine.workflow({ name: 'bad-migrations', version: '2', migrations: migrations as never }, async () => 1);
    expect(() => define([])).toThrow(expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('must be an object') }));
    expect(() => define({ '2': () => undefined })).toThrow(
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('to itself') }),
    );
    expect(() => define({ '1': 'not a function' })).toThrow(
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('must be a function') }),
    );
    expect(() => define({ 'bad version': () => undefined })).toThrow(expect.objectContaining({ code: 'CONFIG' }));
  });
});

describe('a migration', () => {
  it('that returns what cannot be written fails, is recorded, and leaves the run as it was', async () => {
    await startWorker();
    const runId = await waitingRun(2);
    const before = [await runRow(runId), await steps(runId)];
    const cases: Array<[string, MigrateFunction, string]> = [
      ['both forms', ({ checkpoints }) => ({ checkpoints, continueFrom: 1 }), 'both checkpoints and continueFrom'],
      ['a position past the history', () => ({ continueFrom: 9 }), 'continueFrom must be a whole number between 0 and 2'],
      ['the wait of a waiting run dropped', () => ({ continueFrom: 1 }), 'keeps that wait as its last checkpoint'],
      ['an input version 2 refuses', () => ({ input: { n: 'two' } }), "does not match version 2's schema"],
      ['a checkpoint without a name', () => ({ checkpoints: [{ output: 1 } as never] }), 'checkpoint 0 needs a name'],
      ['an unknown field', () => ({ inputs: {} }) as never, 'unknown field(s) inputs'],
      [
        'a renamed checkpoint that a stream chunk is tied to',
        ({ checkpoints }) => ({ checkpoints: [{ ...checkpoints[0]!, name: 'a-renamed' }, checkpoints[1]!] }),
        'has records tied to step positions up to 0',
      ],
      [
        'a throw',
        () => {
          throw new Error('no way');
        },
        'threw: no way',
      ],
    ];
    for (const [what, migrate, message] of cases) {
      plan = migrate;
      await expect(t.engine.migrateRun(runId, '2'), what).rejects.toMatchObject({
        code: 'MIGRATION_FAILED',
        message: expect.stringContaining(message),
      });
      expect([await runRow(runId), await steps(runId)], what).toEqual(before);
    }
    const failed = await db.pool.query(`select count(*)::int as n from runledger.events where run_id = $1 and kind = 'migration_failed'`, [
      runId,
    ]);
    expect(failed.rows[0].n).toBe(cases.length);

    // The run still works on version 1.
    await t.engine.signal(runId, 'go');
    await waitFor('finished', async () => ((await runRow(runId)).status === 'SUCCEEDED' ? true : undefined));
    expect((await t.engine.getRun(runId))?.output).toBe('v1:2');
  });

  it('moves the oldest runs first with a limit (a canary), then the rest; each finishes on version 2 with transformed checkpoints', async () => {
    await startWorker();
    const runs: string[] = [];
    for (let n = 10; n < 14; n++) runs.push(await waitingRun(n));
    plan = ({ checkpoints }) => ({
      checkpoints: checkpoints.map((c) => (c.name === 'a' ? { ...c, output: (c.output as number) * 100 } : c)),
    });

    const { marked: canary, skipped } = await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2', limit: 2 });
    expect(canary).toEqual(runs.slice(0, 2));
    expect(skipped).toEqual([]);
    await waitFor('canary migrated', async () =>
      (await Promise.all(canary.map(runRow))).every((r) => r.workflow_version === '2' && r.migrate_to === null) ? true : undefined,
    );
    expect((await Promise.all(runs.slice(2).map(runRow))).map((r) => r.workflow_version)).toEqual(['1', '1']);
    // The canary is watched: signalled, it finishes on version 2's code.
    for (const runId of canary) await t.engine.signal(runId, 'go');
    await waitFor('canary finished', async () =>
      (await Promise.all(canary.map(runRow))).every((r) => r.status === 'SUCCEEDED') ? true : undefined,
    );
    expect(await Promise.all(canary.map(async (id) => (await t.engine.getRun(id))?.output))).toEqual(['v2:1000', 'v2:1100']);

    const { marked: rest } = await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2' });
    expect(rest).toEqual(runs.slice(2));
    await waitFor('rest migrated', async () =>
      (await Promise.all(rest.map(runRow))).every((r) => r.workflow_version === '2') ? true : undefined,
    );
    for (const runId of rest) await t.engine.signal(runId, 'go');
    await waitFor('all finished', async () =>
      (await Promise.all(rest.map(runRow))).every((r) => r.status === 'SUCCEEDED') ? true : undefined,
    );
    const finished = await steps(rest[0]!);
    expect(finished.map((s) => [s.seq, s.name, s.status, s.output])).toEqual([
      [0, 'a', 'SUCCEEDED', 1200],
      [1, 'go', 'SUCCEEDED', finished[1]!.output],
      [2, 'b2', 'SUCCEEDED', 'v2:1200'],
    ]);
    const row = await runRow(rest[0]!);
    expect(row.version_manifest).toMatchObject({ workflow: 'moving@2', manifest: { prompt: 'p2' }, migrated_from: '1' });
  });

  it('a batch of marked runs is applied at once on the notification, not a pass per sweep', async () => {
    // The sweep is 10 minutes away: only migrate_runs' notification can start the migrations.
    const worker = await t.engine.runWorker({
      queues: ['moving'],
      concurrency: 8,
      leaseMs: 2_000,
      pollIntervalMs: 100,
      sweepIntervalMs: 600_000,
    });
    try {
      const runs = 250;
      await db.pool.query(
        `select runledger.start_runs('moving', (select jsonb_agg(jsonb_build_object('n', i)) from generate_series(1, $1) i), '{"version": "1"}')`,
        [runs],
      );
      const count = async (where: string) =>
        (await db.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'moving' and ${where}`)).rows[0]
          .n as number;
      await waitFor('all waiting', async () =>
        (await count(`workflow_version = '1' and status = 'WAITING'`)) === runs ? true : undefined,
      );
      plan = () => undefined;
      const { marked } = await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2' });
      expect(marked).toHaveLength(runs);
      await waitFor(
        'all migrated',
        async () => ((await count(`workflow_version = '2' and migrate_to is null and status = 'WAITING'`)) >= runs ? true : undefined),
        20_000,
      );
      expect(await count(`migrate_to is not null`)).toBe(0);
    } finally {
      await worker.stop();
    }
  });

  it('moves an admitted PENDING run without a second admission in a rate-limited queue', async () => {
    await t.engine.setQueue('moving-limited', { rateLimit: { max: 100, periodMs: 3_600_000 } });
    // Version 1 is defined by another engine that runs no worker: its run stays PENDING (stranded).
    const elsewhere = t.newEngine();
    const oldCode = elsewhere.workflow({ name: 'limited-mover', version: '1', queue: 'moving-limited' }, async () => 'v1');
    t.engine.workflow(
      { name: 'limited-mover', version: '2', queue: 'moving-limited', migrations: { '1': () => undefined } },
      async () => 'v2',
    );
    const worker = await t.engine.runWorker({ queues: ['moving-limited'], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      const { runId } = await elsewhere.start(oldCode, undefined);
      const admitted = async () =>
        (await db.pool.query(`select count(*)::int as n from runledger.admissions where queue_name = 'moving-limited'`)).rows[0].n;
      await waitFor('admitted', async () =>
        (await db.pool.query('select admitted from runledger.runs where run_id = $1', [runId])).rows[0].admitted ? true : undefined,
      );
      expect(await admitted()).toBe(1);
      expect(await t.engine.migrateRun(runId, '2')).toMatchObject({ outcome: 'migrated' });
      await waitFor('finished on v2', async () => ((await t.engine.getRun(runId))?.status === 'SUCCEEDED' ? true : undefined));
      expect((await t.engine.getRun(runId))?.output).toBe('v2');
      expect(await admitted()).toBe(1);
    } finally {
      await worker.stop();
    }
  });

  it('reports each run of the selection another transaction holds locked (skipped, with why) instead of leaving it on version 1 without a word', async () => {
    await startWorker();
    plan = () => undefined;
    await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2' }); // the earlier tests' runs
    const runs = [await waitingRun(30), await waitingRun(31), await waitingRun(32)];
    const holder = await db.pool.connect();
    const locked = expect.stringContaining('locked by another transaction at that moment: not marked');
    try {
      // A second connection holds the oldest run's row (an operator's open transaction).
      await holder.query('begin');
      await holder.query('select 1 from runledger.runs where run_id = $1 for update', [runs[0]]);
      // The canary of one takes the next run, and names the one it passed over.
      expect(await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2', limit: 1 })).toEqual({
        marked: [runs[1]],
        skipped: [{ runId: runs[0], reason: locked }],
      });
      expect(await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2' })).toEqual({
        marked: [runs[2]],
        skipped: [{ runId: runs[0], reason: locked }],
      });
      const [first] = (
        await db.pool.query(`select result from runledger.audit_log where action = 'migrate_runs' order by audit_id desc limit 1`)
      ).rows;
      expect(first.result).toEqual({ marked: 1, run_ids: [runs[2]], skipped: 1, skipped_runs: [{ run_id: runs[0], reason: locked }] });
      // The CLI lists it, says it stays on version 1, and exits 1.
      const cli = await runCli(db.url, ['migrate-run', '--workflow', 'moving', '--all-of', '1', '--to', '2', '--no-wait']);
      expect(cli.stdout).toContain('marked 0 run(s) of moving@1 for version 2');
      expect(cli.stdout).toContain('skipped 1 run(s) of the selection, left on version 1');
      expect(cli.stdout).toContain(`${runs[0]}  skipped, still on version 1: locked by another transaction`);
      expect(cli).toMatchObject({
        code: 1,
        stderr: expect.stringMatching(/^error \[MIGRATION_SKIPPED\]: 1 run\(s\) of moving@1 were not marked/),
      });
      expect((await runRow(runs[0]!)).migrate_to).toBeNull();
    } finally {
      await holder.query('rollback');
      holder.release();
    }
    // Released: the next call marks it.
    expect(await t.engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2' })).toEqual({
      marked: [runs[0]],
      skipped: [],
    });
    await waitFor('all migrated', async () =>
      (await Promise.all(runs.map(runRow))).every((r) => r.workflow_version === '2') ? true : undefined,
    );
  });
});
