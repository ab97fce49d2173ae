/**
 * runledger._start_claimed: engine.start for a run its own process's worker takes, the start
 * and the claim in one transaction; anything it must not claim is left to the queue's workers.
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { runHelpers, newRunId, registerWorkflowW } from '../helpers/runs.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun, getRun, events } = runHelpers(db);
const { notified } = notifyHelpers(db);

interface StartedRow {
  run_id: string;
  claimed: boolean;
  workflow_version: string | null;
  input: unknown;
  fencing_token: string | null;
  recovery_attempts: number | null;
}

async function startClaimed(options: Record<string, unknown> = {}, input: unknown = { n: 1 }, leaseMs: number | null = 30_000) {
  const result = await db.pool.query<StartedRow>(
    `select run_id, claimed, workflow_version, input, fencing_token::text as fencing_token, recovery_attempts
       from runledger._start_claimed('w', $1::jsonb, $2::jsonb, 'wk-local', $3)`,
    [JSON.stringify(input), JSON.stringify({ version: '1', ...options }), leaseMs],
  );
  return result.rows[0]!;
}

describe('runledger._start_claimed', () => {
  it('starts the run RUNNING for the given worker with token 1 and a lease, created and claimed together, without NOTIFY', async () => {
    const { result: row, payloads } = await notified(() => startClaimed({}, { order: 7 }));
    expect(payloads).toEqual([]);
    expect(row).toMatchObject({ claimed: true, workflow_version: '1', input: { order: 7 }, fencing_token: '1', recovery_attempts: 0 });
    const run = await getRun(row.run_id);
    expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-local', fencing_token: 1, admitted: false });
    expect(run?.lease_expires_at).not.toBeNull();
    expect((await events(row.run_id)).map((e) => e.kind)).toEqual(['created', 'claimed']);
  });

  it('claims nothing it must leave to the queue, and announces what is runnable', async () => {
    // A run already claimed once (an idempotent start of a run under way).
    const runId = newRunId('taken');
    expect((await startClaimed({ run_id: runId })).claimed).toBe(true);
    const again = await notified(() => startClaimed({ run_id: runId }));
    expect(again.result).toMatchObject({ run_id: runId, claimed: false, fencing_token: null });
    expect(again.payloads).toEqual([]); // RUNNING: nothing to announce
    expect((await getRun(runId))?.fencing_token).toBe(1);

    // An existing run of another version: left PENDING, announced for a worker of that version.
    await db.pool.query(`select runledger._register_workflow('w', '2', 'default', 3)`);
    const v2 = newRunId('v2');
    await startRun({ run_id: v2, version: '2', notify: false });
    const other = await notified(() => startClaimed({ run_id: v2 }));
    expect(other.result.claimed).toBe(false);
    expect(other.payloads).toEqual(['default']);
    expect((await getRun(v2))?.status).toBe('PENDING');

    // A delayed start, a deadline already past, a queue whose admission holds the run back.
    const delayed = await startClaimed({ run_in_ms: 60_000 });
    expect(delayed.claimed).toBe(false);
    expect((await getRun(delayed.run_id))?.status).toBe('PENDING');
    const late = await startClaimed({ deadline: '0 seconds' });
    expect(late.claimed).toBe(false);
    await db.pool.query(`select runledger.set_queue('claimed-paused', '{"paused": true}')`);
    const held = await startClaimed({ queue: 'claimed-paused' });
    expect(held.claimed).toBe(false);
    expect(await getRun(held.run_id)).toMatchObject({ status: 'PENDING', admitted: false, fencing_token: 0 });
  });

  it('claims an existing never-claimed run under the run id asked for, and not one an idempotency key finds under another id', async () => {
    // Started from SQL without waking anyone, then started again here with the same id: claimed.
    const sameId = newRunId('same-id');
    await startRun({ run_id: sameId, version: '1', notify: false });
    expect(await startClaimed({ run_id: sameId })).toMatchObject({ run_id: sameId, claimed: true, fencing_token: '1' });
    // The same idempotency key under a new id gives the first run, which is announced, not
    // claimed: the worker knows a start in flight by the id it asked for.
    const key = newRunId('key');
    const first = await startRun({ idempotency_key: key, version: '1', notify: false });
    const again = await notified(() => startClaimed({ run_id: newRunId('other-id'), idempotency_key: key }));
    expect(again.result).toMatchObject({ run_id: first, claimed: false });
    expect(again.payloads).toEqual(['default']);
    expect(await getRun(first)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
  });

  it('leaves a fork to the claims, which hand the worker its lineage_id (the run its chain of forks started from)', async () => {
    const queue = newRunId('claimed-forks');
    const source = await startRun({ queue, version: '1', notify: false });
    const fork = (await db.pool.query('select runledger.fork_run($1, 0) as id', [source])).rows[0].id as string;
    const forkOfFork = (await db.pool.query('select runledger.fork_run($1, 0) as id', [fork])).rows[0].id as string;
    // engine.start with the fork's id finds it, never claimed: announced, not claimed here without its lineage.
    const found = await notified(() => startClaimed({ run_id: fork }));
    expect(found.result).toMatchObject({ run_id: fork, claimed: false });
    expect(found.payloads).toEqual([queue]);
    const claimed = await db.pool.query(
      `select run_id, lineage_id from runledger._claim_batch('wk-lineage', array[$1], array['w@1'], 10, 30000) where run_id is not null order by run_id`,
      [queue],
    );
    expect(claimed.rows.sort((a, b) => [source, fork, forkOfFork].indexOf(a.run_id) - [source, fork, forkOfFork].indexOf(b.run_id))).toEqual([
      { run_id: source, lineage_id: null },
      { run_id: fork, lineage_id: source },
      { run_id: forkOfFork, lineage_id: source },
    ]);
  });

  it('in a queue with limits, claims a run admission let in at once, and never one beyond the limit', async () => {
    await db.pool.query(`select runledger.set_queue('claimed-limited', '{"concurrency": 1}')`);
    const first = await startClaimed({ queue: 'claimed-limited' });
    expect(first.claimed).toBe(true);
    const second = await startClaimed({ queue: 'claimed-limited' });
    expect(second.claimed).toBe(false);
    expect(await getRun(second.run_id)).toMatchObject({ status: 'PENDING', admitted: false });
  });

  it('refuses a call without a worker or a lease (RL003) and starts nothing', async () => {
    const before = Number((await db.pool.query('select count(*) from runledger.runs')).rows[0].count);
    expect(await sqlState(startClaimed({}, {}, null))).toBe('RL003');
    expect(await sqlState(startClaimed({}, {}, 0))).toBe('RL003');
    expect(Number((await db.pool.query('select count(*) from runledger.runs')).rows[0].count)).toBe(before);
  });
});

describe('runledger._start_many', () => {
  const many = (items: unknown) =>
    db.pool.query<StartedRow & { item: number }>(
      `select item, run_id, claimed, workflow_version, input, fencing_token::text as fencing_token, recovery_attempts
         from runledger._start_many($1::jsonb) order by item`,
      [JSON.stringify(items)],
    );
  const item = (runId: string, input: unknown, extra: Record<string, unknown> = {}) => ({
    workflow: 'w',
    input,
    options: { version: '1', run_id: runId, ...extra },
    worker_id: 'wk-many',
    lease_ms: 30_000,
  });

  it('starts each item as _start_claimed would, in one transaction, one row per item in order', async () => {
    const ids = [newRunId('many-a'), newRunId('many-b'), newRunId('many-c')];
    const { result, payloads } = await notified(() =>
      many([item(ids[0]!, { n: 0 }), { ...item(ids[1]!, null), input: undefined }, item(ids[2]!, { n: 2 })]),
    );
    expect(payloads).toEqual([]);
    expect(result.rows).toEqual([
      { item: 0, run_id: ids[0], claimed: true, workflow_version: '1', input: { n: 0 }, fencing_token: '1', recovery_attempts: 0 },
      { item: 1, run_id: ids[1], claimed: true, workflow_version: '1', input: null, fencing_token: '1', recovery_attempts: 0 },
      { item: 2, run_id: ids[2], claimed: true, workflow_version: '1', input: { n: 2 }, fencing_token: '1', recovery_attempts: 0 },
    ]);
    for (const id of ids) {
      expect(await getRun(id)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-many', fencing_token: 1 });
      expect((await events(id)).map((e) => e.kind)).toEqual(['created', 'claimed']);
    }
    // One transaction: every row was written by the same one.
    const xids = await db.pool.query(`select count(distinct xmin::text)::int as n from runledger.runs where run_id = any($1)`, [ids]);
    expect(xids.rows[0].n).toBe(1);
  });

  it('an item without a worker is started as start_run starts it: PENDING, announced once for the call', async () => {
    const ids = [newRunId('many-plain'), newRunId('many-plain'), newRunId('many-claimed')];
    const plain = (runId: string) => {
      const { worker_id: _w, lease_ms: _l, ...rest } = item(runId, { n: 1 });
      return rest;
    };
    const { result, payloads } = await notified(() => many([plain(ids[0]!), plain(ids[1]!), item(ids[2]!, { n: 2 })]));
    expect(result.rows.map((r) => [r.item, r.run_id, r.claimed, r.fencing_token])).toEqual([
      [0, ids[0], false, null],
      [1, ids[1], false, null],
      [2, ids[2], true, '1'],
    ]);
    expect(payloads).toEqual(['default']);
    for (const id of ids.slice(0, 2)) {
      expect(await getRun(id)).toMatchObject({ status: 'PENDING', admitted: true, fencing_token: 0, input: { n: 1 } });
      expect((await events(id)).map((e) => e.kind)).toEqual(['created']);
    }
    expect(await getRun(ids[2]!)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-many' });
  });

  it('runs of a queue with limits are admitted once for the call, at its end, within the limit, and not claimed at their start', async () => {
    await db.pool.query(`select runledger.set_queue('many-limited', '{"concurrency": 2}')`);
    const ids = [newRunId('many-lim'), newRunId('many-lim'), newRunId('many-lim')];
    const { result, payloads } = await notified(() => many(ids.map((id) => item(id, { n: 1 }, { queue: 'many-limited' }))));
    expect(result.rows.map((r) => r.claimed)).toEqual([false, false, false]);
    // One admission round for the call: two admitted (the limit), announced once.
    expect(payloads).toEqual(['many-limited']);
    const runs = await db.pool.query(`select run_id, status, admitted from runledger.runs where run_id = any($1) order by run_id`, [ids]);
    expect(runs.rows.map((r) => [r.status, r.admitted])).toEqual([
      ['PENDING', true],
      ['PENDING', true],
      ['PENDING', false],
    ]);
  });

  it('a run id started twice in one call is started once: the second item finds it claimed', async () => {
    const id = newRunId('many-twice');
    const { rows } = await many([item(id, { n: 1 }), item(id, { n: 1 })]);
    expect(rows.map((r) => [r.item, r.run_id, r.claimed])).toEqual([
      [0, id, true],
      [1, id, false],
    ]);
    expect((await events(id)).map((e) => e.kind)).toEqual(['created', 'claimed']);
  });

  it('an error in one item undoes every item of the call', async () => {
    const ids = [newRunId('many-undone'), newRunId('many-undone')];
    // The second names a workflow nobody registered (RL006).
    expect(await sqlState(many([item(ids[0]!, { n: 0 }), { ...item(ids[1]!, { n: 1 }), workflow: 'nobody' }]))).toBe('RL006');
    const left = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1)`, [ids]);
    expect(left.rows[0].n).toBe(0);
    expect(await sqlState(many({ not: 'an array' }))).toBe('RL003');
    // An item that is not an object, or a claim whose lease is not a whole number: RL003, nothing started.
    expect(await sqlState(many([item(ids[0]!, { n: 0 }), 7]))).toBe('RL003');
    expect(await sqlState(many([{ ...item(ids[0]!, { n: 0 }), lease_ms: 'soon' }]))).toBe('RL003');
    const none = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1)`, [ids]);
    expect(none.rows[0].n).toBe(0);
  });
});
