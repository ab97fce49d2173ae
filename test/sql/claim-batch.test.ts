/**
 * runledger._claim_batch, the claim workers make: order, limits, SKIP LOCKED between
 * claimers, queue and workflow@version filters, due times, deadlines, CANCELLING runs and
 * the reclaim of runs whose claim reply was lost.
 */
import { beforeAll, describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { sessionHelpers, setNow, at } from '../helpers/session.js';
import { runHelpers, newRunId, registerWorkflowW } from '../helpers/runs.js';
import { claimHelpers, claimedIds, sentinels, sentinel } from '../helpers/claim.js';
import { checkpointHelpers } from '../helpers/checkpoint.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { session } = sessionHelpers(db);
const { startRun, getRun, events } = runHelpers(db);
const { claimOne, claimBatch, claimedEvents } = claimHelpers(db);
const { checkpoint } = checkpointHelpers(db);
const { notified } = notifyHelpers(db);

describe('runledger._claim_batch', () => {
  // Every test has queues of its own (so other runs in this database are not in the way) and,
  // where leases are taken, a fake clock in the 2070s: those leases never expire on the real
  // clock or on the clock of a recovery sweep in the past.
  beforeAll(async () => {
    await db.pool.query(`select runledger._register_workflow('cb-other', '1', 'default', 3)`);
    await db.pool.query(`select runledger._register_workflow('cb-other', '2', 'default', 3)`);
  });

  it('claims up to the limit, lower priority first and then older: each RUNNING with a new token, a lease and a claimed event', async () => {
    await session(async (client) => {
      const T = '2070-01-01T00:00:00Z';
      const queue = newRunId('cb-order');
      await setNow(client, at(T, 0));
      const late = await startRun({ queue, priority: 5 }, { i: 'late' }, client);
      await setNow(client, at(T, 1));
      const older = await startRun({ queue }, { i: 'older' }, client);
      await setNow(client, at(T, 2));
      const newer = await startRun({ queue }, { i: 'newer' }, client);
      await setNow(client, at(T, 3));
      const urgent = await startRun({ queue, priority: -1 }, { i: 'urgent' }, client);

      await setNow(client, at(T, 10));
      const first = await claimBatch('wk-cb', [queue], ['w@1'], 2, { on: client });
      // The limit was reached: two runs, no sentinel row.
      expect(first).toHaveLength(2);
      expect(claimedIds(first).sort()).toEqual([urgent, older].sort());
      expect(first.find((r) => r.run_id === urgent)).toEqual({
        run_id: urgent,
        workflow_name: 'w',
        workflow_version: '1',
        input: { i: 'urgent' },
        fencing_token: 1,
        recovery_attempts: 0,
        cancel_requested: false,
        checkpoints: [],
        next_due_in_ms: null,
      });
      for (const runId of [urgent, older]) {
        const run = await getRun(runId);
        expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-cb', fencing_token: 1 });
        expect(run?.lease_expires_at.toISOString()).toBe(at(T, 40));
        expect(run?.started_at.toISOString()).toBe(at(T, 10));
      }
      for (const runId of [newer, late]) expect(await getRun(runId)).toMatchObject({ status: 'PENDING', lease_owner: null, fencing_token: 0 });

      // One at a time, the others come in the same order.
      expect(await claimBatch('wk-cb', [queue], ['w@1'], 1, { on: client })).toEqual([expect.objectContaining({ run_id: newer, input: { i: 'newer' } })]);
      expect(await claimBatch('wk-cb', [queue], ['w@1'], 1, { on: client })).toEqual([expect.objectContaining({ run_id: late, input: { i: 'late' } })]);
      // Nothing left: only the sentinel row, with nothing due.
      expect(await claimBatch('wk-cb', [queue], ['w@1'], 3, { on: client })).toEqual([sentinel(null)]);

      // Each claim is in the history once, with the worker, the new token and the time.
      const claimed = await claimedEvents([late, older, newer, urgent]);
      expect(claimed.map((e) => e.run_id).sort()).toEqual([late, older, newer, urgent].sort());
      for (const event of claimed) {
        expect(event).toMatchObject({ detail: { worker: 'wk-cb' }, fencing_token: 1 });
        expect(event.at.toISOString()).toBe(at(T, 10));
      }
      expect((await events(urgent)).map((e) => e.kind)).toEqual(['created', 'claimed']);
    });
  });

  it('two claimers in open transactions never get the same run (SKIP LOCKED), and neither waits for the other', async () => {
    const queue = newRunId('cb-race');
    const runIds = [await startRun({ queue }), await startRun({ queue }), await startRun({ queue })];
    await session(async (a) => {
      await session(async (b) => {
        for (const client of [a, b]) {
          await setNow(client, '2071-01-01T00:00:00Z');
          // A claimer that waited for the other's locks would fail here instead of hanging.
          await client.query(`set statement_timeout = '5s'`);
          await client.query('begin');
        }
        const fromA = await claimBatch('wk-race-a', [queue], ['w@1'], 2, { on: a });
        const fromB = await claimBatch('wk-race-b', [queue], ['w@1'], 3, { on: b });
        expect(claimedIds(fromA)).toHaveLength(2);
        expect(claimedIds(fromB)).toHaveLength(1);
        expect(sentinels(fromB)).toEqual([sentinel(null)]);
        // A looks again while B still holds its run: nothing for A.
        expect(await claimBatch('wk-race-a', [queue], ['w@1'], 3, { on: a })).toEqual([sentinel(null)]);
        await a.query('commit');
        await b.query('commit');

        expect([...claimedIds(fromA), ...claimedIds(fromB)].sort()).toEqual([...runIds].sort());
        for (const runId of claimedIds(fromA)) expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-race-a', fencing_token: 1 });
        for (const runId of claimedIds(fromB)) expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-race-b', fencing_token: 1 });
        expect((await claimedEvents(runIds)).map((e) => e.run_id).sort()).toEqual([...runIds].sort());
      });
    });
  });

  it('many concurrent claimers: every run is claimed by exactly one of them', async () => {
    const queue = newRunId('cb-swarm');
    const runIds: string[] = [];
    for (let i = 0; i < 20; i++) runIds.push(await startRun({ queue }, { i }));
    const results = await Promise.all([1, 2, 3, 4].map((w) => claimBatch(`wk-swarm-${w}`, [queue], ['w@1'], 6)));
    const taken = results.flatMap(claimedIds);
    expect(new Set(taken).size).toBe(taken.length);
    const rest = claimedIds(await claimBatch('wk-swarm-last', [queue], ['w@1'], 20));
    expect([...taken, ...rest].sort()).toEqual([...runIds].sort());
    const claimed = await claimedEvents(runIds);
    expect(claimed.map((e) => e.run_id).sort()).toEqual([...runIds].sort());
    const owners = new Map<string, string>();
    results.forEach((rows, w) => claimedIds(rows).forEach((id) => owners.set(id, `wk-swarm-${w + 1}`)));
    rest.forEach((id) => owners.set(id, 'wk-swarm-last'));
    for (const event of claimed) expect(event.detail.worker, event.run_id).toBe(owners.get(event.run_id));
    const tokens = await db.pool.query(`select distinct status, fencing_token::int as t from runledger.runs where run_id = any($1)`, [runIds]);
    expect(tokens.rows).toEqual([{ status: 'RUNNING', t: 1 }]);
  });

  it('claims only runs of the given queues and workflow@version keys', async () => {
    await session(async (client) => {
      await setNow(client, '2072-01-01T00:00:00Z');
      const qa = newRunId('cb-qa');
      const qb = newRunId('cb-qb');
      const wInA = await startRun({ queue: qa }, {}, client);
      const wInB = await startRun({ queue: qb }, {}, client);
      const otherV1InA = await startRun({ queue: qa, version: '1' }, {}, client, 'cb-other');
      const otherV2InA = await startRun({ queue: qa, version: '2' }, {}, client, 'cb-other');

      expect(claimedIds(await claimBatch('wk-f', [qa], ['w@1'], 10, { on: client }))).toEqual([wInA]);
      expect(claimedIds(await claimBatch('wk-f', [qa], ['cb-other@2', 'w@2'], 10, { on: client }))).toEqual([otherV2InA]);
      expect(await claimBatch('wk-f', ['cb-nobody'], ['w@1', 'cb-other@1'], 10, { on: client })).toEqual([sentinel(null)]);
      expect(await claimBatch('wk-f', [qa, qb], [], 10, { on: client })).toEqual([sentinel(null)]);
      expect(await getRun(wInB)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
      expect(await getRun(otherV1InA)).toMatchObject({ status: 'PENDING', fencing_token: 0 });

      const both = await claimBatch('wk-f', [qa, qb], ['w@1', 'cb-other@1'], 10, { on: client });
      expect(claimedIds(both).sort()).toEqual([wInB, otherV1InA].sort());
      expect(both.find((r) => r.run_id === otherV1InA)).toMatchObject({ workflow_name: 'cb-other', workflow_version: '1' });
      for (const runId of [wInA, wInB, otherV1InA, otherV2InA]) {
        expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-f', fencing_token: 1 });
      }
    });
  });

  it('leaves a delayed start or a timer that is not due, and reports the earliest due time in the sentinel row', async () => {
    await session(async (client) => {
      const T = '2073-01-01T00:00:00Z';
      const queue = newRunId('cb-due');
      await setNow(client, at(T, 0));
      const start = await notified(() => startRun({ queue, run_at: at(T, 3600) }, {}, client));
      const delayed = start.result;
      expect((await getRun(delayed))?.not_before.toISOString()).toBe(at(T, 3600));
      expect(start.payloads).toEqual([`${queue}+3600000`]); // due in an hour

      // A second run goes to sleep for 30 minutes.
      const sleeper = await startRun({ queue }, {}, client);
      expect(await claimBatch('wk-due', [queue], ['w@1'], 1, { on: client })).toEqual([expect.objectContaining({ run_id: sleeper, fencing_token: 1 })]);
      const parked = await notified(() =>
        client.query(`select done from runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 1800000}')`, [sleeper]),
      );
      expect(parked.result.rows).toEqual([{ done: false }]);
      expect(parked.payloads).toEqual([`${queue}+1800000`]); // due in 30 minutes
      expect(await getRun(sleeper)).toMatchObject({ status: 'WAITING', wait_kind: 'timer', lease_owner: null });

      // The due time, as the delay from the claim's clock: at(T, 1800).
      expect(await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(1_800_000)]);
      await setNow(client, at(T, 1799));
      expect(await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(1_000)]);
      // The timer is due: the sleeper is claimed, and the delayed start is next.
      await setNow(client, at(T, 1800));
      const woke = await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(woke)).toEqual([sleeper]);
      expect(sentinels(woke)).toEqual([sentinel(1_800_000)]); // at(T, 3600)
      await setNow(client, at(T, 3599));
      expect(await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(1_000)]);
      expect(await getRun(delayed)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
      await setNow(client, at(T, 3600));
      const started = await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(started)).toEqual([delayed]);
      expect(sentinels(started)).toEqual([sentinel(null)]);
    });
  });

  it('claims a WAITING run whose timer is due in a queue without limits (RUNNING, token + 1); with limits it wakes it into admission', async () => {
    await session(async (client) => {
      const T = '2074-01-01T00:00:00Z';
      const queue = newRunId('cb-timer');
      await setNow(client, at(T, 0));
      const runId = await startRun({ queue }, { s: 1 }, client);
      await claimOne(runId, 'wk-sleep-1', 30_000, client);
      await client.query(`select runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 60000}')`, [runId]);
      expect(await getRun(runId)).toMatchObject({ status: 'WAITING', wait_kind: 'timer', fencing_token: 1 });

      await setNow(client, at(T, 61));
      const rows = await claimBatch('wk-sleep-2', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(rows)).toEqual([runId]);
      expect(rows.find((r) => r.run_id === runId)).toMatchObject({
        input: { s: 1 },
        fencing_token: 2,
        recovery_attempts: 0,
        cancel_requested: false,
        // The wait step comes back with the claim: replay finds its timer passed.
        checkpoints: [[0, 'nap', 'WAITING', [expect.objectContaining({ spec: { timeout_ms: 60000 } })], null, 'sleep']],
      });
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-sleep-2', fencing_token: 2, wait_kind: null, wait_key: null, wake_at: null });
      expect(run?.lease_expires_at.toISOString()).toBe(at(T, 91));
      expect((await events(runId)).map((e) => e.kind)).toEqual(['created', 'claimed', 'wait_started', 'claimed']);
      expect((await events(runId)).at(-1)).toEqual({ kind: 'claimed', detail: { worker: 'wk-sleep-2' } });

      // In a queue with a concurrency limit of 1, whose slot another run holds, the due timer
      // only wakes the run: PENDING, waiting for admission, not claimed.
      const limited = newRunId('cb-timer-limited');
      await client.query(`select runledger.set_queue($1, '{"concurrency": 1}')`, [limited]);
      await setNow(client, at(T, 100));
      const sleeper = await startRun({ queue: limited }, {}, client);
      expect(claimedIds(await claimBatch('wk-sleep-1', [limited], ['w@1'], 5, { on: client }))).toEqual([sleeper]);
      await client.query(`select runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 60000}')`, [sleeper]);
      const holder = await startRun({ queue: limited }, {}, client);
      expect(claimedIds(await claimBatch('wk-sleep-1', [limited], ['w@1'], 5, { on: client }))).toEqual([holder]);
      await setNow(client, at(T, 161));
      expect(await claimBatch('wk-sleep-2', [limited], ['w@1'], 5, { on: client })).toEqual([sentinel(null)]);
      expect(await getRun(sleeper)).toMatchObject({ status: 'PENDING', admitted: false, wait_kind: null, wake_at: null, fencing_token: 1 });
      expect((await events(sleeper)).map((e) => e.kind)).toEqual(['created', 'claimed', 'wait_started', 'woken']);
    });
  });

  it('ends a PENDING run past its deadline TERMINATED (DEADLINE) instead of claiming it', async () => {
    await session(async (client) => {
      const T = '2075-01-01T00:00:00Z';
      const queue = newRunId('cb-deadline');
      await setNow(client, at(T, 0));
      const late = await startRun({ queue, deadline: '1 minute' }, {}, client);
      const onTime = await startRun({ queue, deadline: '1 hour' }, {}, client);

      await setNow(client, at(T, 120));
      const rows = await claimBatch('wk-dl', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(rows)).toEqual([onTime]);
      const run = await getRun(late);
      expect(run).toMatchObject({ status: 'TERMINATED', termination_reason: 'DEADLINE', lease_owner: null, fencing_token: 0 });
      expect(run?.finished_at.toISOString()).toBe(at(T, 120));
      expect(new Date(run?.termination_evidence.deadline_at).toISOString()).toBe(at(T, 60));
      expect(new Date(run?.termination_evidence.noticed_at).toISOString()).toBe(at(T, 120));
      expect((await events(late)).map((e) => e.kind)).toEqual(['created', 'deadline']);
      expect(await claimedEvents([late])).toEqual([]);
    });
  });

  it('writes the DEADLINE evidence of the deadline sweep: deadline_at, noticed_at, was and wait_kind', async () => {
    await session(async (client) => {
      const T = '2075-03-01T00:00:00Z';
      const queue = newRunId('cb-dl-evidence');
      await setNow(client, at(T, 0));
      const waiting = await startRun({ queue, deadline: '1 minute' }, {}, client);
      expect(claimedIds(await claimBatch('wk-dl-ev', [queue], ['w@1'], 5, { on: client }))).toEqual([waiting]);
      await client.query(`select runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 3600000}')`, [waiting]);
      const pending = await startRun({ queue, deadline: '1 minute' }, {}, client);

      await setNow(client, at(T, 120));
      expect(claimedIds(await claimBatch('wk-dl-ev', [queue], ['w@1'], 5, { on: client }))).toEqual([]);
      const evidence = async (runId: string) => {
        const run = await getRun(runId);
        expect(run).toMatchObject({ status: 'TERMINATED', termination_reason: 'DEADLINE' });
        const { deadline_at, noticed_at, ...rest } = run?.termination_evidence ?? {};
        return { deadline_at: new Date(deadline_at).toISOString(), noticed_at: new Date(noticed_at).toISOString(), ...rest };
      };
      expect(await evidence(waiting)).toEqual({ deadline_at: at(T, 60), noticed_at: at(T, 120), was: 'WAITING', wait_kind: 'timer' });
      expect(await evidence(pending)).toEqual({ deadline_at: at(T, 60), noticed_at: at(T, 120), was: 'PENDING', wait_kind: null });

      // The sweep's evidence for the same situation has the same fields.
      const swept = await startRun({ queue, deadline: '1 minute' }, {}, client);
      await setNow(client, at(T, 240));
      await client.query('select runledger._enforce_deadlines()');
      expect(await evidence(swept)).toEqual({ deadline_at: at(T, 180), noticed_at: at(T, 240), was: 'PENDING', wait_kind: null });
    });
  });

  // Runs past their deadline are terminated at most p_limit per queue and call; the ones left
  // over must still never be claimed (a run past its deadline is never put back to work).
  it('claims no run past its deadline, however many of them there are', async () => {
    await session(async (client) => {
      const T = '2075-06-01T00:00:00Z';
      const queue = newRunId('cb-deadlines');
      await setNow(client, at(T, 0));
      const runIds = [await startRun({ queue, deadline: '1 minute' }, {}, client), await startRun({ queue, deadline: '1 minute' }, {}, client)];

      await setNow(client, at(T, 120));
      const rows = await claimBatch('wk-dl', [queue], ['w@1'], 1, { on: client });
      expect(claimedIds(rows)).toEqual([]);
      const statuses = await db.pool.query(`select run_id, status from runledger.runs where run_id = any($1) order by run_id`, [runIds]);
      for (const row of statuses.rows) expect(['PENDING', 'TERMINATED'], row.run_id).toContain(row.status);
      expect(await claimedEvents(runIds)).toEqual([]);
    });
  });

  it('claims a CANCELLING run without an owner (compensations to run) and says so with cancel_requested', async () => {
    await session(async (client) => {
      const T = '2076-01-01T00:00:00Z';
      const queue = newRunId('cb-cancel');
      await setNow(client, at(T, 0));
      const runId = await startRun({ queue }, {}, client);
      const { fencing_token } = await claimOne(runId, 'wk-saga-1', 30_000, client);
      // A compensable operation succeeded, then the run was given back.
      const op = await client.query(
        `select operation_id from runledger._operation_begin($1, $2, 0, 'charge', $3, true, false)`,
        [runId, fencing_token, `charge-${runId}`],
      );
      await client.query(`select runledger._operation_finish($1, $2, $3, 'SUCCEEDED', '{"charged": 1}', null, null, null)`, [
        runId,
        fencing_token,
        op.rows[0].operation_id,
      ]);
      await checkpoint(runId, fencing_token, 0, 'charge', { output: { charged: 1 }, on: client });
      await client.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, fencing_token]);

      const cancel = await notified(() => client.query(`select runledger.cancel_run($1, 'changed my mind') as status`, [runId]));
      expect(cancel.result.rows[0].status).toBe('CANCELLING');
      expect(cancel.payloads).toEqual([queue]);
      expect(await getRun(runId)).toMatchObject({ status: 'CANCELLING', lease_owner: null, fencing_token: 1 });

      await setNow(client, at(T, 5));
      const rows = await claimBatch('wk-saga-2', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(rows)).toEqual([runId]);
      expect(rows.find((r) => r.run_id === runId)).toMatchObject({
        fencing_token: 2,
        cancel_requested: true,
        checkpoints: [[0, 'charge', 'SUCCEEDED', [{ charged: 1 }], null, 'step']],
      });
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'CANCELLING', lease_owner: 'wk-saga-2', fencing_token: 2, cancel_reason: 'changed my mind' });
      expect(run?.lease_expires_at.toISOString()).toBe(at(T, 35));
      expect((await events(runId)).at(-1)).toEqual({ kind: 'claimed', detail: { worker: 'wk-saga-2' } });
      // It has an owner now: nobody else claims it.
      expect(await claimBatch('wk-saga-3', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(null)]);
    });
  });

  it('with p_reclaim_except takes back first this worker\'s RUNNING runs it is not executing, with a new token, never another worker\'s', async () => {
    await session(async (client) => {
      const T = '2077-01-01T00:00:00Z';
      const queue = newRunId('cb-reclaim');
      await setNow(client, at(T, 0));
      const executing = await startRun({ queue }, {}, client);
      const lost = await startRun({ queue }, {}, client);
      const theirs = await startRun({ queue }, {}, client);
      expect(claimedIds(await claimBatch('wk-re', [queue], ['w@1'], 2, { on: client })).sort()).toEqual([executing, lost].sort());
      expect(claimedIds(await claimBatch('wk-re-other', [queue], ['w@1'], 2, { on: client }))).toEqual([theirs]);
      await checkpoint(lost, 1, 0, 'a', { output: 'kept', on: client });
      // Without p_reclaim_except a worker's own RUNNING runs are not claimed again.
      expect(await claimBatch('wk-re', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(null)]);

      const fresh = await startRun({ queue }, {}, client);
      await setNow(client, at(T, 10));
      // Limit 1: the lost claim is taken back before the PENDING run.
      const reclaimed = await claimBatch('wk-re', [queue], ['w@1'], 1, { on: client, reclaimExcept: [executing] });
      expect(reclaimed).toEqual([
        {
          run_id: lost,
          workflow_name: 'w',
          workflow_version: '1',
          input: {},
          fencing_token: 2,
          recovery_attempts: 0,
          cancel_requested: false,
          checkpoints: [[0, 'a', 'SUCCEEDED', ['kept'], null, 'step']],
          next_due_in_ms: null,
        },
      ]);
      expect(await getRun(lost)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-re', fencing_token: 2 });
      expect((await getRun(lost))?.lease_expires_at.toISOString()).toBe(at(T, 40));
      expect(await getRun(executing)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-re', fencing_token: 1 });
      expect(await getRun(theirs)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-re-other', fencing_token: 1 });
      expect(await getRun(fresh)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
      // The earlier claim's token is stale now.
      expect(await sqlState(checkpoint(lost, 1, 1, 'b', { on: client }))).toBe('RL001');
      expect((await events(lost)).map((e) => e.kind)).toEqual(['created', 'claimed', 'claimed']);

      // Another worker reclaiming (nothing excepted) never gets runs it does not own: only the PENDING one.
      const thief = await claimBatch('wk-re-thief', [queue], ['w@1'], 5, { on: client, reclaimExcept: [] });
      expect(claimedIds(thief)).toEqual([fresh]);
      expect(await getRun(theirs)).toMatchObject({ lease_owner: 'wk-re-other', fencing_token: 1 });
      expect(await getRun(executing)).toMatchObject({ lease_owner: 'wk-re', fencing_token: 1 });
      expect(await getRun(lost)).toMatchObject({ lease_owner: 'wk-re', fencing_token: 2 });
    });
  });

  it('raises RL003 for a limit below 1 (or none) and claims nothing', async () => {
    const queue = newRunId('cb-limit');
    const runId = await startRun({ queue });
    for (const limit of [0, -1, null]) expect(await sqlState(claimBatch('wk-limit', [queue], ['w@1'], limit)), String(limit)).toBe('RL003');
    expect(await getRun(runId)).toMatchObject({ status: 'PENDING', lease_owner: null, fencing_token: 0 });
    expect((await events(runId)).map((e) => e.kind)).toEqual(['created']);
  });

  it('raises RL003 for null queues or workflows and claims nothing', async () => {
    const queue = newRunId('cb-null');
    const runId = await startRun({ queue });
    const raw = (queues: string[] | null, workflows: string[] | null) =>
      db.pool.query(`select * from runledger._claim_batch('wk-null', $1, $2, 5, 30000)`, [queues, workflows]);
    expect(await sqlState(raw(null, ['w@1']))).toBe('RL003');
    expect(await sqlState(raw([queue], null))).toBe('RL003');
    expect(await getRun(runId)).toMatchObject({ status: 'PENDING', lease_owner: null, fencing_token: 0 });
  });
});
