import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { createEngine } from '../../../src/index.js';
import { hasUnstorableEscape, storableJson, storableText, unstorableIndex } from '../../../src/engine/core/storable.js';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { createPoisonTables, definePoisonWorkflows, LONE, NUL, POISON_KINDS } from '../../fixtures/poison-workflows.js';
import { fileURLToPath } from 'node:url';

/**
 * One run's value that PostgreSQL cannot store (a NUL, a lone surrogate) fails that run
 * where the value is produced, with a coded error naming it, and never the group commit
 * it shares with other runs (docs/guarantees.md, "One run's bad value").
 */
const POISON_WORKER = fileURLToPath(new URL('../../fixtures/poison-worker.ts', import.meta.url));

const t = useTestEngine({ prepare: (db) => createPoisonTables(db.pool) });
const { db } = t;
const { processes: spawned } = stoppedAfterEach();

afterEach(async () => {
  await db.pool.query('truncate poison_executions, poison_orders');
});

describe('unstorable characters (core/storable.ts)', () => {
  it('finds a NUL and a lone surrogate of either half, and lets a whole surrogate pair pass', () => {
    expect(unstorableIndex('plain')).toBe(-1);
    expect(unstorableIndex('emoji 😀 whole')).toBe(-1);
    expect(unstorableIndex(NUL)).toBe(1);
    expect(unstorableIndex(LONE)).toBe(6);
    expect(unstorableIndex('x\udc00')).toBe(1); // a low half alone
    expect(unstorableIndex('\ud83d\ud83d\ude00')).toBe(0); // a high half, then a whole pair
  });

  it('reads JSON.stringify escapes: \\u0000 and a lone surrogate are refused, an escaped backslash before u0000 is text', () => {
    expect(hasUnstorableEscape(JSON.stringify({ a: NUL }))).toBe(true);
    expect(hasUnstorableEscape(JSON.stringify([LONE]))).toBe(true);
    expect(hasUnstorableEscape(JSON.stringify({ a: '\\u0000 is how JSON writes NUL' }))).toBe(false);
    expect(hasUnstorableEscape(JSON.stringify({ a: 'tab\tand \u0001' }))).toBe(false);
    expect(hasUnstorableEscape('"\\ud83d\\ude00"')).toBe(false); // a pair another producer escaped
    expect(hasUnstorableEscape(JSON.stringify('😀'))).toBe(false);
  });

  it('keeps diagnostics by turning the characters into U+FFFD, in text and in JSON text', () => {
    expect(storableText(`x${NUL}${LONE}`)).toBe('xa\ufffdbGreat \ufffd');
    const json = storableJson(JSON.stringify({ message: `m ${NUL}`, literal: '\\u0000' }));
    expect(JSON.parse(json)).toEqual({ message: 'm a\ufffdb', literal: '\\u0000' });
    expect(storableJson('{"ok":1}')).toBe('{"ok":1}');
  });
});

describe('client calls refuse an unstorable value with INVALID_INPUT and store nothing', () => {
  let defined: ReturnType<typeof define> | undefined;
  const define = () => t.engine.workflow({ name: 'plain-start' }, async (_ctx, input: unknown) => input);
  const wf = () => (defined ??= define());

  async function counts() {
    const { rows } = await db.pool.query(
      `select (select count(*)::int from runledger.runs) as runs, (select count(*)::int from runledger.signals) as signals`,
    );
    return rows[0];
  }

  it('engine.start and engine.startMany: the input, idempotency key, concurrency key, tenant id and run id', async () => {
    const workflow = wf();
    const before = await counts();
    const refused = [
      () => t.engine.start(workflow, { text: NUL }),
      () => t.engine.start(workflow, { [LONE]: 1 }),
      () => t.engine.start(workflow, {}, { idempotencyKey: `k${LONE}` }),
      () => t.engine.start(workflow, {}, { concurrencyKey: NUL }),
      () => t.engine.start(workflow, {}, { tenantId: `t${NUL}` }),
      () => t.engine.start(workflow, {}, { runId: `r${LONE}` }),
      () => t.engine.startMany(workflow, [{ a: 1 }, { b: LONE }]),
      () => t.engine.startMany(workflow, [{}, {}], { idempotencyKeys: ['fine', `k${NUL}`] }),
    ];
    for (const call of refused) {
      const error = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error, String(call)).toMatchObject({ code: 'INVALID_INPUT' });
      expect((error as Error).message).toMatch(/NUL character|lone surrogate/);
    }
    expect(await counts()).toEqual(before);
  });

  it('t.engine.signal (payload, topic, signal id), cancel and compensate (reason), decideApproval (decider, note)', async () => {
    const { runId } = await t.engine.start(wf(), { n: 1 });
    const before = await counts();
    const refused = [
      () => t.engine.signal(runId, 'go', { text: NUL }),
      () => t.engine.signal(runId, 'go', 'fine', { signalId: `s${LONE}` }),
      () => t.engine.cancel(runId, { reason: `because ${NUL}` }),
      () => t.engine.compensate(runId, { reason: LONE }),
      () => t.engine.decideApproval('no-such-request', { approved: true, decidedBy: `ann${NUL}` }),
      () => t.engine.resolveOperation('no-such-op', { status: 'SUCCEEDED', result: { x: LONE } }),
    ];
    for (const call of refused) {
      const error = await call().then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error, String(call)).toMatchObject({ code: 'INVALID_INPUT' });
    }
    expect(await counts()).toEqual(before);
    expect((await db.pool.query('select status, cancel_requested_at from runledger.runs where run_id = $1', [runId])).rows[0]).toEqual({
      status: 'PENDING',
      cancel_requested_at: null,
    });
  });
});

describe('poison runs beside healthy runs, in one worker process and its group commits', () => {
  async function worker(): Promise<WorkerProcess> {
    const w = await spawnWorker({ DATABASE_URL: db.url, CONCURRENCY: '64' }, POISON_WORKER);
    spawned.push(w);
    onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-20000)}`));
    return w;
  }

  it('every healthy step commits exactly once with recovery_attempts = 0; each poison run ends FAILED with a coded error naming the value', async () => {
    // A client-only engine starts the runs, in one burst, the poison ones among the healthy.
    const client = createEngine({ connectionString: db.url, log: () => {} });
    const { steady, poison } = definePoisonWorkflows(client);
    const w = await worker();
    try {
      const starts: Array<Promise<{ runId: string; kind: string }>> = [];
      for (let i = 0; i < 40; i++) {
        starts.push(client.start(steady, { n: i }).then((h) => ({ runId: h.runId, kind: 'healthy' })));
        const kind = POISON_KINDS[i % 4 === 0 ? i / 4 : -1];
        if (kind) starts.push(client.start(poison, { kind }).then((h) => ({ runId: h.runId, kind })));
      }
      // The remaining kinds, should there be more than ten.
      for (const kind of POISON_KINDS.slice(10)) starts.push(client.start(poison, { kind }).then((h) => ({ runId: h.runId, kind })));
      const runs = await Promise.all(starts);
      const ids = runs.map((r) => r.runId);
      expect(runs.filter((r) => r.kind !== 'healthy').map((r) => r.kind)).toEqual([...POISON_KINDS]);

      await waitFor(
        'every run finished',
        async () => {
          const left = await db.pool.query(
            `select run_id, status, workflow_name, recovery_attempts, (select input from runledger.runs i where i.run_id = r.run_id) as input
               from runledger.runs r where run_id = any($1) and status not in ('SUCCEEDED', 'FAILED', 'DEAD_LETTER')`,
            [ids],
          );
          if (left.rowCount === 0) return true;
          throw new Error(`${left.rowCount} unfinished, e.g. ${JSON.stringify(left.rows.slice(0, 5))}`);
        },
        30_000,
      );

      const { rows } = await db.pool.query(
        `select run_id, status, recovery_attempts, error, termination_reason,
                (select count(*)::int from runledger.events e where e.run_id = r.run_id and e.kind in ('released', 'lease_expired')) as releases
           from runledger.runs r where run_id = any($1)`,
        [ids],
      );
      const byId = new Map(rows.map((row) => [row.run_id as string, row]));
      const executions = await db.pool.query(
        `select run_id, step, count(*)::int as n from poison_executions where run_id = any($1) group by run_id, step`,
        [ids],
      );
      const ran = new Map(executions.rows.map((row) => [`${row.run_id}/${row.step}`, row.n as number]));

      for (const { runId, kind } of runs) {
        const row = byId.get(runId)!;
        expect(row.recovery_attempts, `${kind} ${runId}: recovery attempts`).toBe(0);
        expect(row.releases, `${kind} ${runId}: releases`).toBe(0);
        if (kind === 'healthy') {
          expect(row.status, `healthy ${runId}`).toBe('SUCCEEDED');
          for (const step of ['one', 'two', 'three']) expect(ran.get(`${runId}/${step}`), `${runId} ${step}`).toBe(1);
        } else {
          expect(row.status, `${kind} ${runId}`).toBe('FAILED');
          expect(row.termination_reason).toBe('FAILED');
          expect(ran.get(`${runId}/before`), `${kind} ${runId}: the healthy step before`).toBe(1);
          if (kind === 'thrown-message') {
            // The user's own error, kept: its characters PostgreSQL cannot hold are U+FFFD.
            expect(row.error.message).toContain('cannot read a\ufffdb nor Great \ufffd');
          } else {
            // Refused where it was produced: the run's own write, or the step it was made in (its failure rethrown: STEP_FAILED).
            const failedStep = (
              await db.pool.query(`select name, error from runledger.steps where run_id = $1 and status = 'FAILED'`, [runId])
            ).rows;
            const refusal = row.error.code === 'STEP_FAILED' ? failedStep[0]?.error : row.error;
            expect(refusal, `${kind}: ${JSON.stringify(row.error)}`).toMatchObject({ code: 'OUTPUT_NOT_SERIALIZABLE' });
            expect(row.error.message, kind).toMatch(/NUL character \(U\+0000\)|lone surrogate \(U\+D83D/);
          }
        }
      }
      // Every healthy run's business row, once.
      const orders = await db.pool.query('select count(*)::int as n, count(distinct run_id)::int as runs from poison_orders');
      expect(orders.rows[0]).toEqual({ n: 40, runs: 40 });
    } finally {
      await client.close();
      w.kill('SIGTERM');
      await w.exited;
    }
  });
});
