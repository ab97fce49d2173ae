/**
 * A stopping run (CANCELLING with compensations due) whose workers keep dying: recovery
 * hands it to the next claim, counting attempts, and past max_recovery_attempts gives
 * the compensations up and ends the run with the record it stopped with.
 *
 * The test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts), on a workflow named after the file. Clock: the transaction's
 * runledger.fake_now is in 2004, so the leases set there are expired moments later, and
 * the only runs _recover_expired sees are the test's own.
 */
import { describe, expect } from 'vitest';
import { txTest } from '../helpers/test-tx.js';
import { at, setNowLocal } from '../helpers/session.js';
import { runHelpers, newRunId, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { claimRun } from '../helpers/claim.js';
import { insertRun } from '../helpers/run-factory.js';

const WORKFLOW = 'compensation-recovery';

const it = txTest.extend<{ db: TxDb }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
});

describe('recovery of a stopping run', () => {
  it('hands it to the next claim after each expiry, then gives up after max_recovery_attempts (compensations_abandoned)', async ({ db }) => {
    const { getRun, events } = runHelpers(db);
    const base = '2004-01-01T00:00:00Z';
    const stopRecord = { status: 'TERMINATED', reason: 'DEADLINE', evidence: { deadline_at: base }, was: 'WAITING' };
    const runId = await insertRun(db.pool, {
      runId: newRunId('compensation-recovery'),
      workflow: WORKFLOW,
      status: 'CANCELLING',
      leaseOwner: null,
      leaseExpiresAt: null,
      queue: 'compensation-recovery-stopping',
      columns: { max_recovery_attempts: 2, stop_record: JSON.stringify(stopRecord), cancel_requested_at: new Date(base) },
    });
    await db.pool.query(
      `insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, compensable)
       values ($1, $2, 0, 'book', $3, 'SUCCEEDED', true)`,
      [`op-${runId}`, runId, `book-${runId}`],
    );
    for (let attempt = 1; attempt <= 3; attempt++) {
      await setNowLocal(db.pool, at(base, attempt * 10));
      const [claimed] = await claimRun(db, runId, { worker: `wk-${attempt}`, leaseMs: 1_000 });
      expect(claimed, `claim ${attempt}`).toBeDefined();
      // The worker dies before the compensation is recorded: its lease runs out.
      await setNowLocal(db.pool, at(base, attempt * 10 + 2));
      expect((await db.pool.query('select runledger._recover_expired() as n')).rows[0].n).toBe(1);
      const run = await getRun(runId);
      if (attempt < 3) {
        expect(run).toMatchObject({ status: 'CANCELLING', lease_owner: null, recovery_attempts: attempt });
      }
    }
    const ended = await getRun(runId);
    expect(ended).toMatchObject({ status: 'TERMINATED', termination_reason: 'DEADLINE', stop_record: null, lease_owner: null });
    expect(ended?.termination_evidence).toEqual({ deadline_at: base, compensations: { done: 0, failed: [], not_run: ['book'] } });
    const abandoned = (await events(runId)).filter((e) => e.kind === 'compensations_abandoned');
    expect(abandoned).toEqual([
      {
        kind: 'compensations_abandoned',
        detail: { recovery_attempts: 2, max_recovery_attempts: 2, compensations: { done: 0, failed: [], not_run: ['book'] } },
      },
    ]);
    expect((await events(runId)).at(-1)?.kind).toBe('deadline');
  });
});
