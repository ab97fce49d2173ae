/**
 * runledger.start_runs: many runs of one workflow in one statement, ids in input order,
 * the same checks and idempotency as start_run, and one announcement for the batch.
 *
 * The tests run in a transaction on the shared database, rolled back at their end
 * (test/helpers/test-tx.ts), on a workflow named after the file; the one that listens for
 * the announcement has a database of its own, since a notification is delivered at commit.
 */
import { describe, expect, it as dbTest } from 'vitest';
import { inSavepoint, txTest } from '../helpers/test-tx.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { runHelpers, ULID, registerWorkflow, type Queryable, type TxDb } from '../helpers/runs.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const WORKFLOW = 'start-runs';

const it = txTest.extend<{ db: TxDb }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
});

async function startRuns(on: Queryable, inputs: unknown, options: Record<string, unknown> = {}, workflow = WORKFLOW): Promise<string[]> {
  const result = await on.query('select runledger.start_runs($1, $2::jsonb, $3::jsonb) as ids', [
    workflow,
    JSON.stringify(inputs),
    JSON.stringify(options),
  ]);
  return result.rows[0].ids;
}

describe('runledger.start_runs', () => {
  describe('on a database of its own (the announcement is delivered at commit)', () => {
    const { db } = useTestEngine({ engine: false, prepare: (own) => registerWorkflow(own.pool, WORKFLOW) });
    const { events } = runHelpers(db);
    const { notified } = notifyHelpers(db);

    dbTest('starts one PENDING run per input, returns the ids in input order, writes their created events and announces the queue once', async () => {
      const inputs = Array.from({ length: 50 }, (_, n) => ({ n }));
      const { result: ids, payloads } = await notified(() => startRuns(db.pool, inputs, { priority: 3 }));
      expect(ids).toHaveLength(50);
      expect(new Set(ids).size).toBe(50);
      for (const id of ids) expect(id).toMatch(ULID);
      const rows = await db.pool.query('select run_id, input, status, priority, admitted from runledger.runs where run_id = any($1)', [ids]);
      const byId = new Map(rows.rows.map((r) => [r.run_id, r]));
      ids.forEach((id, n) => expect(byId.get(id)).toMatchObject({ input: { n }, status: 'PENDING', priority: 3, admitted: true }));
      expect(await events(ids[7]!)).toEqual([{ kind: 'created', detail: { workflow: WORKFLOW, version: '1', queue: 'default' } }]);
      expect(payloads).toEqual(['default']);
    });
  });

  it('is idempotent per input: a known key or run id gives the existing run, also twice in one call', async ({ db }) => {
    const { getRun, countRuns, startRun } = runHelpers(db, { workflow: WORKFLOW });
    const existing = await startRun({ idempotency_key: 'order-1' });
    const before = await countRuns();
    const ids = await startRuns(db.pool, [{ a: 1 }, { a: 2 }, { a: 3 }, { a: 4 }], {
      idempotency_keys: ['order-1', null, 'order-2', 'order-2'],
      run_ids: [null, 'start-runs-fixed-a', null, null],
    });
    expect(ids[0]).toBe(existing);
    expect(ids[1]).toBe('start-runs-fixed-a');
    expect(ids[2]).toBe(ids[3]); // the same key twice: one run
    expect(await countRuns()).toBe(before + 2);
    expect((await getRun(ids[2]!))?.input).toEqual({ a: 3 });
    // Again: nothing new, the same ids.
    expect(
      await startRuns(db.pool, [{ a: 1 }, { a: 2 }, { a: 3 }, { a: 4 }], {
        idempotency_keys: ['order-1', null, 'order-2', 'order-2'],
        run_ids: [null, 'start-runs-fixed-a', null, null],
      }),
    ).toEqual(ids);
    expect(await countRuns()).toBe(before + 2);
  });

  it('without run_ids or keys makes every id itself: ULIDs in input order, each run with its input and concurrency key', async ({ db }) => {
    const inputs = Array.from({ length: 40 }, (_, n) => ({ n }));
    const concurrencyKeys = inputs.map((_, n) => (n % 3 === 0 ? null : `k${n}`));
    const ids = await startRuns(db.pool, inputs, { concurrency_keys: concurrencyKeys, concurrency_key: 'shared' });
    expect(ids).toHaveLength(40);
    for (const id of ids) expect(id).toMatch(ULID);
    expect([...ids].sort()).toEqual(ids); // they sort in input order
    const rows = await db.pool.query(
      `select r.run_id, r.input, r.concurrency_key, r.idempotency_key,
              (select count(*)::int from runledger.events e where e.run_id = r.run_id and e.kind = 'created') as created
         from runledger.runs r where r.run_id = any($1)`,
      [ids],
    );
    const byId = new Map(rows.rows.map((r) => [r.run_id, r]));
    ids.forEach((id, n) =>
      expect(byId.get(id)).toEqual({
        run_id: id,
        input: { n },
        concurrency_key: concurrencyKeys[n] ?? 'shared',
        idempotency_key: null,
        created: 1,
      }),
    );
    // A second call makes other ids (nothing taken from the first), also in the same millisecond.
    const again = await startRuns(db.pool, inputs.slice(0, 5));
    expect(again.filter((id) => ids.includes(id))).toEqual([]);
  });

  it('a run id of another workflow is RL005, and nothing of the call is stored', async ({ db }) => {
    const { countRuns, startRun } = runHelpers(db, { workflow: WORKFLOW });
    await registerWorkflow(db.pool, 'start-runs-other');
    await startRun({ run_id: 'start-runs-belongs-to-other' }, {}, db.pool, 'start-runs-other');
    const before = await countRuns();
    expect(await sqlState(inSavepoint(db.pool, () => startRuns(db.pool, [{}, {}], { run_ids: [null, 'start-runs-belongs-to-other'] })))).toBe(
      'RL005',
    );
    expect(await countRuns()).toBe(before);
  });

  it.for([
    ['inputs that are not an array', { n: 1 }, {}, 'RL003'],
    ['run_id (start_run’s option)', [{}], { run_id: 'x' }, 'RL003'],
    ['idempotency_key (start_run’s option)', [{}], { idempotency_key: 'x' }, 'RL003'],
    ['idempotency_keys of the wrong length', [{}, {}], { idempotency_keys: ['a'] }, 'RL003'],
    ['run_ids that are not an array', [{}], { run_ids: 'a' }, 'RL003'],
    ['an invalid queue name', [{}], { queue: 'bad queue!' }, 'RL003'],
    ['an invalid run id', [{}], { run_ids: ['has space'] }, 'RL003'],
    ['a run id over 200 characters', [{}, {}], { run_ids: [null, 'r'.repeat(201)] }, 'RL003'],
    ['a deadline that is neither interval nor timestamp', [{}], { deadline: 'soonish' }, 'RL003'],
  ])('refuses %s and stores nothing', async ([, inputs, options, code], { db }) => {
    const { countRuns } = runHelpers(db, { workflow: WORKFLOW });
    const before = await countRuns();
    expect(await sqlState(inSavepoint(db.pool, () => startRuns(db.pool, inputs, options as Record<string, unknown>)))).toBe(code);
    expect(await countRuns()).toBe(before);
  });

  it('refuses an unknown workflow (RL006) and an input over the size limit (RL004, naming its index)', async ({ db }) => {
    const { countRuns } = runHelpers(db, { workflow: WORKFLOW });
    const before = await countRuns();
    expect(await sqlState(inSavepoint(db.pool, () => startRuns(db.pool, [{}], {}, 'no-such-workflow')))).toBe('RL006');
    const big = 'x'.repeat(2_000);
    await db.pool.query('set local runledger.max_payload_bytes = 1000');
    const error = await inSavepoint(db.pool, () =>
      db.pool.query(`select runledger.start_runs($1, $2::jsonb)`, [WORKFLOW, JSON.stringify([{}, { big }])]),
    ).catch((e: unknown) => e);
    await db.pool.query('reset runledger.max_payload_bytes');
    expect(error).toMatchObject({ code: 'RL004', message: expect.stringContaining('input 1 is') });
    expect(await countRuns()).toBe(before);
    expect(await startRuns(db.pool, [])).toEqual([]);
  });

  it('in a queue with limits the runs wait for admission, which admits up to the concurrency', async ({ db }) => {
    await db.pool.query(`select runledger.set_queue('start-runs-limited', '{"concurrency": 3}')`);
    const ids = await startRuns(
      db.pool,
      Array.from({ length: 10 }, (_, n) => ({ n })),
      { queue: 'start-runs-limited' },
    );
    const admitted = await db.pool.query('select count(*)::int as n from runledger.runs where run_id = any($1) and admitted', [ids]);
    expect(admitted.rows[0].n).toBe(3);
  });
});
