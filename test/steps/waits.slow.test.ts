import { describe, expect, it } from 'vitest';
import { RunFailedError, type Worker } from '../../src/index.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';

const t = useTestEngine({ fixtures: true });
const { db } = t;

const { processes: spawned, workers } = stoppedAfterEach();

async function inProcessWorker(queues: string[], concurrency = 4): Promise<Worker> {
  const w = await t.engine.runWorker({ queues, concurrency, leaseMs: 2_000, pollIntervalMs: 100 });
  workers.push(w);
  return w;
}

async function processWorker(): Promise<WorkerProcess> {
  const w = await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '1000', CONCURRENCY: '4' });
  spawned.push(w);
  return w;
}

const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const executions = async (runId: string) =>
  Object.fromEntries(
    (await db.pool.query('select step, count(*)::int as n from step_executions where run_id = $1 group by 1', [runId])).rows.map((r) => [
      r.step,
      r.n,
    ]),
  );

describe('ctx.sleep', () => {
  it('a run sleeping when its worker is killed stays WAITING (not RUNNING) and another worker finishes it', async () => {
    const handle = await t.engine.start(t.fixtures.napper, { ms: 1_500 });
    const first = await processWorker();
    await waitFor('run sleeping', async () => (await runRow(handle.runId)).status === 'WAITING');
    first.kill('SIGKILL');
    await first.exited;

    const sleeping = await runRow(handle.runId);
    expect(sleeping).toMatchObject({ status: 'WAITING', wait_kind: 'timer', lease_owner: null, lease_expires_at: null });
    expect(sleeping.wake_at.getTime()).toBeGreaterThan(sleeping.updated_at.getTime());
    const waitingView = await db.pool.query('select wait_kind, waiting_for, step_name from runledger.waiting where run_id = $1', [
      handle.runId,
    ]);
    expect(waitingView.rows).toEqual([{ wait_kind: 'timer', waiting_for: 'timer', step_name: 'nap' }]);

    await processWorker();
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('rested');
    expect(await executions(handle.runId)).toEqual({ before: 1, after: 1 });
    const run = await t.engine.getRun(handle.runId);
    expect(run?.recoveryAttempts).toBe(0); // sleeping is not a crash: nothing to recover
    expect(run?.steps?.map((s) => [s.name, s.kind, s.status])).toEqual([
      ['before', 'step', 'SUCCEEDED'],
      ['nap', 'sleep', 'SUCCEEDED'],
      ['after', 'step', 'SUCCEEDED'],
    ]);
  });
});

describe('signals', () => {
  it('the same signal_id sent three times concurrently is accepted once and consumed once', async () => {
    const wf = t.engine.workflow({ name: 'listener', queue: 'signals' }, async (ctx) => {
      const first = await ctx.waitForSignal<{ n: number }>('ping');
      const second = await ctx.waitForSignal<{ n: number }>('ping', { timeout: 300 });
      return { first, second };
    });
    await inProcessWorker(['signals']);
    const handle = await t.engine.start(wf, undefined);
    await waitFor('waiting for ping', async () => (await runRow(handle.runId)).wait_kind === 'signal');
    const accepted = await Promise.all([1, 2, 3].map(() => t.engine.signal(handle.runId, 'ping', { n: 1 }, { signalId: 'sig-1' })));
    expect(accepted.filter(Boolean)).toHaveLength(1);
    await expect(handle.result()).resolves.toEqual({ first: { n: 1 }, second: null });
    const inbox = await db.pool.query('select signal_id, consumed_seq from runledger.signals where run_id = $1', [handle.runId]);
    expect(inbox.rows).toEqual([{ signal_id: 'sig-1', consumed_seq: 0 }]);
  });

  it('a signal sent before the run waits is kept in the inbox and consumed by the wait', async () => {
    const wf = t.engine.workflow({ name: 'late-listener', queue: 'signals-late' }, async (ctx) => {
      await ctx.step('busy', async () => {
        await waitFor(
          'signal stored',
          async () => (await db.pool.query(`select 1 from runledger.signals where run_id = $1`, [ctx.runId])).rowCount === 1,
        );
        return 1;
      });
      return ctx.waitForSignal('reply');
    });
    await inProcessWorker(['signals-late']);
    const handle = await t.engine.start(wf, undefined);
    await waitFor('running', async () => (await runRow(handle.runId)).status === 'RUNNING');
    expect(await t.engine.signal(handle.runId, 'reply', 'early bird')).toBe(true);
    await expect(handle.result()).resolves.toBe('early bird');
  });

  it('a signal racing the timeout is consumed once or left in the inbox, never lost or consumed twice', async () => {
    const wf = t.engine.workflow({ name: 'racer', queue: 'signals-race' }, async (ctx) => ctx.waitForSignal('go', { timeout: 150 }));
    await inProcessWorker(['signals-race'], 8);
    const handles = await Promise.all(Array.from({ length: 20 }, () => t.engine.start(wf, undefined)));
    await Promise.all(
      handles.map(async (h, i) => {
        await new Promise((resolve) => setTimeout(resolve, 100 + (i % 10) * 10)); // around the timeout on purpose
        await t.engine.signal(h.runId, 'go', i).catch(() => undefined); // a run that already finished refuses: fine
      }),
    );
    const results = await Promise.all(handles.map((h) => h.result()));
    for (const [i, h] of handles.entries()) {
      const inbox = await db.pool.query('select consumed_seq from runledger.signals where run_id = $1', [h.runId]);
      if (results[i] === null) {
        // Timed out: the signal (if it arrived before the run finished) is still in the inbox, unconsumed.
        expect(inbox.rows.every((r) => r.consumed_seq === null)).toBe(true);
      } else {
        expect(results[i]).toBe(i);
        expect(inbox.rows).toEqual([{ consumed_seq: 0 }]);
      }
    }
  });

  it('with worker concurrency 1, runs waiting on signals do not block another run', async () => {
    const waiter = t.engine.workflow({ name: 'waiter', queue: 'one-slot' }, async (ctx) => ctx.waitForSignal('never'));
    const quick = t.engine.workflow({ name: 'quick', queue: 'one-slot' }, async (ctx) => ctx.step('q', () => 'quick done'));
    await inProcessWorker(['one-slot'], 1);
    const waiting = await Promise.all(Array.from({ length: 10 }, () => t.engine.start(waiter, undefined)));
    await waitFor('all waiting', async () => {
      const r = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'WAITING'`, [
        waiting.map((h) => h.runId),
      ]);
      return r.rows[0].n === 10;
    });
    await expect((await t.engine.start(quick, undefined)).result()).resolves.toBe('quick done');
    const held = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and lease_owner is not null`, [
      waiting.map((h) => h.runId),
    ]);
    expect(held.rows[0].n).toBe(0);
  });

  it('refuses signals for unknown or finished runs with coded errors', async () => {
    await expect(t.engine.signal('no-such-run', 'x', 1)).rejects.toMatchObject({ code: 'NOT_FOUND' });
    const done = t.engine.workflow({ name: 'done-already', queue: 'signals-done' }, async () => 'ok');
    // Waits for 'go', so the signal below reaches it before it can finish (it used to race a run that returned at once).
    const early = t.engine.workflow({ name: 'early-finish', queue: 'signals-done' }, async (ctx) => {
      await ctx.waitForSignal('go');
      return 'ok';
    });
    await inProcessWorker(['signals-done']);
    const handle = await t.engine.start(done, undefined);
    await handle.result();
    await expect(t.engine.signal(handle.runId, 'x', 1)).rejects.toMatchObject({ code: 'INVALID_STATE' });
    // A retry of a signal accepted earlier gets the same answer as before, even now.
    const other = await t.engine.start(early, undefined);
    expect(await t.engine.signal(other.runId, 'x', 1, { signalId: 'retry-me' })).toBe(true);
    await t.engine.signal(other.runId, 'go', null);
    await other.result();
    expect(await t.engine.signal(other.runId, 'x', 1, { signalId: 'retry-me' })).toBe(false);
    await expect(t.engine.signal(handle.runId, 'bad topic!', 1)).rejects.toMatchObject({ code: 'INVALID_INPUT' });
  });
});

describe('approvals', () => {
  const approvalFlow = () =>
    t.engine.workflow(
      { name: `approval-${Math.random().toString(36).slice(2, 8)}`, queue: 'approvals' },
      async (ctx, input: { timeout?: number }) => {
        const decision = await ctx.requestApproval('manager-ok', {
          action: 'refund',
          evidence: { amount: 120 },
          approvers: ['alice', 'bob'],
          ...(input.timeout ? { timeout: input.timeout } : {}),
        });
        return decision === null ? 'expired' : decision.approved ? `approved by ${decision.decidedBy}` : 'rejected';
      },
    );

  async function pendingRequest(runId: string): Promise<string> {
    return waitFor('approval requested', async () => {
      const r = await db.pool.query('select request_id from runledger.approval_inbox where run_id = $1', [runId]);
      return r.rows[0]?.request_id as string | undefined;
    });
  }

  it('an allowed approver decides; a refused approver gets NOT_ALLOWED; a second decision changes nothing', async () => {
    const wf = approvalFlow();
    await inProcessWorker(['approvals']);
    const handle = await t.engine.start(wf, {});
    const requestId = await pendingRequest(handle.runId);
    const inbox = await db.pool.query('select action, evidence, approvers from runledger.approval_inbox where request_id = $1', [
      requestId,
    ]);
    expect(inbox.rows).toEqual([{ action: 'refund', evidence: { amount: 120 }, approvers: ['alice', 'bob'] }]);
    expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', wait_kind: 'approval', wait_key: requestId, lease_owner: null });

    await expect(t.engine.decideApproval(requestId, { approved: true, decidedBy: 'mallory' })).rejects.toMatchObject({
      code: 'NOT_ALLOWED',
    });
    const first = await t.engine.decideApproval(requestId, { approved: true, decidedBy: 'alice', note: 'fine' });
    expect(first).toMatchObject({ recorded: true, approved: true, decidedBy: 'alice', note: 'fine' });
    const second = await t.engine.decideApproval(requestId, { approved: false, decidedBy: 'bob' });
    expect(second).toMatchObject({ recorded: false, approved: true, decidedBy: 'alice' });
    await expect(handle.result()).resolves.toBe('approved by alice');
    const audit = await db.pool.query(
      'select decision, decided_by, note, decided_at is not null as dated from runledger.approvals where request_id = $1',
      [requestId],
    );
    expect(audit.rows).toEqual([{ decision: true, decided_by: 'alice', note: 'fine', dated: true }]);
  });

  it('decided from SQL with runledger.decide_approval, a rejection reaches the workflow', async () => {
    const wf = approvalFlow();
    await inProcessWorker(['approvals']);
    const handle = await t.engine.start(wf, {});
    const requestId = await pendingRequest(handle.runId);
    const decided = await db.pool.query(`select runledger.decide_approval($1, false, 'bob', 'too much') as d`, [requestId]);
    expect(decided.rows[0].d).toMatchObject({ recorded: true, approved: false, decided_by: 'bob' });
    await expect(handle.result()).resolves.toBe('rejected');
  });

  it('an undecided request expires: the wait returns null and a late decision is refused', async () => {
    const wf = approvalFlow();
    await inProcessWorker(['approvals']);
    const handle = await t.engine.start(wf, { timeout: 200 });
    const requestId = await waitFor('request stored', async () => {
      const r = await db.pool.query('select request_id from runledger.approvals where run_id = $1', [handle.runId]);
      return r.rows[0]?.request_id as string | undefined;
    });
    await expect(handle.result()).resolves.toBe('expired');
    await expect(t.engine.decideApproval(requestId, { approved: true, decidedBy: 'alice' })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
  });

  it('a request of a run that was cancelled meanwhile cannot be decided', async () => {
    const wf = approvalFlow();
    await inProcessWorker(['approvals']);
    const handle = await t.engine.start(wf, {});
    const requestId = await pendingRequest(handle.runId);
    await t.engine.cancel(handle.runId);
    await expect(t.engine.decideApproval(requestId, { approved: true, decidedBy: 'alice' })).rejects.toMatchObject({
      code: 'INVALID_STATE',
    });
  });
});

describe('child workflows', () => {
  it('the parent waits holding nothing and gets the child result once', async () => {
    await inProcessWorker(['default']);
    const handle = await t.engine.start(t.fixtures.parent, { ms: 300 });
    const childId = `${handle.runId}.1`;
    await waitFor('parent waiting for child', async () => (await runRow(handle.runId)).wait_kind === 'child');
    expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', wait_key: childId, lease_owner: null });
    expect(await runRow(childId)).toMatchObject({ parent_run_id: handle.runId });
    await expect(handle.result()).resolves.toBe('kid done');
    expect(await executions(handle.runId)).toEqual({ prepare: 1, finish: 1 });
    expect(await executions(childId)).toEqual({ work: 1 });
  });

  it("a child's failure reaches the parent as CHILD_FAILED", async () => {
    await inProcessWorker(['default']);
    const handle = await t.engine.start(t.fixtures.parent, { ms: 10, fail: true });
    await expect(handle.result()).resolves.toMatch(/^caught CHILD_FAILED: child run .* ended FAILED/);
    const child = await t.engine.getRun(`${handle.runId}.1`);
    expect(child?.status).toBe('FAILED');
  });

  it("the parent's worker crashing while the child runs loses nothing and starts no second child", async () => {
    const handle = await t.engine.start(t.fixtures.parent, { ms: 1_500 });
    const childId = `${handle.runId}.1`;
    const first = await processWorker();
    await waitFor('child working', async () => (await executions(childId)).work === 1);
    first.kill('SIGKILL');
    await first.exited;
    await processWorker();
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('kid done');
    expect(await executions(handle.runId)).toEqual({ prepare: 1, finish: 1 });
    const children = await db.pool.query('select run_id from runledger.runs where parent_run_id = $1', [handle.runId]);
    expect(children.rows).toEqual([{ run_id: childId }]);
    expect(await executions(childId)).toEqual({ work: 2 }); // the child's step was in flight in the killed worker
  });
});

describe('replay of values', () => {
  it('a step returning null gets null on replay too, and undefined stays undefined', async () => {
    const wf = t.engine.workflow({ name: 'nulls', queue: 'nulls' }, async (ctx) => {
      const a = await ctx.step('null', () => null);
      const b = await ctx.step('undefined', () => undefined);
      await ctx.sleep('replay-now', 1); // forces a second execution that replays both steps
      return { a, b: b === undefined ? 'undefined' : b };
    });
    await inProcessWorker(['nulls']);
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toEqual({ a: null, b: 'undefined' });
  });

  it('a run started on another queue than its workflow default is served by workers of that queue', async () => {
    const wf = t.engine.workflow({ name: 'movable', queue: 'home' }, async (ctx) => ctx.step('where', () => 'ran'));
    await inProcessWorker(['elsewhere']);
    const handle = await t.engine.start(wf, undefined, { queue: 'elsewhere' });
    await expect(handle.result()).resolves.toBe('ran');
    expect((await t.engine.getRun(handle.runId))?.queueName).toBe('elsewhere');
  });
});

describe('failed results', () => {
  it('result() of a run that fails rejects with RunFailedError carrying the stored error', async () => {
    const wf = t.engine.workflow({ name: 'fails', queue: 'fails' }, async () => {
      throw new Error('bad day');
    });
    await inProcessWorker(['fails']);
    const error = await (await t.engine.start(wf, undefined)).result().catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RunFailedError);
    expect((error as RunFailedError).details).toMatchObject({ status: 'FAILED', error: { message: 'bad day' } });
  });
});
