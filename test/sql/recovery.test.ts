/**
 * runledger._recover_expired: expired leases go back to PENDING or, out of recovery
 * attempts, to DEAD_LETTER; silent workers are marked stopped.
 *
 * Clock: each test moves its session's clock (runledger.fake_now) to its own year in the
 * past (2001-2003): a lease set there is expired a few seconds later, while leases set on
 * the real clock are not, so each sweep touches only the runs its test made.
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { sessionHelpers, setNow } from '../helpers/session.js';
import { newRunId, runHelpers, registerWorkflowW } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';
import { checkpointHelpers } from '../helpers/checkpoint.js';
import { notifyHelpers } from '../helpers/notify.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { session } = sessionHelpers(db);
const { startRun, getRun, steps, events } = runHelpers(db);
const { claimOne, claimable } = claimHelpers(db);
const { checkpoint } = checkpointHelpers(db);
const { notified } = notifyHelpers(db);

describe('runledger._recover_expired', () => {
  it('sends a RUNNING run whose lease expired back to PENDING (one recovery attempt) and leaves a live lease alone', async () => {
    await session(async (client) => {
      await setNow(client, '2001-01-01T00:00:00Z');
      const expired = await startRun({}, {}, client);
      const live = await startRun({}, {}, client);
      const e = await claimOne(expired, 'wk-dead', 1_000, client);
      await checkpoint(expired, e.fencing_token, 0, 'a', { on: client });
      const l = await claimOne(live, 'wk-alive', 3_600_000, client);

      await setNow(client, '2001-01-01T00:00:02Z');
      // An expired lease alone does not make a run claimable: recovery does.
      expect((await claimable(expired, { on: client })).claimed).toBe(false);
      const { result: handled, payloads } = await notified(() => client.query('select runledger._recover_expired() as n'));
      expect(handled.rows[0].n).toBe(1);

      expect(await getRun(expired)).toMatchObject({
        status: 'PENDING',
        recovery_attempts: 1,
        lease_owner: null,
        lease_expires_at: null,
        fencing_token: 1,
        termination_reason: null,
      });
      expect(await steps(expired)).toHaveLength(1);
      expect((await events(expired)).at(-1)).toEqual({
        kind: 'lease_expired',
        detail: { last_owner: 'wk-dead', lease_expired_at: expect.any(String), recovery_attempt: 1 },
      });
      const detail = (await events(expired)).at(-1)!.detail;
      expect(new Date(detail.lease_expired_at).toISOString()).toBe('2001-01-01T00:00:01.000Z');
      // Announced to the workers of its queue (once: the live run was not touched), and claimable now.
      expect(payloads).toEqual(['default']);
      expect((await getRun(expired))?.not_before).toBeNull();
      expect((await claimable(expired, { on: client })).claimed).toBe(true);

      const untouched = await getRun(live);
      expect(untouched).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-alive', recovery_attempts: 0, fencing_token: 1 });
      expect(untouched?.lease_expires_at.toISOString()).toBe('2001-01-01T01:00:00.000Z');
      expect((await events(live)).map((ev) => ev.kind)).toEqual(['created', 'claimed']);
      expect((await claimable(live, { on: client })).claimed).toBe(false);

      // The recovered run is claimable again, with its checkpoint and a new token.
      const again = await claimOne(expired, 'wk-next', 1_000, client);
      expect(again).toMatchObject({ fencing_token: 2, recovery_attempts: 1 });
      expect(again.checkpoints).toEqual([[0, 'a', 'SUCCEEDED', null, null, 'step']]);

      // Leave nothing RUNNING on the fake 2001 clock for later sweeps.
      await client.query(`select runledger._release_run($1, $2, 0, 'test')`, [live, l.fencing_token]);
      await client.query(`select runledger._release_run($1, $2, 0, 'test')`, [expired, again.fencing_token]);
    });
  });

  it('dead-letters a run whose recovery_attempts already equal max_recovery_attempts, with MAX_RECOVERY_ATTEMPTS and evidence', async () => {
    await session(async (client) => {
      const base = Date.parse('2002-01-01T00:00:00Z');
      const at = (seconds: number) => new Date(base + seconds * 1000).toISOString();
      const runId = await startRun({}, {}, client); // workflow w: max_recovery_attempts 3
      let t = 0;
      for (let attempt = 1; attempt <= 3; attempt++) {
        await setNow(client, at(t));
        const claimed = await claimOne(runId, `wk-${attempt}`, 1_000, client);
        expect(claimed).toMatchObject({ fencing_token: attempt, recovery_attempts: attempt - 1 });
        await setNow(client, at(t + 2));
        expect((await client.query('select runledger._recover_expired() as n')).rows[0].n).toBe(1);
        expect(await getRun(runId)).toMatchObject({ status: 'PENDING', recovery_attempts: attempt });
        t += 10;
      }
      expect(await getRun(runId)).toMatchObject({ recovery_attempts: 3, max_recovery_attempts: 3 });

      // Attempts exhausted: the next expiry parks the run.
      await setNow(client, at(t));
      await claimOne(runId, 'wk-last', 1_000, client);
      await setNow(client, at(t + 2));
      const { result: swept, payloads } = await notified(() => client.query('select runledger._recover_expired() as n'));
      expect(swept.rows[0].n).toBe(1);

      const run = await getRun(runId);
      expect(run).toMatchObject({
        status: 'DEAD_LETTER',
        termination_reason: 'MAX_RECOVERY_ATTEMPTS',
        recovery_attempts: 3,
        lease_owner: null,
        lease_expires_at: null,
        policy_version: expect.stringMatching(/^limits:[0-9a-f]{12}$/),
      });
      expect(run?.finished_at.toISOString()).toBe(at(t + 2));
      expect(run?.terminated_at.toISOString()).toBe(at(t + 2));
      expect(run?.termination_evidence).toMatchObject({ recovery_attempts: 3, max_recovery_attempts: 3, last_owner: 'wk-last' });
      expect(new Date(run?.termination_evidence.lease_expired_at).toISOString()).toBe(at(t + 1));
      // The event every move to a terminal status writes (_finished), with the evidence.
      expect((await events(runId)).at(-1)).toEqual({
        kind: 'dead_lettered',
        detail: { status: 'DEAD_LETTER', reason: 'MAX_RECOVERY_ATTEMPTS', evidence: run?.termination_evidence, error: run?.error },
      });
      // Why: the lease of its last owner expired once too often.
      expect(run?.error).toEqual({
        name: 'LeaseExpired',
        code: 'LEASE_EXPIRED',
        message: expect.stringContaining('the lease of worker wk-last expired'),
      });
      expect(run?.termination_evidence.last_error).toEqual(run?.error);
      expect(run?.termination_evidence).toMatchObject({ recovery_attempts: 3, last_owner: 'wk-last' });
      // Out of the automatic path: not announced, and no worker claims it.
      expect(payloads).toEqual([]);
      expect((await claimable(runId, { on: client })).claimed).toBe(false);

      const view = await db.pool.query(
        'select run_id, termination_reason, termination_evidence, recovery_attempts, max_recovery_attempts from runledger.dead_letter where run_id = $1',
        [runId],
      );
      expect(view.rows).toEqual([
        {
          run_id: runId,
          termination_reason: 'MAX_RECOVERY_ATTEMPTS',
          termination_evidence: run?.termination_evidence,
          recovery_attempts: 3,
          max_recovery_attempts: 3,
        },
      ]);
      const active = await db.pool.query('select 1 from runledger.active where run_id = $1', [runId]);
      expect(active.rows).toEqual([]);
    });
  });

  it('a dead-lettered run frees its queue slot in the same sweep: the next run of a queue with concurrency 1 is admitted', async () => {
    await session(async (client) => {
      const base = Date.parse('2002-06-01T00:00:00Z');
      const at = (seconds: number) => new Date(base + seconds * 1000).toISOString();
      const queue = newRunId('rec-slot');
      await client.query(`select runledger.set_queue($1, '{"concurrency": 1}')`, [queue]);
      await setNow(client, at(0));
      const doomed = await startRun({ queue, max_recovery_attempts: 0 }, {}, client);
      await claimOne(doomed, 'wk-dies', 1_000, client);
      const next = await startRun({ queue }, {}, client);
      expect(await getRun(next)).toMatchObject({ status: 'PENDING', admitted: false });

      await setNow(client, at(2));
      expect((await client.query('select runledger._recover_expired() as n')).rows[0].n).toBe(1);
      expect(await getRun(doomed)).toMatchObject({ status: 'DEAD_LETTER', termination_reason: 'MAX_RECOVERY_ATTEMPTS' });
      // No second sweep (_admit_all) needed: the slot was given to the next run right away.
      expect(await getRun(next)).toMatchObject({ status: 'PENDING', admitted: true });
      expect((await claimable(next, { on: client })).claimed).toBe(true);
    });
  });

  it('counts recovery attempts since the last progress: an execution that committed a checkpoint starts the count again', async () => {
    await session(async (client) => {
      const base = Date.parse('2002-09-01T00:00:00Z');
      const at = (seconds: number) => new Date(base + seconds * 1000).toISOString();
      const runId = await startRun({ max_recovery_attempts: 1 }, {}, client);
      // Three executions in a row, each commits one checkpoint under its token and dies.
      for (let seq = 0; seq < 3; seq++) {
        await setNow(client, at(seq * 10));
        const claimed = await claimOne(runId, `wk-${seq}`, 1_000, client);
        await checkpoint(runId, claimed.fencing_token, seq, `s${seq}`, { on: client });
        await setNow(client, at(seq * 10 + 2));
        await client.query('select runledger._recover_expired()');
        expect(await getRun(runId)).toMatchObject({ status: 'PENDING', recovery_attempts: 1 });
      }
      expect((await events(runId)).at(-1)).toMatchObject({ kind: 'lease_expired', detail: { recovery_attempt: 1, progress_reset: true } });
      // An execution that commits nothing is not progress: the next expiry is the second in a row.
      await setNow(client, at(40));
      await claimOne(runId, 'wk-idle', 1_000, client);
      await setNow(client, at(42));
      await client.query('select runledger._recover_expired()');
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'DEAD_LETTER', termination_reason: 'MAX_RECOVERY_ATTEMPTS', recovery_attempts: 1 });
      expect(run?.termination_evidence).toMatchObject({ recovery_attempts: 1, max_recovery_attempts: 1, last_owner: 'wk-idle' });
    });
  });

  it('marks a worker silent for two lease lengths as stopped', async () => {
    await session(async (client) => {
      await setNow(client, '2003-01-01T00:00:00Z');
      await client.query(`select runledger._register_worker('wk-silent', 'host', 1, '{w@1}', '{default}', 1, 1000)`);
      await client.query(`select runledger._register_worker('wk-chatty', 'host', 2, '{w@1}', '{default}', 1, 60000)`);
      await setNow(client, '2003-01-01T00:00:03Z');
      await client.query('select runledger._recover_expired()');
      const workers = await db.pool.query(
        `select worker_id, stopped_at from runledger.workers where worker_id in ('wk-silent', 'wk-chatty') order by worker_id`,
      );
      expect(workers.rows.map((w) => [w.worker_id, w.stopped_at?.toISOString() ?? null])).toEqual([
        ['wk-chatty', null],
        ['wk-silent', '2003-01-01T00:00:03.000Z'],
      ]);
    });
  });
});
