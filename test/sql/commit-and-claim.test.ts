/**
 * runledger._commit_and_claim, the worker's group commit with a claim riding on it:
 * the items' answers, then the claim's rows in _claim_batch's own columns.
 *
 * Each test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts), on workflows and queues named after the file: a test's
 * queue holds its own runs only.
 */
import { describe, expect } from 'vitest';
import { txTest } from '../helpers/test-tx.js';
import { runHelpers, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { claimBatch, claimHelpers } from '../helpers/claim.js';
import { stepItem } from '../helpers/commit.js';

const WORKFLOW = 'commit-and-claim';
/** The second workflow of the queue with limits, which the committing worker does not serve. */
const OTHER = 'commit-and-claim-v';

const it = txTest.extend<{ db: TxDb }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
});

const COLUMNS =
  'item, code, message, run_status, run_id, workflow_name, workflow_version, input, fencing_token, recovery_attempts, max_steps, ' +
  'budget, budget_spent, budget_limits, budget_used, cancel_requested, checkpoints, progress, next_due_in_ms, traceparent, execution_traceparent, lineage_id';

const completion = (runId: string, token: number) => ({
  op: 'complete',
  ...stepItem(runId, token, 0, 'only', { step_output: 7 }),
  output: { done: runId },
  policy_version: 'p1',
});

describe('runledger._commit_and_claim', () => {
  it('answers each item, then returns the claimed runs in _claim_batch columns and the next-due row', async ({ db }) => {
    const { startRun, getRun, events } = runHelpers(db, { workflow: WORKFLOW });
    const { claimOne } = claimHelpers(db);
    const done = await startRun();
    const token = Number((await claimOne(done)).fencing_token);
    const next = await startRun({}, { n: 2 });

    const { rows } = await db.pool.query(
      `select ${COLUMNS} from runledger._commit_and_claim($1::jsonb, 'wk-flat', array['default'], array[$2], 5, 30000)`,
      [JSON.stringify([completion(done, token)]), `${WORKFLOW}@1`],
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
      workflow_name: WORKFLOW,
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

  it('keeps the items when the claim fails, and reports the claim failure in code and message', async ({ db }) => {
    const { startRun, getRun } = runHelpers(db, { workflow: WORKFLOW });
    const { claimOne } = claimHelpers(db);
    const done = await startRun();
    const token = Number((await claimOne(done)).fencing_token);
    const { rows } = await db.pool.query(
      `select ${COLUMNS} from runledger._commit_and_claim($1::jsonb, 'wk-flat', array['default'], array[$2], 0, 30000)`,
      [JSON.stringify([completion(done, token)]), `${WORKFLOW}@1`],
    );
    expect(rows).toHaveLength(2);
    expect(rows[0]).toMatchObject({ item: 0, code: null, run_status: 'SUCCEEDED' });
    // A limit of 0 is refused by _claim_batch (RL003): only the claim is undone.
    expect(rows[1]).toMatchObject({ item: null, code: 'RL003', run_id: null });
    expect(rows[1].message).toMatch(/limit must be >= 1/);
    expect((await getRun(done))?.status).toBe('SUCCEEDED');
  });

  describe('in a queue with limits', () => {
    /** Runs of queue q, the first `concurrency` claimed by 'wk-held'; returns the ids in start order and the held tokens. */
    async function limitedQueue(db: TxDb, q: string, concurrency: number, runs: number, workflowOf = (_i: number) => WORKFLOW) {
      const { startRun } = runHelpers(db);
      await db.pool.query(`select runledger.set_queue($1, jsonb_build_object('concurrency', $2::int))`, [q, concurrency]);
      const ids: string[] = [];
      for (let i = 0; i < runs; i++) ids.push(await startRun({ queue: q }, { i }, db.pool, workflowOf(i)));
      const held = await claimBatch(db.pool, 'wk-held', [q], [`${WORKFLOW}@1`, `${OTHER}@1`], concurrency);
      // Which runs a claim takes is its choice; the order of its rows is that of its UPDATE's
      // scan (under a bitmap scan the heap's, which inside one transaction need not be run_id
      // order): the held runs are put in start order here.
      const claimed = held.filter((r) => r.run_id).sort((a, b) => ids.indexOf(a.run_id!) - ids.indexOf(b.run_id!));
      expect(claimed.map((r) => r.run_id)).toEqual(ids.slice(0, concurrency));
      return { ids, held: claimed };
    }
    const runRows = async (db: TxDb, ids: string[]) =>
      (
        await db.pool.query(
          `select run_id, status::text, admitted, (extract(epoch from admitted_at) * 1000000)::bigint::text as admitted_us, lease_owner
             from runledger.runs where run_id = any($1)`,
          [ids],
        )
      ).rows.sort((a, b) => ids.indexOf(a.run_id) - ids.indexOf(b.run_id));
    /** Row versions of runs written on this connection: its transaction's, and earlier ones' not yet reported to the statistics. Compare two readings. */
    const runsUpdated = async (db: TxDb): Promise<number> =>
      (await db.pool.query(`select pg_stat_get_xact_tuples_updated('runledger.runs'::regclass)::int as n`)).rows[0].n;

    it('claims the runs its commit admits straight from PENDING, one update each, and admits the rest in the round order', async ({ db }) => {
      const queue = 'commit-and-claim-limited';
      const { ids, held } = await limitedQueue(db, queue, 4, 8);
      const before = await runsUpdated(db);
      const { rows } = await db.pool.query(
        `select ${COLUMNS} from runledger._commit_and_claim($1::jsonb, 'wk-flat', array[$2], array[$3], 2, 30000)`,
        [JSON.stringify(held.slice(0, 3).map((r) => completion(r.run_id!, Number(r.fencing_token)))), queue, `${WORKFLOW}@1`],
      );
      // Three completions, two claims, one admission: each a row version of runs. (Admitting
      // the three runs and then claiming two of them wrote eight.)
      const updated = (await runsUpdated(db)) - before;
      expect(rows.filter((r) => r.item !== null).map((r) => [r.code, r.run_status])).toEqual([
        [null, 'SUCCEEDED'],
        [null, 'SUCCEEDED'],
        [null, 'SUCCEEDED'],
      ]);
      // The two runs the round admitted first (in any row order, see limitedQueue).
      expect(rows.filter((r) => r.item === null && r.run_id).map((r) => r.run_id).sort()).toEqual(ids.slice(4, 6).sort());
      expect(updated).toBe(6);
      const after = await runRows(db, ids.slice(3));
      expect(after.map((r) => [r.status, r.admitted, r.lease_owner])).toEqual([
        ['RUNNING', false, 'wk-held'],
        ['RUNNING', false, 'wk-flat'],
        ['RUNNING', false, 'wk-flat'],
        ['PENDING', true, null],
        ['PENDING', false, null],
      ]);
      // Each run of the round has the admitted_at the round gave it, in its order, claimed or not.
      // (In microseconds: a round's runs are one microsecond apart.)
      const stamps = after.slice(1, 4).map((r) => BigInt(r.admitted_us));
      expect(stamps[1]! - stamps[0]!).toBe(1n);
      expect(stamps[2]! - stamps[1]!).toBe(1n);
      expect(after[4]!.admitted_us).toBeNull();
      // The queue holds its limit: 3 running, 1 admitted for the next claim.
      const next = await claimBatch(db.pool, 'wk-next', [queue], [`${WORKFLOW}@1`], 10);
      expect(next.filter((r) => r.run_id).map((r) => r.run_id)).toEqual([ids[6]]);
    });

    it('admits what the claim does not take: runs of workflows the worker does not serve, and all of them when the claim fails', async ({ db }) => {
      const { startRun } = runHelpers(db, { workflow: WORKFLOW });
      const queue = 'commit-and-claim-other';
      await registerWorkflow(db.pool, OTHER);
      // Runs 4 and 5 are of workflow OTHER, which wk-flat does not serve.
      const { ids, held } = await limitedQueue(db, queue, 2, 7, (i) => (i === 2 || i === 3 ? OTHER : WORKFLOW));
      const served = await db.pool.query(
        `select ${COLUMNS} from runledger._commit_and_claim($1::jsonb, 'wk-flat', array[$2], array[$3], 5, 30000)`,
        [JSON.stringify(held.map((r) => completion(r.run_id!, Number(r.fencing_token)))), queue, `${WORKFLOW}@1`],
      );
      // The round chose runs 2 and 3 (workflow OTHER): admitted, not claimed.
      expect(served.rows.filter((r) => r.item === null && r.run_id)).toEqual([]);
      expect((await runRows(db, ids.slice(2, 4))).map((r) => [r.status, r.admitted, r.admitted_us !== null])).toEqual([
        ['PENDING', true, true],
        ['PENDING', true, true],
      ]);
      // A claim that fails (limit 0 is refused) undoes only itself: the round's runs are admitted.
      const v = await claimBatch(db.pool, 'wk-v', [queue], [`${OTHER}@1`], 2);
      const failed = await db.pool.query(
        `select ${COLUMNS} from runledger._commit_and_claim($1::jsonb, 'wk-flat', array[$2], array[$3], 0, 30000)`,
        [JSON.stringify(v.filter((r) => r.run_id).map((r) => completion(r.run_id!, Number(r.fencing_token)))), queue, `${WORKFLOW}@1`],
      );
      expect(failed.rows.at(-1)).toMatchObject({ item: null, code: 'RL003' });
      expect((await runRows(db, ids.slice(4, 7))).map((r) => [r.status, r.admitted, r.admitted_us !== null])).toEqual([
        ['PENDING', true, true],
        ['PENDING', true, true],
        ['PENDING', false, false],
      ]);
      // The deferral ended with the statement: a start in the same session admits as before.
      const later = await startRun({ queue }, { i: 7 });
      expect((await runRows(db, [later]))[0]).toMatchObject({ status: 'PENDING', admitted: false });
    });
  });
});
