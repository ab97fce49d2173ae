/**
 * runledger._commit_batch, the group commit: items committed one by one or together on
 * the fast path (_commit_fast), each item's failure confined to that item.
 */
import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { useTestEngine } from '../helpers/test-engine.js';
import { runHelpers, registerWorkflowW } from '../helpers/runs.js';
import { claimBatch, claimHelpers } from '../helpers/claim.js';
import { checkpointHelpers } from '../helpers/checkpoint.js';
import { commitHelpers, stepItem } from '../helpers/commit.js';
import { sqlState } from '../helpers/sql-errors.js';
import { waitFor } from '../helpers/database.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun, getRun, steps, events } = runHelpers(db);
const { claimOne, reclaimedRun } = claimHelpers(db);
const { checkpoint } = checkpointHelpers(db);
const { commitBatch, commitBatchCounting, stepRows, snapshot } = commitHelpers(db);

describe('runledger._commit_batch input', () => {
  it('raises RL003 for items that are not a JSON array, and writes nothing', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    const item = { op: 'checkpoint', run_id: runId, token, seq: 0, name: 's0', kind: 'step', status: 'SUCCEEDED', attempts: 1, started_ms_ago: 0, charge: 0 };
    for (const items of [item, 'text', null]) {
      const state = await sqlState(db.pool.query('select * from runledger._commit_batch($1::jsonb)', [items === null ? null : JSON.stringify(items)]));
      expect(state, JSON.stringify(items)).toBe('RL003');
    }
    expect(await steps(runId)).toEqual([]);
  });
});

describe('runledger._commit_batch', () => {
  it('writes the common items together (_commit_fast) with the results one-by-one writes give, and the rest one by one', async () => {
    // X: a plain checkpoint. Y: a completion with its last step. Z: the same, at a seq
    // that a durable retry left WAITING (counted once). W: a stale token (the careful path).
    const x = await startRun();
    const tx = (await claimOne(x)).fencing_token;
    const y = await startRun();
    const ty = (await claimOne(y)).fencing_token;
    await checkpoint(y, ty, 0, 'y0');
    const z = await startRun();
    const tz = (await claimOne(z)).fencing_token;
    await db.pool.query(`select runledger._retry_wait($1, $2, 0, 'z0', 'step', 1, 1)`, [z, tz]);
    await db.pool.query(`update runledger.runs set status = 'RUNNING', wait_kind = null, wait_key = null, wake_at = null,
                                lease_owner = 'wk-1', lease_expires_at = runledger.now() + interval '1 minute' where run_id = $1`, [z]);
    expect((await stepRows(z)).map((row) => row.status)).toEqual(['WAITING']);
    const w = await reclaimedRun();
    // P waits for its child C; C completes in the batch and wakes P.
    const p = await startRun();
    const tp = (await claimOne(p)).fencing_token;
    const c = (await db.pool.query(`select runledger._start_child($1, $2, 0, 'child', 'w', '{}'::jsonb, '{}'::jsonb) as id`, [p, tp])).rows[0].id;
    await db.pool.query(`select * from runledger._wait($1, $2, 1, 'wait-child', 'child', jsonb_build_object('child_run_id', $3::text))`, [p, tp, c]);
    expect((await getRun(p))?.status).toBe('WAITING');
    const tc = (await claimOne(c)).fencing_token;

    const { rows, calls } = await commitBatchCounting([
      { op: 'checkpoint', ...stepItem(x, tx, 0, 'x0', { output: { x: 1 } }) },
      { op: 'complete', ...stepItem(y, ty, 1, 'y1', { step_output: 'last' }), output: { done: 'Y' }, policy_version: 'p/1' },
      { op: 'complete', ...stepItem(z, tz, 0, 'z0', { step_output: 'after retry', attempts: 2 }), output: null, policy_version: 'p/1' },
      { op: 'complete', ...stepItem(w.runId, w.stale, 1, 'w1'), output: 1, policy_version: 'p/1' },
      { op: 'complete', ...stepItem(c, tc, 0, 'c0', { step_output: 7 }), output: { child: true }, policy_version: 'p/1' },
    ], ['_commit_fast', '_checkpoint_row', '_complete_with_checkpoint']);
    expect(rows.map((row) => [row.item, row.code, row.run_status])).toEqual([
      [0, null, 'RUNNING'], [1, null, 'SUCCEEDED'], [2, null, 'SUCCEEDED'], [3, 'RL001', null], [4, null, 'SUCCEEDED'],
    ]);
    // One fast call wrote X, Y, Z and C: none of them went through the one-by-one functions.
    // (W did, and failed its fence there: a call that raises is not counted.)
    expect(calls).toEqual({
      _commit_fast: 1, _checkpoint_row: 0, _complete_with_checkpoint: 0,
    });

    expect(await stepRows(x)).toEqual([
      { seq: 0, name: 'x0', kind: 'step', status: 'SUCCEEDED', output: { x: 1 }, error: null, attempts: 1, fencing_token: tx, output_hash: null },
    ]);
    expect((await getRun(x))?.status).toBe('RUNNING');
    expect(await getRun(y)).toMatchObject({
      status: 'SUCCEEDED', output: { done: 'Y' }, termination_reason: 'COMPLETED', policy_version: expect.any(String),
      termination_evidence: { steps: 2, budget_spent: 0 }, lease_owner: null, lease_expires_at: null,
    });
    expect((await events(y)).filter((e) => e.kind === 'completed')).toEqual([
      { kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence: { steps: 2, budget_spent: 0 } } },
    ]);
    expect((await stepRows(z)).map((row) => [row.seq, row.status, row.output, row.attempts])).toEqual([[0, 'SUCCEEDED', 'after retry', 2]]);
    expect(await getRun(z)).toMatchObject({ status: 'SUCCEEDED', output: null, termination_evidence: { steps: 1, budget_spent: 0 } });
    expect((await getRun(w.runId))?.status).toBe('RUNNING');
    expect(await getRun(c)).toMatchObject({ status: 'SUCCEEDED', output: { child: true } });
    // The parent was woken by its child's completion, as _finished does.
    expect((await getRun(p))?.status).toBe('PENDING');
    expect((await events(p)).map((e) => e.kind)).toContain('woken');
  });

  it('sends a run named by two items of a batch one item at a time, in order, and the other runs together', async () => {
    const x = await startRun();
    const tx = (await claimOne(x)).fencing_token;
    const y = await startRun();
    const ty = (await claimOne(y)).fencing_token;
    const { rows, calls } = await commitBatchCounting([
      { op: 'checkpoint', ...stepItem(x, tx, 0, 'x0', { output: 'first' }) },
      { op: 'checkpoint', ...stepItem(y, ty, 0, 'y0', { output: 'alone' }) },
      { op: 'checkpoint', ...stepItem(x, tx, 1, 'x1', { output: 'second' }) },
    ], ['_commit_fast', '_checkpoint_row']);
    expect(rows.map((row) => [row.item, row.code, row.run_status])).toEqual([
      [0, null, 'RUNNING'], [1, null, 'RUNNING'], [2, null, 'RUNNING'],
    ]);
    // Y alone went the fast way; X's two items each went through _checkpoint_row.
    expect(calls).toEqual({ _commit_fast: 1, _checkpoint_row: 2 });
    expect((await stepRows(x)).map((row) => [row.seq, row.output])).toEqual([[0, 'first'], [1, 'second']]);
    expect((await stepRows(y)).map((row) => [row.seq, row.output])).toEqual([[0, 'alone']]);
  });

  it('refills the slots its completions free with one admission round per queue, at the end of the batch', async () => {
    await db.pool.query(`select runledger.set_queue('batch-limited', '{"concurrency": 2}')`);
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(await startRun({ queue: 'batch-limited' }, { i }));
    const claimed = await claimBatch(db.pool, 'wk-limited', ['batch-limited'], ['w@1'], 10);
    const running = claimed.filter((row) => row.run_id !== null);
    expect(running.map((row) => row.run_id)).toEqual(ids.slice(0, 2));
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await client.query(`set track_functions = 'pl'`);
      await client.query('begin');
      // One completion alone (the one-by-one path) and one with its last step: both free a slot.
      const rows = await commitBatch(
        [
          { op: 'complete', run_id: running[0]!.run_id, token: running[0]!.fencing_token, output: 1, policy_version: 'p/1', charge: 0 },
          { op: 'complete', ...stepItem(running[1]!.run_id!, running[1]!.fencing_token!, 0, 's0'), output: 2, policy_version: 'p/1' },
        ],
        client,
      );
      const admits = await client.query(
        `select coalesce(pg_stat_get_xact_function_calls('runledger._admit(text,int)'::regprocedure), 0)::int as n`,
      );
      await client.query('commit');
      expect(rows.map((row) => row.code)).toEqual([null, null]);
      expect(admits.rows[0].n).toBe(1);
    } finally {
      await client.end();
    }
    const admitted = await db.pool.query<{ run_id: string }>(
      `select run_id from runledger.runs where queue_name = 'batch-limited' and status = 'PENDING' and admitted order by admitted_at`,
    );
    // Both freed slots were refilled, oldest first; the fifth run still waits for one.
    expect(admitted.rows.map((row) => row.run_id)).toEqual(ids.slice(2, 4));
  });

  it('locks the queues of its completions in name order before it writes any alone (two batches cannot deadlock)', async () => {
    for (const queue of ['lock-a', 'lock-b']) await db.pool.query(`select runledger.set_queue($1, '{"concurrency": 5}')`, [queue]);
    // A no-progress limit keeps a completion off the fast path: each is written alone and
    // runs its own queue's admission round.
    const inB = await startRun({ queue: 'lock-b', no_progress: 3 }, { q: 'b' });
    const inA = await startRun({ queue: 'lock-a', no_progress: 3 }, { q: 'a' });
    const claimed = (await claimBatch(db.pool, 'wk-lock', ['lock-a', 'lock-b'], ['w@1'], 10)).filter((row) => row.run_id !== null);
    const token = (runId: string) => claimed.find((row) => row.run_id === runId)!.fencing_token;
    expect(claimed).toHaveLength(2);
    const other = new pg.Client({ connectionString: db.url });
    await other.connect();
    try {
      // Another transaction holds lock-a's row, as a concurrent batch of the other worker would.
      await other.query('begin');
      await other.query(`select 1 from runledger.queues where name = 'lock-a' for update`);
      // The batch completes lock-b's run first, then lock-a's.
      const batch = commitBatch([
        { op: 'complete', run_id: inB, token: token(inB), output: 1, policy_version: 'p/1', charge: 0 },
        { op: 'complete', run_id: inA, token: token(inA), output: 2, policy_version: 'p/1', charge: 0 },
      ]);
      await waitFor('the batch to wait for the row of lock-a', async () => {
        const waiting = await db.pool.query(
          `select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and query like '%_commit_batch%' and pid <> pg_backend_pid()`,
        );
        return waiting.rows[0].n === 1;
      });
      // It took lock-a first, in name order, and so holds nothing the other transaction needs:
      // lock-b's row is free (an item-order lock would hold it, and the two would deadlock).
      await expect(other.query(`select 1 from runledger.queues where name = 'lock-b' for update nowait`)).resolves.toBeDefined();
      await other.query('commit');
      expect((await batch).map((row) => row.code)).toEqual([null, null]);
    } finally {
      await other.end();
    }
    expect([(await getRun(inA))?.status, (await getRun(inB))?.status]).toEqual(['SUCCEEDED', 'SUCCEEDED']);
  });

  it('commits each item on its own: rows in order with their codes; the failed items change nothing, the others commit', async () => {
    // A: a plain checkpoint.
    const a = await startRun();
    const ta = (await claimOne(a)).fencing_token;
    // B: its last step and its completion together.
    const b = await startRun();
    const tb = (await claimOne(b)).fencing_token;
    await checkpoint(b, tb, 0, 'b0', { output: 'first' });
    // C: a completion under a token that is no longer the run's.
    const c = await reclaimedRun();
    await checkpoint(c.runId, c.token, 0, 'c0');
    // D: a checkpoint at a position that already has one.
    const d = await startRun();
    const td = (await claimOne(d)).fencing_token;
    await checkpoint(d, td, 0, 'd0', { output: 'original' });

    const beforeC = await snapshot(c.runId);
    const beforeD = await snapshot(d);

    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(a, ta, 0, 'a0', { output: { a: 1 } }) },
      { op: 'complete', ...stepItem(b, tb, 1, 'b1', { step_output: { last: true } }), output: { done: 'B' }, policy_version: 'p/1' },
      { op: 'complete', ...stepItem(c.runId, c.stale, 1, 'c1', { step_output: 'late' }), output: { done: 'C' }, policy_version: 'p/1' },
      { op: 'checkpoint', ...stepItem(d, td, 0, 'd0', { output: 'overwritten?' }) },
    ]);
    expect(rows.map((r) => [r.item, r.code])).toEqual([[0, null], [1, null], [2, 'RL001'], [3, 'RL010']]);
    expect(rows[0]).toEqual({ item: 0, code: null, message: null, run_status: 'RUNNING' });
    expect(rows[1]).toEqual({ item: 1, code: null, message: null, run_status: 'SUCCEEDED' });
    expect(rows[2]!.message).toMatch(/lease lost/);
    expect(rows[2]!.run_status).toBeNull();
    expect(rows[3]!.message).toMatch(/already has a checkpoint/);
    expect(rows[3]!.run_status).toBeNull();

    // A's step committed, under its token; A still runs.
    expect(await stepRows(a)).toEqual([
      { seq: 0, name: 'a0', kind: 'step', status: 'SUCCEEDED', output: { a: 1 }, error: null, attempts: 1, fencing_token: ta, output_hash: null },
    ]);
    expect((await getRun(a))?.status).toBe('RUNNING');

    // B: its last step and its completion committed together.
    expect((await stepRows(b)).map((s) => [s.seq, s.name, s.status, s.output, s.fencing_token])).toEqual([
      [0, 'b0', 'SUCCEEDED', 'first', tb],
      [1, 'b1', 'SUCCEEDED', { last: true }, tb],
    ]);
    expect(await getRun(b)).toMatchObject({
      status: 'SUCCEEDED', output: { done: 'B' }, termination_reason: 'COMPLETED',
      termination_evidence: { steps: 2, budget_spent: 0 }, lease_owner: null,
    });
    expect((await events(b)).filter((e) => e.kind === 'completed')).toEqual([
      { kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence: { steps: 2, budget_spent: 0 } } },
    ]);

    // C and D: nothing changed.
    expect(await snapshot(c.runId)).toEqual(beforeC);
    expect(await snapshot(d)).toEqual(beforeD);
  });

  it('an unknown op gives RL003 for that item only', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(runId, token, 0, 's0') },
      { op: 'frobnicate', ...stepItem(runId, token, 1, 's1') },
      { ...stepItem(runId, token, 1, 's1') }, // no op at all
      { op: 'checkpoint', ...stepItem(runId, token, 1, 's1') },
    ]);
    expect(rows.map((r) => [r.item, r.code, r.run_status])).toEqual([
      [0, null, 'RUNNING'],
      [1, 'RL003', null],
      [2, 'RL003', null],
      [3, null, 'RUNNING'],
    ]);
    expect(rows[1]!.message).toMatch(/unknown op/);
    expect((await steps(runId)).map((s) => [s.seq, s.name])).toEqual([[0, 's0'], [1, 's1']]);
    expect(await commitBatch([])).toEqual([]);
  });

  it('undoes all the writes of an item that fails half-way (fast-path completion at a taken seq) and keeps the rest of the batch', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    await checkpoint(runId, token, 0, 'x', { output: 'kept' });
    const other = await startRun();
    const otherToken = (await claimOne(other)).fencing_token;
    const before = await snapshot(runId);

    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(other, otherToken, 0, 'o0') },
      // Charge 0 and RUNNING: the fast path updates the run to SUCCEEDED, then finds seq 0 taken.
      { op: 'complete', ...stepItem(runId, token, 0, 'x', { step_output: 'dup' }), output: 'never', policy_version: 'p/1' },
      { op: 'checkpoint', ...stepItem(other, otherToken, 1, 'o1') },
    ]);
    expect(rows.map((r) => r.code)).toEqual([null, 'RL010', null]);
    expect(await snapshot(runId)).toEqual(before);
    expect((await getRun(runId))?.status).toBe('RUNNING');
    expect((await steps(other)).map((s) => s.name)).toEqual(['o0', 'o1']);

    // Still RUNNING inside the same batch too: a later item of the same run commits.
    const again = await commitBatch([
      { op: 'complete', ...stepItem(runId, token, 0, 'x'), output: 'never', policy_version: 'p/1' },
      { op: 'checkpoint', ...stepItem(runId, token, 1, 'y') },
    ]);
    expect(again.map((r) => [r.code, r.run_status])).toEqual([['RL010', null], [null, 'RUNNING']]);
    expect((await steps(runId)).map((s) => s.name)).toEqual(['x', 'y']);
  });

  it('a complete item without seq completes the run like _complete_run', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    await checkpoint(runId, token, 0, 'a');
    await checkpoint(runId, token, 1, 'b');
    const rows = await commitBatch([{ op: 'complete', run_id: runId, token, output: { total: 2 }, policy_version: 'p/1', charge: 0 }]);
    expect(rows).toEqual([{ item: 0, code: null, message: null, run_status: 'SUCCEEDED' }]);
    expect(await getRun(runId)).toMatchObject({
      status: 'SUCCEEDED', output: { total: 2 }, termination_reason: 'COMPLETED', termination_evidence: { steps: 2, budget_spent: 0 },
    });
    expect((await steps(runId)).length).toBe(2);
    // Finished: the same item again is a lost lease.
    expect((await commitBatch([{ op: 'complete', run_id: runId, token, output: null, policy_version: 'p/1', charge: 0 }]))[0]!.code).toBe('RL001');
  });

  it('reports the run status after a checkpoint: TERMINATED by a charge over budget, CANCELLING after a cancel request', async () => {
    const budgeted = await startRun({ budget: 5 });
    const tb = (await claimOne(budgeted)).fencing_token;
    const cancelled = await startRun();
    const tc = (await claimOne(cancelled)).fencing_token;
    const startedBefore = 60_000; // ms ago: before the cancel request below
    expect((await db.pool.query('select runledger.cancel_run($1) as s', [cancelled])).rows[0].s).toBe('CANCELLING');

    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(budgeted, tb, 0, 'cheap', { charge: 2 }) },
      { op: 'checkpoint', ...stepItem(budgeted, tb, 1, 'dear', { charge: 4 }) },
      { op: 'checkpoint', ...stepItem(cancelled, tc, 0, 'in-flight', { started_ms_ago: startedBefore }) },
    ]);
    expect(rows.map((r) => [r.code, r.run_status])).toEqual([[null, 'RUNNING'], [null, 'TERMINATED'], [null, 'CANCELLING']]);
    expect(await getRun(budgeted)).toMatchObject({ status: 'TERMINATED', termination_reason: 'BUDGET', budget_spent: '6' });
    expect((await steps(budgeted)).map((s) => s.name)).toEqual(['cheap', 'dear']);
    expect((await steps(cancelled)).map((s) => s.name)).toEqual(['in-flight']);
  });

  it('writes charges within every limit on the fast path, with the same budgets one-by-one writes give; one past a limit stops its run', async () => {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      const a = await startRun({ budget: { units: 10, tokens: 100, tool_calls: 2 } });
      const ta = (await claimOne(a)).fencing_token;
      const b = await startRun({ budget: { tokens: 100 } });
      const tb = (await claimOne(b)).fencing_token;
      const over = await startRun({ budget: { tool_calls: 1 } });
      const to = (await claimOne(over)).fencing_token;
      await client.query(`set track_functions = 'pl'`);
      await client.query('begin');
      const rows = await commitBatch(
        [
          { op: 'checkpoint', ...stepItem(a, ta, 0, 'a0', { charge: { units: 3, tokens: 40, tool_calls: 1 } }) },
          { op: 'complete', ...stepItem(b, tb, 0, 'b0', { charge: { tokens: 100 } }), output: 'b', policy_version: 'p/1' },
          { op: 'checkpoint', ...stepItem(over, to, 0, 'o0', { charge: { tool_calls: 2 } }) },
        ],
        client,
      );
      const calls = await client.query(
        `select p.proname, coalesce(pg_stat_get_xact_function_calls(p.oid), 0)::int as n
           from pg_proc p where p.pronamespace = 'runledger'::regnamespace
            and p.proname in ('_commit_fast', '_checkpoint_row') order by 1`,
      );
      await client.query('commit');
      expect(rows.map((r) => [r.code, r.run_status])).toEqual([[null, 'RUNNING'], [null, 'SUCCEEDED'], [null, 'TERMINATED']]);
      // A and B on the fast path; only the charge past its limit went one by one.
      expect(Object.fromEntries(calls.rows.map((row) => [row.proname, row.n]))).toEqual({ _commit_fast: 1, _checkpoint_row: 1 });
      expect(await getRun(a)).toMatchObject({ status: 'RUNNING', budget_spent: '3', budget_used: { tokens: 40, tool_calls: 1 } });
      // Exactly at the limit is within it; the evidence counts the charge.
      expect(await getRun(b)).toMatchObject({
        status: 'SUCCEEDED',
        budget_used: { tokens: 100 },
        termination_evidence: { steps: 1, budget_spent: 0, budget_used: { tokens: 100 } },
      });
      expect(await getRun(over)).toMatchObject({
        status: 'TERMINATED',
        termination_reason: 'BUDGET',
        termination_evidence: { dimension: 'tool_calls', limit: 1, spent: 2 },
      });
    } finally {
      await client.end();
    }
  });

  it('reports the run status after a completion: SUCCEEDED, or TERMINATED when its charge passes the budget', async () => {
    const plain = await startRun();
    const tp = (await claimOne(plain)).fencing_token;
    const budgeted = await startRun({ budget: 5 });
    const tb = (await claimOne(budgeted)).fencing_token;
    const rows = await commitBatch([
      { op: 'complete', ...stepItem(plain, tp, 0, 'only'), output: { ok: true }, policy_version: 'p/1' },
      { op: 'complete', ...stepItem(budgeted, tb, 0, 'dear', { charge: 9 }), output: { ok: false }, policy_version: 'p/1' },
    ]);
    expect(rows.map((r) => [r.code, r.run_status])).toEqual([[null, 'SUCCEEDED'], [null, 'TERMINATED']]);
    expect(await getRun(plain)).toMatchObject({ status: 'SUCCEEDED', output: { ok: true } });
    expect(await getRun(budgeted)).toMatchObject({ status: 'TERMINATED', termination_reason: 'BUDGET', output: null });
  });
});
