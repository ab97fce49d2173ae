import pg from 'pg';
import { ulid } from 'ulid';
import { beforeAll, describe, expect, inject, it } from 'vitest';
import { loadMigrations, type Engine } from '../../src/index.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { claimRun } from '../helpers/claim.js';
import { withDatabase } from '../setup/global-setup.js';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';
import { runCli, runCliProcess } from '../helpers/cli.js';

/**
 * The `runledger` command as an operator runs it, against this file's database, checked by
 * its exit code, its output and the tables it changed: run in this process (runCliMain, as
 * src/cli/main.ts runs it), and as a real process (`node --import tsx src/cli/main.ts ...`)
 * where the exit code and stderr of the program itself are the point (MIGRATION_MISMATCH,
 * the exit codes of usage errors and failures). Workflows run in an
 * in-process worker; states no workflow reaches quickly (a dead-lettered run, an
 * operation whose outcome is unknown) are made with the same SQL the engine uses.
 */

const t = useTestEngine({
  prepare: async (db) => {
    await db.pool.query('create table cli_steps (run_id text not null, step text not null)');
  },
});
const { db } = t;
const tracked = stoppedAfterEach();
let flows: ReturnType<typeof defineFlows>;

const cli = (args: string[], env: Record<string, string> = {}) => runCli(db.url, args, env);
const cliProcess = (args: string[], env: Record<string, string> = {}) => runCliProcess(db.url, args, env);

function defineFlows(e: Engine) {
  const mark = (runId: string, step: string) => e.pool.query('insert into cli_steps (run_id, step) values ($1, $2)', [runId, step]);
  const two = e.workflow({ name: 'cli-two', queue: 'cli' }, async (ctx, input: { n: number }) => {
    const a = await ctx.step('a', () => mark(ctx.runId, 'a').then(() => input.n));
    const b = await ctx.step('b', () => mark(ctx.runId, 'b').then(() => a * 2));
    return { a, b };
  });
  const waiter = e.workflow({ name: 'cli-waiter', queue: 'cli' }, async (ctx) => ctx.waitForSignal('reply'));
  const gate = e.workflow({ name: 'cli-gate', queue: 'cli' }, async (ctx) => {
    const decision = await ctx.requestApproval('ok', { action: 'deploy', evidence: { version: '2.0' }, approvers: ['alice'] });
    return { approved: decision?.approved, by: decision?.decidedBy, note: decision?.note };
  });
  const sleeper = e.workflow({ name: 'cli-sleeper', queue: 'cli' }, async (ctx) => ctx.sleep('nap', '1h'));
  // Served only once a test starts a worker for 'cli-ops'.
  const ticket = e.workflow({ name: 'cli-ticket', queue: 'cli-ops' }, async (ctx) =>
    ctx.operation<{ id: string }>('create-ticket', { idempotencyKey: `ticket-${ctx.runId}` }, async () => {
      throw new Error('not called: the outcome of the first call is settled by an operator');
    }),
  );
  return { two, waiter, gate, sleeper, ticket };
}

// The flows must be defined before the worker starts, so that it serves them (it stops with the engine).
beforeAll(async () => {
  flows = defineFlows(t.engine);
  await t.engine.runWorker({ queues: ['cli'], concurrency: 8, leaseMs: 2_000, pollIntervalMs: 100 });
});

const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const stepsRun = async (runId: string) =>
  (await db.pool.query('select step from cli_steps where run_id = $1 order by step', [runId])).rows.map((r) => r.step);

describe('runledger migrate', () => {
  it('applies every migration to an empty database, then finds it up to date', async () => {
    const adminUrl = inject('adminUrl');
    const name = `${db.name}_empty`;
    const admin = new pg.Client({ connectionString: adminUrl });
    await admin.connect();
    try {
      await admin.query(`create database ${name}`);
      const url = withDatabase(adminUrl, name);
      const first = await cli(['migrate'], { DATABASE_URL: url });
      expect(first).toMatchObject({ code: 0, stderr: '' });
      expect(first.stdout).toMatch(/^applied 0001_schema, 0002_runs, .*0014_security(, \d{4}_[a-z0-9_]+)*\n$/);
      expect(first.stdout).toBe(
        `applied ${loadMigrations()
          .map((m) => m.name)
          .join(', ')}\n`,
      );
      const second = await cli(['migrate', '--database-url', url], { DATABASE_URL: '' });
      expect(second).toMatchObject({ code: 0, stdout: 'schema runledger is up to date\n' });
      const check = new pg.Client({ connectionString: url });
      await check.connect();
      try {
        const applied = await check.query('select count(*)::int as n from runledger.migrations');
        expect(applied.rows[0].n).toBe(loadMigrations().length);
        const breaking = await check.query('select name from runledger.migrations where breaking order by version');
        expect(breaking.rows).toEqual([]);
      } finally {
        await check.end();
      }
    } finally {
      await admin.query(`drop database if exists ${name} with (force)`);
      await admin.end();
    }
  });

  it('refuses a database migrated with a different build: one line with MIGRATION_MISMATCH on stderr, exit 1', async () => {
    const saved = (await db.pool.query(`select checksum from runledger.migrations where name = '0002_runs'`)).rows[0].checksum;
    await db.pool.query(`update runledger.migrations set checksum = repeat('0', 64) where name = '0002_runs'`);
    try {
      const result = await cliProcess(['migrate']);
      expect(result).toMatchObject({ code: 1, stdout: '' });
      expect(result.stderr).toMatch(
        /^error \[MIGRATION_MISMATCH\]: runledger migration 0002_runs \(checksum differs\) .*different build of runledger.*\n$/,
      );
      expect(result.stderr.trim().split('\n')).toHaveLength(1);
    } finally {
      await db.pool.query(`update runledger.migrations set checksum = $1 where name = '0002_runs'`, [saved]);
    }
  });
});

describe('runledger start, runs, show', () => {
  it('starts a run (idempotently), lists it and shows its steps', async () => {
    const started = await cli(['start', 'cli-two', '{"n":2}', '--idempotency-key', 'order-7']);
    expect(started.code).toBe(0);
    const runId = started.stdout.trim();
    expect(runId).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);
    await waitFor('run succeeded', async () => (await runRow(runId)).status === 'SUCCEEDED');

    const [again, list, shown] = await Promise.all([
      cli(['start', 'cli-two', '{"n":2}', '--idempotency-key', 'order-7']),
      cli(['runs', '--workflow', 'cli-two', '--status', 'succeeded']),
      cli(['show', runId]),
    ]);
    expect(again).toMatchObject({ code: 0, stdout: `${runId}\n` });
    expect(list.code).toBe(0);
    expect(list.stdout).toMatch(new RegExp(`${runId}\\s+cli-two@1\\s+SUCCEEDED\\s+COMPLETED`));
    expect(shown.code).toBe(0);
    expect(shown.stdout).toMatch(/status\s+SUCCEEDED \(COMPLETED\)/);
    expect(shown.stdout).toMatch(/steps \(2 checkpoints\)\n.*\n\s+0\s+a\s+step\s+SUCCEEDED.*\n\s+1\s+b\s+step\s+SUCCEEDED/);
    expect(shown.stdout).toContain('{"a":2,"b":4}');
    expect(await stepsRun(runId)).toEqual(['a', 'b']);
  });

  it('show: a step that ran again after a crash shows the tries of the execution that recorded it, and the recovery count beside them', async () => {
    const clock = createTestClock('2031-01-01T00:00:00Z');
    const engine = createTestEngine({ connectionString: db.url, clock, crashAt: { step: 'price', when: 'before-checkpoint' } });
    let calls = 0;
    const flow = engine.workflow({ name: 'cli-crashed', queue: 'cli-crashed' }, async (ctx) => ctx.step('price', () => ++calls));
    try {
      const handle = await engine.start(flow, undefined);
      const doomed = await engine.runWorker({ manual: true, leaseMs: 30_000 });
      await doomed.drain();
      expect(doomed.crashed).toBe(true);
      const survivor = await engine.runWorker({ manual: true, leaseMs: 30_000 });
      clock.advance('31s');
      await survivor.drain();
      expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', recoveryAttempts: 1 });
      expect(calls).toBe(2);

      const shown = await cli(['show', handle.runId]);
      expect(shown.code).toBe(0);
      expect(shown.stdout).toMatch(
        /steps \(1 checkpoint, run recovered 1 time\)\n\s+#\s+STEP\s+KIND\s+STATUS\s+STARTED\s+TOOK\s+IN-PROC TRIES\s+TOKEN\n/,
      );
      // The checkpoint was written by the second execution (token 2), on its first try.
      expect(shown.stdout).toMatch(/\n\s+0\s+price\s+step\s+SUCCEEDED\s+\+\S+\s+\d+ m?s\s+1\s+2\n/);
      expect(shown.stdout).toContain('IN-PROC TRIES: tries by the execution that wrote the checkpoint (TOKEN)');
    } finally {
      await engine.close();
    }
  });
});

describe('runledger waiting, approvals, signal, approve, cancel', () => {
  it('an operator sees what runs wait for, delivers a signal, decides an approval and cancels a sleeping run', async () => {
    const waiter = await t.engine.start(flows.waiter, undefined);
    const gate = await t.engine.start(flows.gate, undefined);
    const sleeper = await t.engine.start(flows.sleeper, undefined);
    const idle = await t.engine.start(flows.sleeper, undefined);
    const ids = [waiter, gate, sleeper, idle].map((h) => h.runId);
    await waitFor('all waiting', async () => {
      const r = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'WAITING'`, [ids]);
      return r.rows[0].n === 4;
    });
    const requestId: string = (await db.pool.query('select request_id from runledger.approvals where run_id = $1', [gate.runId])).rows[0]
      .request_id;

    const [waiting, inbox, refused, noName, firstDup] = await Promise.all([
      cli(['waiting']),
      cli(['approvals']),
      cli(['approve', requestId, '--by', 'mallory']),
      cli(['approve', requestId]),
      cli(['signal', idle.runId, 'ping', '1', '--id', 'dup-1']),
    ]);
    expect(waiting.code).toBe(0);
    expect(waiting.stdout).toMatch(new RegExp(`${waiter.runId}\\s+cli-waiter\\s+signal reply`));
    expect(waiting.stdout).toMatch(new RegExp(`${gate.runId}\\s+cli-gate\\s+approval ${requestId}`));
    expect(waiting.stdout).toMatch(new RegExp(`${sleeper.runId}\\s+cli-sleeper\\s+timer\\s+nap`));
    expect(inbox.code).toBe(0);
    expect(inbox.stdout).toContain(`request ${requestId}  deploy`);
    expect(inbox.stdout).toMatch(/approvers\s+alice/);
    expect(inbox.stdout).toMatch(/evidence\s+\{"version":"2.0"\}/);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^error \[NOT_ALLOWED\]: decide_approval: 'mallory' may not decide/);
    expect(noName).toMatchObject({ code: 2, stdout: '' });
    expect(noName.stderr).toMatch(/^error \[USAGE\]: --by is required\nusage: runledger approve/);
    expect(firstDup).toMatchObject({ code: 0 });
    expect(firstDup.stdout).toContain(`signal dup-1 (ping) accepted by run ${idle.runId}`);

    const [signalled, approved, cancelled, secondDup] = await Promise.all([
      cli(['signal', waiter.runId, 'reply', '{"ok":true}', '--id', 'sig-1']),
      cli(['approve', requestId, '--by', 'alice', '--note', 'ship it']),
      cli(['cancel', sleeper.runId, '--reason', 'not needed']),
      cli(['signal', idle.runId, 'ping', '1', '--id', 'dup-1']),
    ]);
    expect(signalled).toMatchObject({ code: 0, stderr: '' });
    expect(approved.code).toBe(0);
    expect(approved.stdout).toMatch(new RegExp(`^request ${requestId} approved by alice at `));
    expect(cancelled).toMatchObject({ code: 0, stdout: `run ${sleeper.runId} is CANCELLED\n` });
    expect(secondDup).toMatchObject({ code: 0, stdout: `signal dup-1 had already been accepted by run ${idle.runId}: nothing changed\n` });

    await expect(waiter.result()).resolves.toEqual({ ok: true });
    await expect(gate.result()).resolves.toEqual({ approved: true, by: 'alice', note: 'ship it' });
    const signals = await db.pool.query('select signal_id, consumed_seq from runledger.signals where run_id = any($1) order by signal_id', [
      ids,
    ]);
    expect(signals.rows).toEqual([
      { signal_id: 'dup-1', consumed_seq: null },
      { signal_id: 'sig-1', consumed_seq: 0 },
    ]);
    expect(await runRow(sleeper.runId)).toMatchObject({
      status: 'CANCELLED',
      termination_reason: 'CANCELLED',
      termination_evidence: expect.objectContaining({ reason: 'not needed', was: 'WAITING' }),
    });
    await t.engine.cancel(idle.runId);
  });
});

describe('runledger dead-letter, retry', () => {
  it('lists a dead-lettered run with its reason, and brings it back to PENDING', async () => {
    await db.pool.query(`select runledger._register_workflow('cli-orphan', '1', 'nobody-serves', 0)`);
    const runId = (await db.pool.query(`select runledger.start_run('cli-orphan', '{}') as id`)).rows[0].id as string;
    // A worker claims it and dies: its 1 ms lease expires, and with max_recovery_attempts 0 the sweep dead-letters it.
    await claimRun(db, runId, { worker: 'dead-worker', leaseMs: 1 });
    await waitFor('dead-lettered', async () => {
      await db.pool.query('select runledger._recover_expired()');
      return (await runRow(runId)).status === 'DEAD_LETTER';
    });

    const listed = await cli(['dead-letter']);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toMatch(new RegExp(`${runId}\\s+cli-orphan@1\\s+MAX_RECOVERY_ATTEMPTS\\s+0/0`));
    const retried = await cli(['retry', runId]);
    expect(retried).toMatchObject({ code: 0, stderr: '' });
    expect(retried.stdout).toContain(`run ${runId} is PENDING again`);
    expect(await runRow(runId)).toMatchObject({ status: 'PENDING', termination_reason: null, recovery_attempts: 0 });

    const twice = await cli(['retry', runId]);
    expect(twice.code).toBe(1);
    expect(twice.stderr).toMatch(/^error \[INVALID_STATE\]: retry_run: run .* is PENDING/);
  });
});

describe('runledger compensate', () => {
  it('marks a dead-lettered run whose effects are not undone, sets it CANCELLING for a worker to compensate, and refuses a run not finished', async () => {
    await db.pool.query(`select runledger._register_workflow('cli-undo', '1', 'nobody-serves', 0)`);
    const runId = (await db.pool.query(`select runledger.start_run('cli-undo', '{}') as id`)).rows[0].id as string;
    const pending = (await db.pool.query(`select runledger.start_run('cli-undo', '{}') as id`)).rows[0].id as string;
    await db.pool.query(
      `insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, compensable)
       values ($1, $2, 0, 'book', $1, 'SUCCEEDED', true)`,
      [`op-${runId}`, runId],
    );
    await claimRun(db, runId, { worker: 'dead-worker', leaseMs: 1 });
    await waitFor('dead-lettered', async () => {
      await db.pool.query('select runledger._recover_expired()');
      return (await runRow(runId)).status === 'DEAD_LETTER';
    });

    const listed = await cli(['dead-letter']);
    expect(listed.stdout).toMatch(new RegExp(`${runId}\\s+cli-undo@1\\s+MAX_RECOVERY_ATTEMPTS\\s+0/0\\s+not undone`));
    const asked = await cli(['compensate', runId, '--reason', 'order withdrawn']);
    expect(asked).toMatchObject({ code: 0, stderr: '' });
    expect(asked.stdout).toContain(`run ${runId} is CANCELLING`);
    expect(asked.stdout).toContain('then the run ends DEAD_LETTER again');
    expect(await runRow(runId)).toMatchObject({ status: 'CANCELLING', lease_owner: null });
    expect((await runRow(runId)).stop_record).toMatchObject({ status: 'DEAD_LETTER', reason: 'MAX_RECOVERY_ATTEMPTS' });
    const again = await cli(['compensate', runId]);
    expect(again).toMatchObject({ code: 0, stdout: `run ${runId} is already CANCELLING: its compensations are being run\n` });

    const refused = await cli(['compensate', pending]);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toMatch(/^error \[INVALID_STATE\]: compensate_run: run .* is PENDING/);
  });
});

describe('runledger fork', () => {
  it('starts a run that reuses the checkpoints before --from and runs the rest', async () => {
    const source = await t.engine.start(flows.two, { n: 5 });
    await source.result();
    const [forked, outOfRange] = await Promise.all([
      cli(['fork', source.runId, '--from', '1']),
      cli(['fork', source.runId, '--from', '9']),
    ]);
    expect(forked.code).toBe(0);
    const forkId = forked.stdout.trim();
    expect(forkId).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}$/);
    expect(outOfRange.code).toBe(1);
    expect(outOfRange.stderr).toMatch(/^error \[INVALID_INPUT\]: fork_run: from_step must be between 0 and 2/);

    await waitFor('fork succeeded', async () => (await runRow(forkId)).status === 'SUCCEEDED');
    const fork = await runRow(forkId);
    expect(fork.output).toEqual({ a: 5, b: 10 });
    expect(fork.version_manifest).toMatchObject({ forked_from: source.runId, from_step: 1 });
    expect(await stepsRun(forkId)).toEqual(['b']); // step a was reused from the source
  });
});

describe('runledger unknown, resolve', () => {
  it('an operation whose outcome is unknown is listed, settled by the operator, and its run completes', async () => {
    const handle = await t.engine.start(flows.ticket, undefined);
    const key = `ticket-${handle.runId}`;
    // A worker records the intent (STARTED) and dies before the outcome: what ctx.operation does up to the call.
    const claimed = await claimRun(db, handle.runId, { worker: 'dead-worker', leaseMs: 60_000 });
    const operationId = (
      await db.pool.query(`select operation_id from runledger._operation_begin($1, $2, 0, 'create-ticket', $3, false, false)`, [
        handle.runId,
        claimed[0]!.fencing_token,
        key,
      ])
    ).rows[0].operation_id as string;
    await db.pool.query(`update runledger.runs set lease_expires_at = runledger.now() - interval '1 second' where run_id = $1`, [
      handle.runId,
    ]);
    await db.pool.query('select runledger._recover_expired()');
    tracked.workers.push(await t.engine.runWorker({ queues: ['cli-ops'], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 100 }));
    await waitFor('waiting for an operator', async () => (await runRow(handle.runId)).wait_kind === 'reconcile');

    const [listed, badStatus] = await Promise.all([cli(['unknown']), cli(['resolve', operationId, '--status', 'maybe'])]);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain(`operation ${operationId}  create-ticket  UNKNOWN since`);
    expect(listed.stdout).toMatch(new RegExp(`key\\s+${key}`));
    expect(badStatus).toMatchObject({ code: 2, stderr: 'error [USAGE]: --status must be SUCCEEDED or FAILED, got "maybe"\n' });

    const resolved = await cli(['resolve', operationId, '--status', 'succeeded', '--result', '{"id":"T-1"}', '--by', 'oncall']);
    expect(resolved).toMatchObject({ code: 0, stderr: '' });
    expect(resolved.stdout).toContain(`operation ${operationId} resolved as SUCCEEDED`);
    await expect(handle.result()).resolves.toEqual({ id: 'T-1' });
    const op = await db.pool.query('select status, result, resolved_by from runledger.operations where operation_id = $1', [operationId]);
    expect(op.rows).toEqual([{ status: 'SUCCEEDED', result: { id: 'T-1' }, resolved_by: 'oncall' }]);
  });
});

describe('runledger set-queue, queues', () => {
  it('creates a paused, limited queue, shows it with its backlog, then resumes it', async () => {
    const created = await cli(['set-queue', 'cli-limited', '--concurrency', '2', '--per-key', '1', '--rate', '10/1000', '--pause']);
    expect(created).toMatchObject({ code: 0, stdout: 'queue cli-limited: PAUSED, concurrency 2, per key 1, 10 per 1000 ms\n' });
    for (const tenant of ['tenant-a', 'tenant-a', 'tenant-b'])
      await t.engine.start(flows.two, { n: 1 }, { queue: 'cli-limited', concurrencyKey: tenant });

    const [table, byKey, badRate, badName] = await Promise.all([
      cli(['queues']),
      cli(['queues', '--keys']),
      cli(['set-queue', 'cli-limited', '--rate', '10']),
      cli(['set-queue', 'bad name!', '--concurrency', '1']),
    ]);
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(/cli-limited\s+3\s+0\s+0\s+0\s+\S+ ago\s+PAUSED conc=2 key=1 rate=10\/1000ms/);
    expect(byKey.stdout).toMatch(/cli-limited\/tenant-a\s+2\s+0/);
    expect(badRate.code).toBe(2);
    expect(badRate.stderr).toMatch(/^error \[USAGE\]: --rate must be MAX\/PERIOD_MS/);
    expect(badName.code).toBe(1);
    expect(badName.stderr).toMatch(/^error \[INVALID_INPUT\]: set_queue: invalid queue name/);

    const resumed = await cli(['set-queue', 'cli-limited', '--resume', '--concurrency', 'none']);
    expect(resumed).toMatchObject({ code: 0, stdout: 'queue cli-limited: per key 1, 10 per 1000 ms\n' });
    const queue = await db.pool.query(`select concurrency, per_key_concurrency, paused from runledger.queues where name = 'cli-limited'`);
    expect(queue.rows).toEqual([{ concurrency: null, per_key_concurrency: 1, paused: false }]);
    // Resumed: one run per tenant is admitted at once (per key 1); no worker serves this queue, so they stay there.
    const admitted = await db.pool.query(
      `select concurrency_key from runledger.runs where queue_name = 'cli-limited' and admitted order by 1`,
    );
    expect(admitted.rows.map((r) => r.concurrency_key)).toEqual(['tenant-a', 'tenant-b']);
  });
});

describe('errors', () => {
  it('usage errors exit 2; failures exit 1 with the runledger error code', async () => {
    const [unknownCommand, noDatabase, badJson, missingRun] = await Promise.all([
      cliProcess(['frobnicate']),
      cliProcess(['runs'], { DATABASE_URL: '' }),
      cliProcess(['start', 'cli-two', '{bad']),
      cliProcess(['cancel', `no-such-run-${ulid()}`]),
    ]);
    expect(unknownCommand).toMatchObject({ code: 2, stdout: '' });
    expect(unknownCommand.stderr).toMatch(/^error \[USAGE\]: unknown command "frobnicate"/);
    expect(noDatabase).toMatchObject({
      code: 2,
      stderr: 'error [NO_DATABASE]: no database: pass --database-url postgres://... or set DATABASE_URL\n',
    });
    expect(badJson.code).toBe(2);
    expect(badJson.stderr).toMatch(/^error \[USAGE\]: JSON_INPUT is not valid JSON/);
    expect(missingRun.code).toBe(1);
    expect(missingRun.stderr).toMatch(/^error \[NOT_FOUND\]: cancel_run: run 'no-such-run-.*' not found\n$/);
  });
});
