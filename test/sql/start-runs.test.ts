/**
 * runledger.start_runs: many runs of one workflow in one statement, ids in input order,
 * the same checks and idempotency as start_run, and one announcement for the batch.
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { runHelpers, ULID, registerWorkflowW } from '../helpers/runs.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { getRun, events, countRuns, startRun } = runHelpers(db);
const { notified } = notifyHelpers(db);

async function startRuns(inputs: unknown, options: Record<string, unknown> = {}, workflow = 'w'): Promise<string[]> {
  const result = await db.pool.query('select runledger.start_runs($1, $2::jsonb, $3::jsonb) as ids', [
    workflow,
    JSON.stringify(inputs),
    JSON.stringify(options),
  ]);
  return result.rows[0].ids;
}

describe('runledger.start_runs', () => {
  it('starts one PENDING run per input, returns the ids in input order, writes their created events and announces the queue once', async () => {
    const inputs = Array.from({ length: 50 }, (_, n) => ({ n }));
    const { result: ids, payloads } = await notified(() => startRuns(inputs, { priority: 3 }));
    expect(ids).toHaveLength(50);
    expect(new Set(ids).size).toBe(50);
    for (const id of ids) expect(id).toMatch(ULID);
    const rows = await db.pool.query('select run_id, input, status, priority, admitted from runledger.runs where run_id = any($1)', [ids]);
    const byId = new Map(rows.rows.map((r) => [r.run_id, r]));
    ids.forEach((id, n) => expect(byId.get(id)).toMatchObject({ input: { n }, status: 'PENDING', priority: 3, admitted: true }));
    expect(await events(ids[7]!)).toEqual([{ kind: 'created', detail: { workflow: 'w', version: '1', queue: 'default' } }]);
    expect(payloads).toEqual(['default']);
  });

  it('is idempotent per input: a known key or run id gives the existing run, also twice in one call', async () => {
    const existing = await startRun({ idempotency_key: 'order-1' });
    const before = await countRuns();
    const ids = await startRuns([{ a: 1 }, { a: 2 }, { a: 3 }, { a: 4 }], {
      idempotency_keys: ['order-1', null, 'order-2', 'order-2'],
      run_ids: [null, 'fixed-run-a', null, null],
    });
    expect(ids[0]).toBe(existing);
    expect(ids[1]).toBe('fixed-run-a');
    expect(ids[2]).toBe(ids[3]); // the same key twice: one run
    expect(await countRuns()).toBe(before + 2);
    expect((await getRun(ids[2]!))?.input).toEqual({ a: 3 });
    // Again: nothing new, the same ids.
    expect(
      await startRuns([{ a: 1 }, { a: 2 }, { a: 3 }, { a: 4 }], {
        idempotency_keys: ['order-1', null, 'order-2', 'order-2'],
        run_ids: [null, 'fixed-run-a', null, null],
      }),
    ).toEqual(ids);
    expect(await countRuns()).toBe(before + 2);
  });

  it('without run_ids or keys makes every id itself: ULIDs in input order, each run with its input and concurrency key', async () => {
    const inputs = Array.from({ length: 40 }, (_, n) => ({ n }));
    const concurrencyKeys = inputs.map((_, n) => (n % 3 === 0 ? null : `k${n}`));
    const ids = await startRuns(inputs, { concurrency_keys: concurrencyKeys, concurrency_key: 'shared' });
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
    const again = await startRuns(inputs.slice(0, 5));
    expect(again.filter((id) => ids.includes(id))).toEqual([]);
  });

  it('a run id of another workflow is RL005, and nothing of the call is stored', async () => {
    await db.pool.query(`select runledger._register_workflow('other', '1', 'default', 3)`);
    await startRun({ run_id: 'belongs-to-other' }, {}, db.pool, 'other');
    const before = await countRuns();
    expect(await sqlState(startRuns([{}, {}], { run_ids: [null, 'belongs-to-other'] }))).toBe('RL005');
    expect(await countRuns()).toBe(before);
  });

  it.each([
    ['inputs that are not an array', { n: 1 }, {}, 'RL003'],
    ['run_id (start_run’s option)', [{}], { run_id: 'x' }, 'RL003'],
    ['idempotency_key (start_run’s option)', [{}], { idempotency_key: 'x' }, 'RL003'],
    ['idempotency_keys of the wrong length', [{}, {}], { idempotency_keys: ['a'] }, 'RL003'],
    ['run_ids that are not an array', [{}], { run_ids: 'a' }, 'RL003'],
    ['an invalid queue name', [{}], { queue: 'bad queue!' }, 'RL003'],
    ['an invalid run id', [{}], { run_ids: ['has space'] }, 'RL003'],
    ['a run id over 200 characters', [{}, {}], { run_ids: [null, 'r'.repeat(201)] }, 'RL003'],
    ['a deadline that is neither interval nor timestamp', [{}], { deadline: 'soonish' }, 'RL003'],
  ])('refuses %s and stores nothing', async (_what, inputs, options, code) => {
    const before = await countRuns();
    expect(await sqlState(startRuns(inputs, options as Record<string, unknown>))).toBe(code);
    expect(await countRuns()).toBe(before);
  });

  it('refuses an unknown workflow (RL006) and an input over the size limit (RL004, naming its index)', async () => {
    const before = await countRuns();
    expect(await sqlState(startRuns([{}], {}, 'no-such-workflow'))).toBe('RL006');
    const big = 'x'.repeat(2_000);
    const client = await db.pool.connect();
    let error: unknown;
    try {
      await client.query('set runledger.max_payload_bytes = 1000');
      error = await client.query(`select runledger.start_runs('w', $1::jsonb)`, [JSON.stringify([{}, { big }])]).catch((e: unknown) => e);
      await client.query('reset runledger.max_payload_bytes');
    } finally {
      client.release();
    }
    expect(error).toMatchObject({ code: 'RL004', message: expect.stringContaining('input 1 is') });
    expect(await countRuns()).toBe(before);
    expect(await startRuns([])).toEqual([]);
  });

  it('in a queue with limits the runs wait for admission, which admits up to the concurrency', async () => {
    await db.pool.query(`select runledger.set_queue('bulk-limited', '{"concurrency": 3}')`);
    const ids = await startRuns(
      Array.from({ length: 10 }, (_, n) => ({ n })),
      { queue: 'bulk-limited' },
    );
    const admitted = await db.pool.query('select count(*)::int as n from runledger.runs where run_id = any($1) and admitted', [ids]);
    expect(admitted.rows[0].n).toBe(3);
  });
});
