/**
 * runledger._commit_and_claim_flat, the worker's group commit with a claim riding on it:
 * the items' answers, then the claim's rows in _claim_batch's own columns (and
 * _commit_and_claim, which earlier builds' workers still call, with the same claim as JSON).
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { runHelpers, registerWorkflowW } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';
import { stepItem } from '../helpers/commit.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun, getRun, events } = runHelpers(db);
const { claimOne } = claimHelpers(db);

const COLUMNS =
  'item, code, message, run_status, run_id, workflow_name, workflow_version, input, fencing_token, recovery_attempts, max_steps, ' +
  'budget, budget_spent, budget_limits, budget_used, cancel_requested, checkpoints, progress, next_due_in_ms, traceparent, execution_traceparent';

const completion = (runId: string, token: number) => ({
  op: 'complete',
  ...stepItem(runId, token, 0, 'only', { step_output: 7 }),
  output: { done: runId },
  policy_version: 'p1',
});

/** Every run of queue 'default' that nobody holds is claimed by earlier tests' leftovers otherwise: each test drains it first. */
async function drainQueue(): Promise<void> {
  await db.pool.query(`select * from runledger._claim_batch('drainer', array['default'], array['w@1'], 100000, 60000)`);
}

describe('runledger._commit_and_claim_flat', () => {
  it('answers each item, then returns the claimed runs in _claim_batch columns and the next-due row', async () => {
    await drainQueue();
    const done = await startRun();
    const token = Number((await claimOne(done)).fencing_token);
    const next = await startRun({}, { n: 2 });

    const { rows } = await db.pool.query(
      `select ${COLUMNS} from runledger._commit_and_claim_flat($1::jsonb, 'wk-flat', array['default'], array['w@1'], 5, 30000)`,
      [JSON.stringify([completion(done, token)])],
    );
    // The item: committed, the run succeeded with its output.
    expect(rows[0]).toMatchObject({ item: 0, code: null, run_status: 'SUCCEEDED', run_id: null });
    expect((await getRun(done))?.status).toBe('SUCCEEDED');
    expect((await events(done)).map((e) => e.kind)).toEqual(['created', 'claimed', 'completed']);
    // The claim: the waiting run, RUNNING under a new token for this worker, as _claim_batch gives it.
    const claimed = rows.filter((row) => row.item === null && row.run_id !== null);
    expect(claimed).toHaveLength(1);
    expect(claimed[0]).toMatchObject({
      code: null,
      run_id: next,
      workflow_name: 'w',
      workflow_version: '1',
      input: { n: 2 },
      fencing_token: '1',
      recovery_attempts: 0,
      cancel_requested: false,
      checkpoints: [],
    });
    const row = await getRun(next);
    expect([row?.status, row?.lease_owner, String(row?.fencing_token)]).toEqual(['RUNNING', 'wk-flat', '1']);
    // Fewer than the limit were claimed: the last row says when the next is due (none: null).
    const last = rows[rows.length - 1];
    expect(last).toMatchObject({ item: null, code: null, run_id: null, next_due_in_ms: null });
  });

  it('keeps the items when the claim fails, and reports the claim failure in code and message', async () => {
    await drainQueue();
    const done = await startRun();
    const token = Number((await claimOne(done)).fencing_token);
    const { rows } = await db.pool.query(
      `select ${COLUMNS} from runledger._commit_and_claim_flat($1::jsonb, 'wk-flat', array['default'], array['w@1'], 0, 30000)`,
      [JSON.stringify([completion(done, token)])],
    );
    expect(rows).toHaveLength(2);
    expect(rows[0]).toMatchObject({ item: 0, code: null, run_status: 'SUCCEEDED' });
    // A limit of 0 is refused by _claim_batch (RL003): only the claim is undone.
    expect(rows[1]).toMatchObject({ item: null, code: 'RL003', run_id: null });
    expect(rows[1].message).toMatch(/limit must be >= 1/);
    expect((await getRun(done))?.status).toBe('SUCCEEDED');
  });

  it('claims what _commit_and_claim claims, which still returns the runs as JSON', async () => {
    await drainQueue();
    const first = await startRun({}, { n: 'a' });
    const second = await startRun({}, { n: 'b' });
    const flat = await db.pool.query(
      `select ${COLUMNS} from runledger._commit_and_claim_flat('[]'::jsonb, 'wk-a', array['default'], array['w@1'], 1, 30000)`,
    );
    const json = await db.pool.query(
      `select item, code, claimed from runledger._commit_and_claim('[]'::jsonb, 'wk-b', array['default'], array['w@1'], 1, 30000)`,
    );
    expect(flat.rows.map((r) => r.run_id)).toEqual([first]);
    expect(json.rows.map((r) => r.claimed?.run_id)).toEqual([second]);
    const { item: _item, code: _code, message: _message, run_status: _status, ...columns } = flat.rows[0];
    expect(Object.keys(json.rows[0].claimed).sort()).toEqual(Object.keys(columns).sort());
  });
});
