/**
 * A completion with its last step, as a worker sends it (a group commit of one complete
 * item): the fast path (_commit_fast, the set-based part of every group commit) and the
 * general path (runledger._complete_with_checkpoint) give the same rows, and refuse the
 * same things.
 *
 * Each test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts), on a workflow named after the file; its clock is the
 * transaction's runledger.fake_now (set local), and each completion runs under a savepoint
 * of it (commitHelpers' completeWithCheckpoint), where the path it took is counted.
 */
import { describe, expect } from 'vitest';
import { txTest } from '../helpers/test-tx.js';
import { setNowLocal as setNow } from '../helpers/session.js';
import { runHelpers, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';
import { checkpointHelpers } from '../helpers/checkpoint.js';
import { commitHelpers } from '../helpers/commit.js';
import { sqlState } from '../helpers/sql-errors.js';

const WORKFLOW = 'complete-with-checkpoint';

/** The helpers on the test's transaction. */
const helpers = (db: TxDb) => ({
  ...runHelpers(db, { workflow: WORKFLOW }),
  ...claimHelpers(db, { workflow: WORKFLOW }),
  ...checkpointHelpers(db),
  ...commitHelpers(db),
});

const it = txTest.extend<{ db: TxDb; h: ReturnType<typeof helpers> }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
  h: async ({ db }, use) => {
    await use(helpers(db));
  },
});

describe('a completion with its last step: _commit_fast and runledger._complete_with_checkpoint', () => {
  const variants = [
    { label: 'fast path (charge 0, RUNNING, no no_progress limit, before its deadline)', path: 'fast', charge: 0, options: {}, spent: 0 },
    { label: 'fast path (a charge within the budget)', path: 'fast', charge: 1.5, options: {}, spent: 1.5 },
    { label: 'general path (a no_progress limit, with a charge)', path: 'general', charge: 1.5, options: { no_progress: 5 }, spent: 1.5 },
    { label: 'general path (a no_progress limit)', path: 'general', charge: 0, options: { no_progress: 5 }, spent: 0 },
  ] as const;

  for (const v of variants) describe(v.label, () => {
    it('SUCCEEDED, COMPLETED, evidence {steps, budget_spent}, one completed event, the step row under the token', async ({ db, h }) => {
      const { getRun, events, reclaimedRun, checkpoint, stepRows, completeWithCheckpoint, completedEvents } = h;
      const client = db.pool;
      await setNow(client, '2070-01-01T00:00:00Z');
      const { runId, token } = await reclaimedRun({ ...v.options, deadline: '1 hour' }, client);
      await checkpoint(runId, token, 0, 'a', { output: 1, on: client });
      await checkpoint(runId, token, 1, 'b', { output: 2, on: client });
      await setNow(client, '2070-01-01T00:00:07Z');
      const path = await completeWithCheckpoint(client, {
        runId, token, seq: 2, name: 'c', charge: v.charge, stepOutput: { c: 3 }, output: { total: 6 }, attempts: 2,
        startedMsAgo: 1_000, // started at 00:00:06
      });
      expect(path).toBe(v.path);

      const evidence = { steps: 3, budget_spent: v.spent };
      const run = await getRun(runId);
      expect(run).toMatchObject({
        status: 'SUCCEEDED', output: { total: 6 }, error: null, termination_reason: 'COMPLETED', termination_evidence: evidence,
        lease_owner: null, lease_expires_at: null, wait_kind: null, fencing_token: token,
        policy_version: expect.stringMatching(/^limits:[0-9a-f]{12}$/),
      });
      expect(Number(run?.budget_spent)).toBe(v.spent);
      expect(run?.finished_at.toISOString()).toBe('2070-01-01T00:00:07.000Z');
      expect(run?.terminated_at.toISOString()).toBe('2070-01-01T00:00:07.000Z');
      const rows = await stepRows(runId);
      expect(rows.map((s) => [s.seq, s.name, s.status, s.output, s.attempts, s.fencing_token])).toEqual([
        [0, 'a', 'SUCCEEDED', 1, 1, token],
        [1, 'b', 'SUCCEEDED', 2, 1, token],
        [2, 'c', 'SUCCEEDED', { c: 3 }, 2, token],
      ]);
      expect(evidence.steps).toBe(rows.length);
      expect(await completedEvents(runId)).toEqual([
        { kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence } },
      ]);
      expect((await events(runId)).at(-1)?.kind).toBe('completed');
      const finishedAt = await db.pool.query('select finished_at from runledger.steps where run_id = $1 and seq = 2', [runId]);
      expect(finishedAt.rows[0].finished_at.toISOString()).toBe('2070-01-01T00:00:07.000Z');
    });

    it('counts once the step whose durable retry left a WAITING row at the last seq', async ({ db, h }) => {
      const { startRun, getRun, steps, claimOne, checkpoint, stepRows, completeWithCheckpoint, completedEvents } = h;
      const client = db.pool;
      await setNow(client, '2070-02-01T00:00:00Z');
      const runId = await startRun(v.options, {}, client);
      const first = (await claimOne(runId, 'wk-retry', 30_000, client)).fencing_token;
      await checkpoint(runId, first, 0, 'a', { output: 'a', on: client });
      await client.query(`select runledger._retry_wait($1, $2, 1, 'flaky', 'step', 1, 5000)`, [runId, first]);
      expect(await getRun(runId)).toMatchObject({ status: 'WAITING', wait_kind: 'retry' });
      expect((await steps(runId)).map((s) => [s.seq, s.status])).toEqual([[0, 'SUCCEEDED'], [1, 'WAITING']]);
      await setNow(client, '2070-02-01T00:00:06Z');
      const token = (await claimOne(runId, 'wk-retry', 30_000, client)).fencing_token;
      expect(token).toBe(first + 1);

      const path = await completeWithCheckpoint(client, {
        runId, token, seq: 1, name: 'flaky', charge: v.charge, stepOutput: 'ok at last', output: 'done', attempts: 2,
      });
      expect(path).toBe(v.path);
      const rows = await stepRows(runId);
      expect(rows.map((s) => [s.seq, s.name, s.status, s.output, s.attempts, s.fencing_token])).toEqual([
        [0, 'a', 'SUCCEEDED', 'a', 1, first],
        [1, 'flaky', 'SUCCEEDED', 'ok at last', 2, token],
      ]);
      const evidence = { steps: 2, budget_spent: v.spent };
      expect(await getRun(runId)).toMatchObject({ status: 'SUCCEEDED', output: 'done', termination_reason: 'COMPLETED', termination_evidence: evidence });
      expect(await completedEvents(runId)).toEqual([{ kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence } }]);
    });

    it('a stale token raises RL001 and writes nothing', async ({ db, h }) => {
      const { reclaimedRun, checkpoint, snapshot, completeWithCheckpoint } = h;
      const client = db.pool;
      const { runId, stale, token } = await reclaimedRun(v.options, client);
      await checkpoint(runId, token, 0, 'a', { on: client });
      const before = await snapshot(runId);
      expect(await sqlState(completeWithCheckpoint(client, { runId, token: stale, seq: 1, name: 'b', charge: v.charge, output: 'x' }))).toBe('RL001');
      expect(await snapshot(runId)).toEqual(before);
      // A finished run: its own token is spent too.
      await completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x' });
      const done = await snapshot(runId);
      expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 2, name: 'c', charge: v.charge, output: 'y' }))).toBe('RL001');
      expect(await snapshot(runId)).toEqual(done);
    });

    it('a seq that already has a checkpoint raises RL010 and writes nothing', async ({ db, h }) => {
      const { startRun, getRun, claimOne, checkpoint, snapshot, completeWithCheckpoint } = h;
      const client = db.pool;
      const runId = await startRun(v.options, {}, client);
      const token = (await claimOne(runId, 'wk-dup', 30_000, client)).fencing_token;
      await checkpoint(runId, token, 0, 'a', { output: 'first', on: client });
      await checkpoint(runId, token, 1, 'b', { output: 'second', on: client });
      const before = await snapshot(runId);
      // The same step again, and another step at a taken position.
      expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, stepOutput: 'again', output: 'x' }))).toBe('RL010');
      expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 0, name: 'z', charge: v.charge, stepOutput: 'again', output: 'x' }))).toBe('RL010');
      expect(await snapshot(runId)).toEqual(before);
      expect((await getRun(runId))?.status).toBe('RUNNING');
    });

    it('past the deadline (or at it) raises RL009 and writes nothing', async ({ db, h }) => {
      const { startRun, claimOne, checkpoint, snapshot, completeWithCheckpoint } = h;
      const client = db.pool;
      await setNow(client, '2070-03-01T00:00:00Z');
      const runId = await startRun({ ...v.options, deadline: '10 seconds' }, {}, client);
      const token = (await claimOne(runId, 'wk-late', 30_000, client)).fencing_token;
      await checkpoint(runId, token, 0, 'a', { on: client });
      const before = await snapshot(runId);
      await setNow(client, '2070-03-01T00:00:10Z');
      expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x' }))).toBe('RL009');
      await setNow(client, '2070-03-01T00:00:20Z');
      expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x' }))).toBe('RL009');
      expect(await snapshot(runId)).toEqual(before);
    });

    it('a CANCELLING run whose step started before the cancel request still completes; one started after raises RL008', async ({ db, h }) => {
      const { startRun, getRun, claimOne, checkpoint, stepRows, snapshot, completeWithCheckpoint, completedEvents } = h;
      const client = db.pool;
      await setNow(client, '2070-04-01T00:00:00Z');
      const runId = await startRun(v.options, {}, client);
      const token = (await claimOne(runId, 'wk-cancel', 30_000, client)).fencing_token;
      await checkpoint(runId, token, 0, 'a', { output: 'a', on: client });
      await setNow(client, '2070-04-01T00:00:02Z');
      expect((await client.query('select runledger.cancel_run($1) as s', [runId])).rows[0].s).toBe('CANCELLING');
      await setNow(client, '2070-04-01T00:00:03Z');

      const before = await snapshot(runId);
      expect(
        await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x', startedMsAgo: 1_000 })), // started at 00:00:02, with the cancel
      ).toBe('RL008');
      expect(await snapshot(runId)).toEqual(before);

      // Only the general path handles a cancel under way.
      expect(
        await completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, stepOutput: 'b', output: 'x', startedMsAgo: 2_000 }), // started at 00:00:01
      ).toBe('general');
      const evidence = { steps: 2, budget_spent: v.spent };
      expect(await getRun(runId)).toMatchObject({
        status: 'SUCCEEDED', output: 'x', termination_reason: 'COMPLETED', termination_evidence: evidence, lease_owner: null,
      });
      expect((await stepRows(runId)).map((s) => [s.seq, s.name, s.fencing_token])).toEqual([[0, 'a', token], [1, 'b', token]]);
      expect(await completedEvents(runId)).toEqual([{ kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence } }]);
    });
  });
});
