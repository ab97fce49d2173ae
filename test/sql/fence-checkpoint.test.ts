/**
 * The claim / fence protocol from SQL: a claim (runledger._claim_batch, as workers make it)
 * takes a new fencing token, and every write of the run (_checkpoint, _fence, _complete_run,
 * _fail_run, _dead_letter_run, _release_run) holds only under the current token.
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { sessionHelpers, setNow } from '../helpers/session.js';
import { runHelpers, newRunId, registerWorkflowW } from '../helpers/runs.js';
import { claimHelpers, claimedIds, sentinel } from '../helpers/claim.js';
import { checkpointHelpers } from '../helpers/checkpoint.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { session } = sessionHelpers(db);
const { startRun, getRun, steps, events } = runHelpers(db);
const { claim, claimOne, claimable, claimBatch } = claimHelpers(db);
const { checkpoint } = checkpointHelpers(db);
const { notified } = notifyHelpers(db);

describe('claim / fence protocol (_claim_batch, _checkpoint, _fence, _complete_run, _fail_run, _release_run)', () => {
  it('_claim_batch takes a PENDING run once: fencing token 1, empty checkpoints, a lease and a claimed event', async () => {
    await session(async (client) => {
      await setNow(client, '2050-01-01T00:00:00Z');
      const runId = await startRun({}, { x: 1 }, client);
      const rows = await claim(runId, 'wk-claim', 30_000, client);
      expect(rows).toEqual([
        { run_id: runId, workflow_name: 'w', workflow_version: '1', input: { x: 1 }, fencing_token: 1, recovery_attempts: 0, checkpoints: [] },
      ]);
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-claim', fencing_token: 1 });
      expect(run?.lease_expires_at.toISOString()).toBe('2050-01-01T00:00:30.000Z');
      expect(run?.started_at.toISOString()).toBe('2050-01-01T00:00:00.000Z');
      expect(await events(runId)).toEqual([
        { kind: 'created', detail: { workflow: 'w', version: '1', queue: 'default' } },
        { kind: 'claimed', detail: { worker: 'wk-claim' } },
      ]);

      // Compare-and-set: a second claim (another worker, or a duplicate dispatch) gets nothing.
      expect(await claim(runId, 'wk-other', 30_000, client)).toEqual([]);
      expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-claim', fencing_token: 1 });
      expect((await events(runId)).map((e) => e.kind)).toEqual(['created', 'claimed']);
    });
  });

  it('_claim_batch with p_reclaim_except takes back a run only from the same owner, with a new token', async () => {
    const runId = await startRun();
    const first = await claimOne(runId, 'wk-reclaim');
    await checkpoint(runId, first.fencing_token, 0, 'a', { output: 'kept' });
    // Without p_reclaim_except (default null) a RUNNING run is not claimable, even by its owner.
    expect(await claim(runId, 'wk-reclaim', 30_000, db.pool, false)).toEqual([]);
    // Another worker cannot take it with p_reclaim_except either.
    expect(await claim(runId, 'wk-thief', 30_000, db.pool, true)).toEqual([]);
    expect(await getRun(runId)).toMatchObject({ lease_owner: 'wk-reclaim', fencing_token: 1 });

    const again = await claim(runId, 'wk-reclaim', 30_000, db.pool, true);
    expect(again).toEqual([
      {
        run_id: runId, workflow_name: 'w', workflow_version: '1', input: { n: 1 }, fencing_token: 2, recovery_attempts: 0,
        checkpoints: [[0, 'a', 'SUCCEEDED', ['kept'], null, 'step']],
      },
    ]);
    // The first claim's token is now stale.
    expect(await sqlState(checkpoint(runId, first.fencing_token, 1, 'b'))).toBe('RL001');
    expect((await events(runId)).map((e) => e.kind)).toEqual(['created', 'claimed', 'claimed']);
  });

  // _claim_batch claims from queues, not by run id: the unknown run is a queue that holds none.
  it('_claim_batch of a queue without runs returns no claimed row, only the sentinel with nothing due', async () => {
    const rows = await claimBatch('wk-1', [newRunId('q-empty')], ['w@1'], 1);
    expect(claimedIds(rows)).toEqual([]);
    expect(rows).toEqual([sentinel(null)]);
  });

  it('only one of many concurrent claims wins', async () => {
    // A queue of its own: nothing else there for the claims to take, so they all race for this run.
    const runId = await startRun({ queue: newRunId('q-race') });
    const results = await Promise.all(Array.from({ length: 5 }, (_, i) => claim(runId, `wk-race-${i}`)));
    const winners = results.filter((rows) => rows.length === 1);
    expect(winners).toHaveLength(1);
    expect(winners[0]![0]!.fencing_token).toBe(1);
    expect((await events(runId)).filter((e) => e.kind === 'claimed')).toHaveLength(1);
  });

  it('_checkpoint with the current token inserts the step and returns the backend pid', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await session(async (client) => {
      const pid = (await client.query('select pg_backend_pid() as pid')).rows[0].pid;
      expect(await checkpoint(runId, fencing_token, 0, 'load', { output: { id: 7 }, on: client })).toBe(pid);
    });
    expect(await steps(runId)).toEqual([{ seq: 0, name: 'load', status: 'SUCCEEDED', fencing_token: 1 }]);
    const stored = await db.pool.query('select output from runledger.steps where run_id = $1 and seq = 0', [runId]);
    expect(stored.rows[0].output).toEqual({ id: 7 });
    // The checkpoint comes back with the next claim.
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, fencing_token]);
    expect((await claimOne(runId)).checkpoints).toEqual([[0, 'load', 'SUCCEEDED', [{ id: 7 }], null, 'step']]);
  });

  it('_checkpoint with a stale token (run taken over) raises RL001 and inserts nothing', async () => {
    const runId = await startRun();
    const first = await claimOne(runId, 'wk-old');
    await checkpoint(runId, first.fencing_token, 0, 'a');
    // The run is given back and claimed again: the old owner's token is now stale.
    expect((await db.pool.query(`select runledger._release_run($1, $2, 0, 'test') as ok`, [runId, first.fencing_token])).rows[0].ok).toBe(true);
    const second = await claimOne(runId, 'wk-new');
    expect(second.fencing_token).toBe(2);

    expect(await sqlState(checkpoint(runId, first.fencing_token, 1, 'b'))).toBe('RL001');
    expect(await steps(runId)).toEqual([{ seq: 0, name: 'a', status: 'SUCCEEDED', fencing_token: 1 }]);
    expect(await sqlState(db.pool.query('select runledger._fence($1, $2)', [runId, first.fencing_token]))).toBe('RL001');

    // The new owner writes normally.
    await checkpoint(runId, second.fencing_token, 1, 'b');
    expect((await steps(runId)).map((s) => [s.seq, s.fencing_token])).toEqual([[0, 1], [1, 2]]);
  });

  it('_checkpoint on a run that is not executing raises RL001', async () => {
    const pending = await startRun();
    expect(await sqlState(checkpoint(pending, 0, 0, 'a'))).toBe('RL001');
    expect(await steps(pending)).toEqual([]);
  });

  it('_checkpoint_outcome says whether a checkpoint committed and whether the caller still owns the run', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'a', { output: 'out' });
    const outcome = async (stepSeq: number, token: number) =>
      (await db.pool.query('select * from runledger._checkpoint_outcome($1, $2, $3)', [runId, stepSeq, token])).rows;
    expect(await outcome(0, fencing_token)).toEqual([{ committed: true, status: 'SUCCEEDED', output: ['out'], error: null, still_owner: true }]);
    expect(await outcome(1, fencing_token)).toEqual([{ committed: false, status: null, output: null, error: null, still_owner: true }]);
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, fencing_token]);
    await claimOne(runId, 'wk-next');
    expect(await outcome(1, fencing_token)).toEqual([{ committed: false, status: null, output: null, error: null, still_owner: false }]);
  });

  it('_complete_run: SUCCEEDED with output, COMPLETED and evidence {"steps": n}; a stale token raises RL001', async () => {
    await session(async (client) => {
      await setNow(client, '2050-02-01T00:00:00Z');
      const runId = await startRun({}, {}, client);
      const { fencing_token } = await claimOne(runId, 'wk-done', 30_000, client);
      await checkpoint(runId, fencing_token, 0, 'a', { on: client });
      await checkpoint(runId, fencing_token, 1, 'b', { on: client });
      await checkpoint(runId, fencing_token, 2, 'c', { on: client });

      expect(await sqlState(client.query(`select runledger._complete_run($1, $2, '{"no": 1}', 'p/1')`, [runId, fencing_token + 1]))).toBe('RL001');
      expect((await getRun(runId))?.status).toBe('RUNNING');

      await setNow(client, '2050-02-01T00:00:05Z');
      await client.query(`select runledger._complete_run($1, $2, '{"total": 3}', 'p/1')`, [runId, fencing_token]);
      const run = await getRun(runId);
      expect(run).toMatchObject({
        status: 'SUCCEEDED',
        output: { total: 3 },
        error: null,
        termination_reason: 'COMPLETED',
        termination_evidence: { steps: 3, budget_spent: 0 },
        // The policy the run was started under (its limits), not the caller's label.
        policy_version: expect.stringMatching(/^limits:[0-9a-f]{12}$/),
        lease_owner: null,
        lease_expires_at: null,
      });
      expect(run?.finished_at.toISOString()).toBe('2050-02-01T00:00:05.000Z');
      expect(run?.terminated_at.toISOString()).toBe('2050-02-01T00:00:05.000Z');
      expect((await events(runId)).at(-1)).toEqual({ kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence: { steps: 3, budget_spent: 0 } } });

      // Finished: the same token can neither complete again nor checkpoint.
      expect(await sqlState(client.query(`select runledger._complete_run($1, $2, 'null', 'p/1')`, [runId, fencing_token]))).toBe('RL001');
      expect(await sqlState(checkpoint(runId, fencing_token, 3, 'd', { on: client }))).toBe('RL001');
      expect((await getRun(runId))?.output).toEqual({ total: 3 });
    });
  });

  it('_fail_run: FAILED with the error and the FAILED termination record', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    const error = { name: 'Error', message: 'boom' };
    await db.pool.query(`select runledger._fail_run($1, $2, $3::jsonb, 'p/1')`, [runId, fencing_token, JSON.stringify(error)]);
    const run = await getRun(runId);
    expect(run).toMatchObject({ status: 'FAILED', error, output: null, termination_reason: 'FAILED', lease_owner: null });
    expect(run?.finished_at).toBeInstanceOf(Date);
    expect((await events(runId)).at(-1)).toEqual({ kind: 'failed', detail: { status: 'FAILED', reason: 'FAILED', error } });
  });

  it('_dead_letter_run: DEAD_LETTER with the reason and evidence, listed in runledger.dead_letter', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'alpha');
    const evidence = { seq: 0, expected: 'alpha', actual: 'beta' };
    await db.pool.query(`select runledger._dead_letter_run($1, $2, 'NON_DETERMINISM', $3::jsonb, 'p/1')`, [
      runId,
      fencing_token,
      JSON.stringify(evidence),
    ]);
    // Without p_error (psql, an older worker) the error is built from the reason and evidence.
    const error = { name: 'DeadLettered', code: 'NON_DETERMINISM', message: 'dead-lettered: NON_DETERMINISM' };
    const recorded = { ...evidence, last_error: error };
    expect(await getRun(runId)).toMatchObject({
      status: 'DEAD_LETTER',
      termination_reason: 'NON_DETERMINISM',
      termination_evidence: recorded,
      error,
    });
    const view = await db.pool.query('select termination_reason, termination_evidence, steps_done::int from runledger.dead_letter where run_id = $1', [runId]);
    expect(view.rows).toEqual([{ termination_reason: 'NON_DETERMINISM', termination_evidence: recorded, steps_done: 1 }]);
  });

  it('_release_run: RUNNING -> PENDING, lease cleared, claimable again after the delay; only once per token', async () => {
    // A queue of its own, so that its next due time is this run's.
    const queue = newRunId('q-release');
    const runId = await startRun({ queue });
    const { fencing_token } = await claimOne(runId, 'wk-release');
    await checkpoint(runId, fencing_token, 0, 'a');
    expect(await claimable(runId)).toEqual({ claimed: false, nextDueInMs: null }); // RUNNING under its lease

    const dbNow = (await db.pool.query('select now() as t')).rows[0].t as Date;
    const { result: released, payloads } = await notified(() =>
      db.pool.query(`select runledger._release_run($1, $2, 60000, 'shutdown') as ok`, [runId, fencing_token]),
    );
    const dbAfter = (await db.pool.query('select now() as t')).rows[0].t as Date;
    expect(released.rows[0].ok).toBe(true);
    const run = await getRun(runId);
    expect(run).toMatchObject({ status: 'PENDING', lease_owner: null, lease_expires_at: null, fencing_token: 1, recovery_attempts: 0 });
    expect((await events(runId)).at(-1)).toEqual({ kind: 'released', detail: { reason: 'shutdown', delay_ms: 60000, counts_attempt: false } });
    // Runnable again 60 s after the release, and announced with that delay (ms).
    const notBefore = run!.not_before as Date;
    expect(notBefore.getTime()).toBeGreaterThanOrEqual(dbNow.getTime() + 60_000);
    expect(notBefore.getTime()).toBeLessThanOrEqual(dbAfter.getTime() + 60_000);
    expect(payloads).toHaveLength(1);
    expect(payloads[0]).toBe(`${queue}+60000`);
    // Not claimable before then (the next due time says in how long), claimable after.
    const probeBefore = (await db.pool.query('select now() as t')).rows[0].t as Date;
    const probe = await claimable(runId);
    const probeAfter = (await db.pool.query('select now() as t')).rows[0].t as Date;
    expect(probe).toEqual({ claimed: false, nextDueInMs: expect.any(Number) });
    expect(probe.nextDueInMs!).toBeLessThanOrEqual(notBefore.getTime() - probeBefore.getTime() + 1);
    expect(probe.nextDueInMs!).toBeGreaterThanOrEqual(notBefore.getTime() - probeAfter.getTime());
    await session(async (client) => {
      await setNow(client, new Date(notBefore.getTime() - 1_000).toISOString());
      // 1 s (not_before has microseconds, the Date it was read into whole milliseconds; the delay is rounded up).
      const soon = await claimable(runId, { on: client });
      expect(soon).toEqual({ claimed: false, nextDueInMs: expect.any(Number) });
      expect([1_000, 1_001]).toContain(soon.nextDueInMs);
      await setNow(client, new Date(notBefore.getTime() + 1).toISOString());
      expect(await claimable(runId, { on: client })).toEqual({ claimed: true, nextDueInMs: null });
    });
    expect(await steps(runId)).toHaveLength(1);

    // The token is spent: a second release (or a late one from the old owner) does nothing.
    const again = await db.pool.query(`select runledger._release_run($1, $2, 0, 'shutdown') as ok`, [runId, fencing_token]);
    expect(again.rows[0].ok).toBe(false);
    expect((await events(runId)).filter((e) => e.kind === 'released')).toHaveLength(1);
  });
});
