import { afterEach, describe, expect, it } from 'vitest';
import pg from 'pg';
import type { Worker } from '../../../src/index.js';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { claimRun } from '../../helpers/claim.js';

const t = useTestEngine({
  prepare: async (db) => {
    await db.pool.query('create table executed (run_id text, step text, at timestamptz default clock_timestamp())');
  },
});
const { db } = t;

const workers: Worker[] = [];

afterEach(async () => {
  for (const w of workers.splice(0)) await w.stop();
});

async function worker(queue: string): Promise<Worker> {
  const w = await t.engine.runWorker({ queues: [queue], concurrency: 4, leaseMs: 2_000, pollIntervalMs: 100 });
  workers.push(w);
  return w;
}

const mark = (runId: string, step: string) => db.pool.query('insert into executed (run_id, step) values ($1, $2)', [runId, step]);
const executed = async (runId: string) =>
  (await db.pool.query('select step from executed where run_id = $1 order by at', [runId])).rows.map((r) => r.step);
const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const eventKinds = async (runId: string) =>
  (await db.pool.query('select kind from runledger.events where run_id = $1 order by event_id', [runId])).rows.map((r) => r.kind);

/** A session whose clock is moved with runledger.fake_now: deadline tests never sleep. */
async function withClock<T>(at: Date, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    await client.query(`select set_config('runledger.fake_now', $1, false)`, [at.toISOString()]);
    return await fn(client);
  } finally {
    await client.end();
  }
}

describe('deadline', () => {
  it('a run WAITING past its deadline terminates exactly once with reason DEADLINE (clock moved, no sleep)', async () => {
    const wf = t.engine.workflow({ name: 'patient', queue: 'deadline-wait', limits: { deadline: '1d' } }, async (ctx) => {
      await ctx.waitForSignal('never-comes'); // no timeout: only the deadline can end this wait
      return 'unreachable';
    });
    await worker('deadline-wait');
    const handle = await t.engine.start(wf, undefined);
    await waitFor('waiting', async () => (await runRow(handle.runId)).status === 'WAITING');
    const waiting = await runRow(handle.runId);
    expect(waiting.wake_at?.getTime()).toBe(waiting.deadline_at.getTime()); // the wait's wake-up is the deadline

    const later = new Date(waiting.deadline_at.getTime() + 60_000);
    const first = await withClock(later, async (c) => (await c.query('select runledger._enforce_deadlines() as n')).rows[0].n);
    const second = await withClock(later, async (c) => (await c.query('select runledger._enforce_deadlines() as n')).rows[0].n);
    expect([first, second]).toEqual([1, 0]);

    const run = await runRow(handle.runId);
    expect(run).toMatchObject({ status: 'TERMINATED', termination_reason: 'DEADLINE', wait_kind: null, lease_owner: null });
    expect(run.termination_evidence).toMatchObject({ was: 'WAITING', wait_kind: 'signal' });
    expect(new Date(run.termination_evidence.deadline_at).getTime()).toBe(waiting.deadline_at.getTime());
    expect(run.policy_version).toMatch(/^limits:/);
    expect((await eventKinds(handle.runId)).filter((k) => k === 'deadline')).toHaveLength(1);
    await expect(t.engine.signal(handle.runId, 'never-comes', 1)).rejects.toMatchObject({ code: 'INVALID_STATE' });
  });

  it('an executing run is stopped at its first checkpoint past the deadline; nothing commits after it', async () => {
    const wf = t.engine.workflow({ name: 'busy', queue: 'deadline-run' }, async (ctx) => {
      for (let i = 0; ; i++) {
        await ctx.step(`tick-${i}`, async () => {
          await mark(ctx.runId, `tick-${i}`);
          await new Promise((resolve) => setTimeout(resolve, 40));
          return i;
        });
      }
    });
    await worker('deadline-run');
    const handle = await t.engine.start(wf, undefined, { deadline: 400 });
    await expect(handle.result({ timeoutMs: 20_000 })).rejects.toMatchObject({
      details: { status: 'TERMINATED', terminationReason: 'DEADLINE' },
    });
    const run = await runRow(handle.runId);
    // Compared in SQL: deadline_at has microseconds, a JavaScript Date only milliseconds.
    const late = await db.pool.query(
      'select count(*)::int as n from runledger.steps s join runledger.runs r using (run_id) where s.run_id = $1 and s.finished_at > r.deadline_at',
      [handle.runId],
    );
    expect(late.rows[0].n).toBe(0);
    expect(run.terminated_at.getTime()).toBeGreaterThanOrEqual(run.deadline_at.getTime());
  });

  it('a pending run whose deadline passed before any worker took it is terminated, not run', async () => {
    const wf = t.engine.workflow({ name: 'too-late', queue: 'deadline-pending' }, async (ctx) => {
      await ctx.step('work', () => mark(ctx.runId, 'work').then(() => 1));
      return 'ran';
    });
    const handle = await t.engine.start(wf, undefined, { deadline: 1 });
    await waitFor(
      'deadline passed',
      async () =>
        (await db.pool.query('select runledger.now() > deadline_at as past from runledger.runs where run_id = $1', [handle.runId])).rows[0]
          .past,
    );
    await worker('deadline-pending');
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'DEADLINE' } });
    expect(await executed(handle.runId)).toEqual([]);
  });
});

describe('no progress', () => {
  it('a scripted model repeating an identical action stops with NO_PROGRESS well before maxSteps', async () => {
    const agent = t.engine.workflow(
      { name: 'looping-agent', queue: 'agents', limits: { noProgress: 3, maxSteps: 50 } },
      async (ctx, input: { query: string }) => {
        for (let turn = 0; ; turn++) {
          // The "model" keeps choosing the same search; the search keeps returning the same 20 results.
          const action = await ctx.step('think', () => ({ tool: 'search', query: input.query, turn }));
          await ctx.step('search', () => ({ query: action.query, results: Array.from({ length: 20 }, (_, i) => `doc-${i}`) }));
        }
      },
    );
    await worker('agents');
    const handle = await t.engine.start(agent, { query: 'A' });
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'TERMINATED', terminationReason: 'NO_PROGRESS' } });
    const run = await runRow(handle.runId);
    expect(run.termination_evidence).toMatchObject({ step: 'search', repeats: 3, limit: 3, seqs: [1, 3, 5] });
    expect(run.termination_evidence.result_hash).toMatch(/^[0-9a-f]{32}$/);
    const steps = await db.pool.query('select count(*)::int as n from runledger.steps where run_id = $1', [handle.runId]);
    expect(steps.rows[0].n).toBe(6); // well before maxSteps (50)
  });

  it('results that change are progress: the same limit does not stop them', async () => {
    const agent = t.engine.workflow({ name: 'learning-agent', queue: 'agents', limits: { noProgress: 3 } }, async (ctx) => {
      for (let turn = 0; turn < 5; turn++) await ctx.step('search', () => ({ results: [`new-${turn}`] }));
      return 'learned';
    });
    await worker('agents');
    await expect((await t.engine.start(agent, undefined)).result()).resolves.toBe('learned');
  });
});

describe('max steps and budget', () => {
  it('maxSteps stops the run before the step past the limit starts', async () => {
    const wf = t.engine.workflow({ name: 'long', queue: 'limits', limits: { maxSteps: 3 } }, async (ctx) => {
      for (let i = 0; i < 10; i++) await ctx.step(`s${i}`, () => mark(ctx.runId, `s${i}`).then(() => i));
      return 'finished';
    });
    await worker('limits');
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'MAX_STEPS' } });
    expect(await executed(handle.runId)).toEqual(['s0', 's1', 's2']);
    const checkpoints = await db.pool.query('select name from runledger.steps where run_id = $1 order by seq', [handle.runId]);
    expect(checkpoints.rows.map((r) => r.name)).toEqual(['s0', 's1', 's2']); // every step that ran kept its result
    expect((await runRow(handle.runId)).termination_evidence).toEqual({ max_steps: 3, next_step: 's3', seq: 3 });
  });

  it('a per-run override of maxSteps wins over the workflow limit', async () => {
    const wf = t.engine.workflow({ name: 'long-override', queue: 'limits', limits: { maxSteps: 3 } }, async (ctx) => {
      for (let i = 0; i < 5; i++) await ctx.step(`s${i}`, () => i);
      return 'finished';
    });
    await worker('limits');
    await expect((await t.engine.start(wf, undefined, { maxSteps: 10 })).result()).resolves.toBe('finished');
  });

  it('a charge over the budget ends the run with BUDGET, atomically with the step that spent it', async () => {
    const wf = t.engine.workflow({ name: 'spender', queue: 'limits', limits: { budget: 100 } }, async (ctx) => {
      for (let i = 0; i < 10; i++) {
        await ctx.step(`llm-${i}`, async () => {
          await mark(ctx.runId, `llm-${i}`);
          ctx.charge(40); // tokens used by this call
          return `answer ${i}`;
        });
      }
      return 'done';
    });
    await worker('limits');
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'BUDGET' } });
    const run = await runRow(handle.runId);
    expect(run.termination_evidence).toEqual({
      dimension: 'units',
      limit: 100,
      budget: 100,
      spent: 120,
      charge: 40,
      step: 'llm-2',
      seq: 2,
    });
    expect(Number(run.budget_spent)).toBe(120);
    expect(await executed(handle.runId)).toEqual(['llm-0', 'llm-1', 'llm-2']);
    const checkpoints = await db.pool.query('select name from runledger.steps where run_id = $1 order by seq', [handle.runId]);
    expect(checkpoints.rows.map((r) => r.name)).toEqual(['llm-0', 'llm-1', 'llm-2']); // the spending step is recorded
  });
});

describe('compensations of a terminated run', () => {
  const compensable = (name: string, undone: string[]) => ({
    compensate: ({ idempotencyKey }: { idempotencyKey: string }) => void undone.push(`${name} ${idempotencyKey}`),
  });
  const compensationStatus = async (runId: string) =>
    (await db.pool.query('select name, compensation_status from runledger.operations where run_id = $1 order by seq', [runId])).rows;

  it('MAX_STEPS: what the run did is undone, newest first, once each', async () => {
    const undone: string[] = [];
    const wf = t.engine.workflow({ name: 'limited-saga', queue: 'limits', limits: { maxSteps: 3 } }, async (ctx) => {
      await ctx.operation('reserve', { idempotencyKey: `r-${ctx.runId}`, ...compensable('reserve', undone) }, async () => 'r');
      await ctx.operation('charge', { idempotencyKey: `c-${ctx.runId}`, ...compensable('charge', undone) }, async () => 'c');
      for (let i = 0; i < 10; i++) await ctx.step(`s${i}`, () => i);
      return 'finished';
    });
    await worker('limits');
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'TERMINATED', terminationReason: 'MAX_STEPS' } });
    await waitFor('compensated', async () => (await compensationStatus(handle.runId)).every((o) => o.compensation_status === 'DONE'));
    expect(undone).toEqual([`charge c-${handle.runId}:compensate`, `reserve r-${handle.runId}:compensate`]);
    expect(await eventKinds(handle.runId)).toEqual(expect.arrayContaining(['max_steps', 'compensation_started', 'compensated']));
  });

  it('BUDGET (ended by the checkpoint that spent it): the operation before it is undone', async () => {
    const undone: string[] = [];
    const wf = t.engine.workflow({ name: 'spending-saga', queue: 'limits', limits: { budget: 10 } }, async (ctx) => {
      await ctx.operation('book', { idempotencyKey: `b-${ctx.runId}`, ...compensable('book', undone) }, async () => 'b');
      await ctx.step('llm', async () => {
        ctx.charge(40);
        return 'answer';
      });
      await ctx.step('never', () => 'not reached');
      return 'done';
    });
    await worker('limits');
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'TERMINATED', terminationReason: 'BUDGET' } });
    await waitFor('compensated', async () => (await compensationStatus(handle.runId))[0]?.compensation_status === 'DONE');
    expect(undone).toEqual([`book b-${handle.runId}:compensate`]);
  });
});

describe('cancellation', () => {
  it('cancel while a step runs: no new step starts, the in-flight result is kept, children are cancelled, the run ends CANCELLED', async () => {
    const child = t.engine.workflow({ name: 'helper-child', queue: 'cancel' }, async (ctx) => ctx.waitForSignal('go'));
    const wf = t.engine.workflow({ name: 'cancellable', queue: 'cancel' }, async (ctx) => {
      await ctx.step('a', () => mark(ctx.runId, 'a').then(() => 1));
      await ctx.startChild(child, undefined);
      const slow = await ctx.step('slow', async ({ signal }) => {
        await mark(ctx.runId, 'slow');
        // Long work that stops promptly when the run is cancelled.
        await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
        return 'stopped early';
      });
      await ctx.step('c', () => mark(ctx.runId, 'c').then(() => slow));
      return 'unreachable';
    });
    await worker('cancel');
    const handle = await t.engine.start(wf, undefined);
    await waitFor('slow step running', async () => (await executed(handle.runId)).includes('slow'));
    const childId = `${handle.runId}.1`;
    await waitFor('child waiting', async () => (await runRow(childId))?.status === 'WAITING');

    const answer = await db.pool.query(`select runledger.cancel_run($1, 'customer asked') as status`, [handle.runId]);
    expect(answer.rows[0].status).toBe('CANCELLING');
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'CANCELLED', terminationReason: 'CANCELLED' } });

    expect(await executed(handle.runId)).toEqual(['a', 'slow']);
    const steps = await db.pool.query(`select name, status, output from runledger.steps where run_id = $1 order by seq`, [handle.runId]);
    expect(steps.rows).toEqual([
      { name: 'a', status: 'SUCCEEDED', output: 1 },
      { name: 'child:helper-child:start', status: 'SUCCEEDED', output: { runId: childId } },
      { name: 'slow', status: 'SUCCEEDED', output: 'stopped early' },
    ]);
    const run = await runRow(handle.runId);
    expect(run.termination_evidence).toMatchObject({ reason: 'customer asked', steps: 3 });
    expect(await runRow(childId)).toMatchObject({ status: 'CANCELLED', termination_reason: 'CANCELLED' });
    const kinds = await eventKinds(handle.runId);
    expect(kinds.indexOf('cancel_requested')).toBeLessThan(kinds.indexOf('cancelled'));
  });

  it('a PENDING or WAITING run is cancelled at once; a finished run is left alone; an unknown run is NOT_FOUND', async () => {
    const wf = t.engine.workflow({ name: 'idle', queue: 'cancel-idle' }, async (ctx) => ctx.sleep('long', '1h'));
    const pending = await t.engine.start(wf, undefined); // no worker serves this queue yet
    await expect(t.engine.cancel(pending.runId, { reason: 'not needed' })).resolves.toBe('CANCELLED');
    // No worker claims it any more: a claim for its queue and workflow (rolled back) finds nothing.
    const cancelled = await runRow(pending.runId);
    expect(cancelled).toMatchObject({ status: 'CANCELLED', termination_reason: 'CANCELLED', lease_owner: null });
    const probe = await db.pool.connect();
    try {
      await probe.query('begin');
      const claim = await probe.query(`select run_id, next_due_in_ms from runledger._claim_batch('wk-probe', $1, $2, 100, 30000)`, [
        [cancelled.queue_name],
        [`${cancelled.workflow_name}@${cancelled.workflow_version}`],
      ]);
      expect(claim.rows).toEqual([{ run_id: null, next_due_in_ms: null }]); // only the sentinel row: nothing claimable, nothing due
      await probe.query('rollback');
    } finally {
      probe.release();
    }

    await worker('cancel-idle');
    const sleeping = await t.engine.start(wf, undefined);
    await waitFor('sleeping', async () => (await runRow(sleeping.runId)).status === 'WAITING');
    await expect(t.engine.cancel(sleeping.runId)).resolves.toBe('CANCELLED');
    expect(await runRow(sleeping.runId)).toMatchObject({
      status: 'CANCELLED',
      wake_at: null,
      termination_evidence: expect.objectContaining({ was: 'WAITING' }),
    });
    await expect(t.engine.cancel(sleeping.runId)).resolves.toBe('CANCELLED'); // no-op answer, not an error
    await expect(t.engine.cancel('nobody')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });

  it('a CANCELLING run whose worker died is completed as CANCELLED by recovery, not resumed', async () => {
    await db.pool.query(`select runledger._register_workflow('orphan-cancel', '1', 'nobody-serves', 3)`);
    const runId = (await db.pool.query(`select runledger.start_run('orphan-cancel', '{}') as id`)).rows[0].id;
    await claimRun(db, runId, { worker: 'dead-worker', leaseMs: 1000 });
    expect((await db.pool.query(`select runledger.cancel_run($1, 'stop') as s`, [runId])).rows[0].s).toBe('CANCELLING');
    const later = new Date(Date.now() + 60_000);
    await withClock(later, (c) => c.query('select runledger._recover_expired()'));
    expect(await runRow(runId)).toMatchObject({ status: 'CANCELLED', termination_reason: 'CANCELLED', lease_owner: null });
    expect((await runRow(runId)).termination_evidence).toMatchObject({
      reason: 'stop',
      completed_by: 'recovery',
      last_owner: 'dead-worker',
    });
  });
});

describe('why did my runs stop', () => {
  it('one query answers it: every terminal run has a reason', async () => {
    const result = await db.pool.query(
      `select termination_reason, count(*)::int as n from runledger.runs where runledger.is_terminal(status) group by 1 order by 1`,
    );
    const reasons = result.rows.map((r) => r.termination_reason);
    expect(reasons).toEqual(expect.arrayContaining(['BUDGET', 'CANCELLED', 'COMPLETED', 'DEADLINE', 'MAX_STEPS', 'NO_PROGRESS']));
    expect(reasons).not.toContain(null);
  });
});
