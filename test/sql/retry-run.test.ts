/**
 * runledger.retry_run: a DEAD_LETTER or FAILED run back to PENDING, its checkpoints kept
 * (but a failed last step), the old termination record in a retried event.
 *
 * Clock: the dead-letter test moves its session's clock to 2002, where its leases expire
 * within seconds without touching the leases other tests take on the real clock.
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { sessionHelpers, setNow } from '../helpers/session.js';
import { runHelpers, registerWorkflowW } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';
import { checkpointHelpers } from '../helpers/checkpoint.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { session } = sessionHelpers(db);
const { startRun, getRun, steps, events } = runHelpers(db);
const { claimOne, claimable } = claimHelpers(db);
const { checkpoint } = checkpointHelpers(db);
const { notified } = notifyHelpers(db);

describe('runledger.retry_run', () => {
  it('brings a DEAD_LETTER run back to PENDING with checkpoints intact and the old termination record in a retried event', async () => {
    await session(async (client) => {
      const runId = await startRun({ max_recovery_attempts: 1 }, {}, client);
      // Claimed, two checkpoints, lease expires (recovery 1), claimed again, expires again: dead-lettered.
      await setNow(client, '2002-06-01T00:00:00Z');
      const c1 = await claimOne(runId, 'wk-a', 1_000, client);
      await checkpoint(runId, c1.fencing_token, 0, 'a', { output: 1, on: client });
      await checkpoint(runId, c1.fencing_token, 1, 'b', { output: 2, on: client });
      await setNow(client, '2002-06-01T00:00:02Z');
      await client.query('select runledger._recover_expired()');
      await claimOne(runId, 'wk-b', 1_000, client);
      await setNow(client, '2002-06-01T00:00:04Z');
      await client.query('select runledger._recover_expired()');
      const dead = await getRun(runId);
      expect(dead).toMatchObject({ status: 'DEAD_LETTER', recovery_attempts: 1, termination_reason: 'MAX_RECOVERY_ATTEMPTS' });
      expect((await claimable(runId, { on: client })).claimed).toBe(false);

      const { result, payloads } = await notified(() => client.query('select runledger.retry_run($1) as status', [runId]));
      expect(result.rows[0].status).toBe('PENDING');

      expect(await getRun(runId)).toMatchObject({
        status: 'PENDING',
        recovery_attempts: 0,
        termination_reason: null,
        termination_evidence: null,
        terminated_at: null,
        finished_at: null,
        policy_version: expect.stringMatching(/^limits:/), // the run keeps the policy it started under
        error: null,
        output: null,
        lease_owner: null,
      });
      expect((await steps(runId)).map((s) => [s.seq, s.name, s.status])).toEqual([
        [0, 'a', 'SUCCEEDED'],
        [1, 'b', 'SUCCEEDED'],
      ]);
      expect((await events(runId)).at(-1)).toEqual({
        kind: 'retried',
        detail: {
          previous_status: 'DEAD_LETTER',
          termination_reason: 'MAX_RECOVERY_ATTEMPTS',
          termination_evidence: dead?.termination_evidence,
          // The error it was dead-lettered with is kept in the record too.
          error: dead?.error,
        },
      });
      expect(dead?.error).toMatchObject({ code: 'LEASE_EXPIRED', message: expect.stringContaining('wk-b') });
      // Announced to the workers of its queue, and claimable at once.
      expect(payloads).toEqual(['default']);
      expect((await claimable(runId, { on: client })).claimed).toBe(true);
      expect(await db.pool.query('select 1 from runledger.dead_letter where run_id = $1', [runId]).then((r) => r.rows)).toEqual([]);

      // The next claim resumes from the checkpoints with a new token.
      const resumed = await claimOne(runId, 'wk-c', 30_000, client);
      expect(resumed).toMatchObject({ fencing_token: 3, recovery_attempts: 0 });
      expect(resumed.checkpoints).toEqual([
        [0, 'a', 'SUCCEEDED', [1], null, 'step'],
        [1, 'b', 'SUCCEEDED', [2], null, 'step'],
      ]);
    });
  });

  it('brings a FAILED run back to PENDING, removing only its last (failed) step', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'a', { output: 'ok' });
    await checkpoint(runId, fencing_token, 1, 'b', { output: 'ok' });
    const stepError = { name: 'Error', message: 'upstream said no' };
    await checkpoint(runId, fencing_token, 2, 'c', { status: 'FAILED', error: stepError });
    const runError = { name: 'StepFailedError', message: 'step "c" failed' };
    await db.pool.query(`select runledger._fail_run($1, $2, $3::jsonb, 'p/1')`, [runId, fencing_token, JSON.stringify(runError)]);

    expect((await db.pool.query('select runledger.retry_run($1) as status', [runId])).rows[0].status).toBe('PENDING');
    expect(await getRun(runId)).toMatchObject({ status: 'PENDING', error: null, termination_reason: null, finished_at: null });
    expect((await steps(runId)).map((s) => [s.seq, s.name, s.status])).toEqual([
      [0, 'a', 'SUCCEEDED'],
      [1, 'b', 'SUCCEEDED'],
    ]);
    expect((await events(runId)).at(-1)).toEqual({
      kind: 'retried',
      detail: {
        previous_status: 'FAILED',
        termination_reason: 'FAILED',
        error: runError,
        dropped_failed_step: { seq: 2, name: 'c', error: stepError },
      },
    });
  });

  it('keeps an earlier failed step that the workflow caught when the last step succeeded', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'caught', { status: 'FAILED', error: { message: 'nope' } });
    await checkpoint(runId, fencing_token, 1, 'after', { output: 'fine' });
    await db.pool.query(`select runledger._fail_run($1, $2, '{"message": "thrown outside a step"}', 'p/1')`, [runId, fencing_token]);

    await db.pool.query('select runledger.retry_run($1)', [runId]);
    expect((await steps(runId)).map((s) => [s.seq, s.name, s.status])).toEqual([
      [0, 'caught', 'FAILED'],
      [1, 'after', 'SUCCEEDED'],
    ]);
    expect((await events(runId)).at(-1)?.detail).not.toHaveProperty('dropped_failed_step');
  });

  it('raises RL005 for a SUCCEEDED or RUNNING run and changes nothing', async () => {
    const done = await startRun();
    const c = await claimOne(done);
    await db.pool.query(`select runledger._complete_run($1, $2, '"out"', 'p/1')`, [done, c.fencing_token]);
    const running = await startRun();
    await claimOne(running);

    expect(await sqlState(db.pool.query('select runledger.retry_run($1)', [done]))).toBe('RL005');
    expect(await sqlState(db.pool.query('select runledger.retry_run($1)', [running]))).toBe('RL005');
    expect(await getRun(done)).toMatchObject({ status: 'SUCCEEDED', output: 'out', termination_reason: 'COMPLETED' });
    expect(await getRun(running)).toMatchObject({ status: 'RUNNING' });
    expect((await events(done)).map((e) => e.kind)).toEqual(['created', 'claimed', 'completed']);
  });

  it('raises RL002 for an unknown run', async () => {
    expect(await sqlState(db.pool.query('select runledger.retry_run($1)', ['no-such-run']))).toBe('RL002');
  });
});
