import { describe, expect, it } from 'vitest';
import { RunFailedError } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';

const t = useTestEngine({ fixtures: true, worker: { concurrency: 4, leaseMs: 2_000, pollIntervalMs: 100 } });
const { db } = t;

describe('a multi-step workflow with transaction steps', () => {
  it('completes, checkpoints every step once and writes its business rows exactly once', async () => {
    const handle = await t.engine.start(t.fixtures.order, { item: 'book', amount: 3 });
    await expect(handle.result()).resolves.toEqual({ charged: 300 });

    const run = await t.engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect(run?.terminationReason).toBe('COMPLETED');
    expect(run?.terminationEvidence).toEqual({ steps: 4, budget_spent: 0 });
    expect(run?.steps?.map((s) => [s.seq, s.name, s.kind, s.status])).toEqual([
      [0, 'load', 'step', 'SUCCEEDED'],
      [1, 'reserve', 'transaction', 'SUCCEEDED'],
      [2, 'charge', 'step', 'SUCCEEDED'],
      [3, 'ship', 'transaction', 'SUCCEEDED'],
    ]);
    const orders = await db.pool.query('select item, amount from orders where run_id = $1 order by item', [handle.runId]);
    expect(orders.rows).toEqual([
      { item: 'book:reserved', amount: 3 },
      { item: 'book:shipped', amount: 300 },
    ]);
    const executions = await db.pool.query(
      'select step, count(*)::int as n from step_executions where run_id = $1 group by step order by step',
      [handle.runId],
    );
    expect(executions.rows).toEqual([
      { step: 'charge', n: 1 },
      { step: 'load', n: 1 },
      { step: 'reserve', n: 1 },
      { step: 'ship', n: 1 },
    ]);
    const events = await db.pool.query('select kind from runledger.events where run_id = $1 order by event_id', [handle.runId]);
    expect(events.rows.map((e) => e.kind)).toEqual(['created', 'claimed', 'completed']);
  });

  it('returns stored values, so the first execution sees what a replay would', async () => {
    const wf = t.engine.workflow({ name: 'dates', queue: 'default' }, async (ctx) => {
      const value = await ctx.step('date', () => ({ at: new Date('2030-01-02T03:04:05Z') }));
      return typeof value.at;
    });
    const w = await t.engine.runWorker({ concurrency: 1, leaseMs: 2_000, queues: ['default'], pollIntervalMs: 100 });
    try {
      const handle = await t.engine.start(wf, undefined);
      await expect(handle.result()).resolves.toBe('string');
    } finally {
      await w.stop();
    }
  });
});

describe('step failures', () => {
  it('records a failed step, fails the run with the error, and retry_run runs only that step again', async () => {
    await db.pool.query(`insert into fault_switch values ('flaky', true) on conflict (name) do update set on_ = true`);
    const wf = t.engine.workflow({ name: 'flaky', queue: 'flaky' }, async (ctx) => {
      const a = await ctx.step('a', async () => {
        await db.pool.query(`insert into step_executions (run_id, step, pid) values ($1, 'a', 0)`, [ctx.runId]);
        return 1;
      });
      const b = await ctx.step('b', async () => {
        const fault = await db.pool.query(`select on_ from fault_switch where name = 'flaky'`);
        if (fault.rows[0].on_) throw Object.assign(new Error('upstream said no'), { code: 'UPSTREAM_NO' });
        return 2;
      });
      return a + b;
    });
    const w = await t.engine.runWorker({ concurrency: 1, queues: ['flaky'], leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      const handle = await t.engine.start(wf, undefined);
      const failure = await handle.result().catch((error: unknown) => error);
      expect(failure).toBeInstanceOf(RunFailedError);
      const run = await t.engine.getRun(handle.runId);
      expect(run?.status).toBe('FAILED');
      expect(run?.terminationReason).toBe('FAILED');
      expect(run?.error).toMatchObject({ name: 'StepFailedError', code: 'STEP_FAILED', message: 'step "b" failed: upstream said no' });
      expect(run?.steps?.[1]).toMatchObject({ name: 'b', status: 'FAILED', error: { message: 'upstream said no', code: 'UPSTREAM_NO' } });

      await db.pool.query(`update fault_switch set on_ = false where name = 'flaky'`);
      const retried = await db.pool.query('select runledger.retry_run($1) as status', [handle.runId]);
      expect(retried.rows[0].status).toBe('PENDING');
      await expect(handle.result()).resolves.toBe(3);
      const a = await db.pool.query(`select count(*)::int as n from step_executions where run_id = $1 and step = 'a'`, [handle.runId]);
      expect(a.rows[0].n).toBe(1);
      const events = await db.pool.query(`select detail from runledger.events where run_id = $1 and kind = 'retried'`, [handle.runId]);
      expect(events.rows[0].detail).toMatchObject({
        previous_status: 'FAILED',
        termination_reason: 'FAILED',
        dropped_failed_step: { seq: 1, name: 'b' },
      });
    } finally {
      await w.stop();
    }
  });

  it('a user try/catch around a failed step sees the same error on replay', async () => {
    const wf = t.engine.workflow({ name: 'caught', queue: 'caught' }, async (ctx) => {
      let seen = '';
      try {
        await ctx.step('fails', () => {
          throw new Error('nope');
        });
      } catch (error) {
        seen = (error as Error).message;
      }
      return ctx.step('after', () => seen);
    });
    const w = await t.engine.runWorker({ concurrency: 1, queues: ['caught'], leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      const handle = await t.engine.start(wf, undefined);
      await expect(handle.result()).resolves.toBe('step "fails" failed: nope');
    } finally {
      await w.stop();
    }
  });

  it('output that cannot be stored as JSON fails the step with OUTPUT_NOT_SERIALIZABLE, not a corrupt checkpoint', async () => {
    const wf = t.engine.workflow({ name: 'bigint', queue: 'bigint' }, async (ctx) => {
      await ctx.step('big', () => 10n as unknown as number);
      return 'unreachable';
    });
    const w = await t.engine.runWorker({ concurrency: 1, queues: ['bigint'], leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      const handle = await t.engine.start(wf, undefined);
      await expect(handle.result()).rejects.toBeInstanceOf(RunFailedError);
      const run = await t.engine.getRun(handle.runId);
      expect(run?.steps?.[0]).toMatchObject({ name: 'big', status: 'FAILED', output: null, error: { code: 'OUTPUT_NOT_SERIALIZABLE' } });
      expect((run?.steps?.[0]?.error as { message: string }).message).toMatch(/bigint/);
    } finally {
      await w.stop();
    }
  });
});

describe('non-determinism', () => {
  it('parks the run in DEAD_LETTER with NON_DETERMINISM when a step name differs from its checkpoint', async () => {
    let variant = 'first';
    const wf = t.engine.workflow({ name: 'shifty', queue: 'shifty' }, async (ctx) => {
      await ctx.step(variant === 'first' ? 'alpha' : 'beta', () => 1);
      await ctx.step('hold', async () => {
        await waitFor('release', async () => variant === 'second');
        return 2;
      });
      return 'done';
    });
    const w1 = await t.engine.runWorker({
      concurrency: 1,
      queues: ['shifty'],
      leaseMs: 2_000,
      pollIntervalMs: 100,
      shutdownTimeoutMs: 100,
    });
    const handle = await t.engine.start(wf, undefined);
    await waitFor('first checkpoint', async () => (await t.engine.getRun(handle.runId))?.steps?.length === 1);
    // The worker stops mid-run (its run is released), and the code changes before the next execution.
    await w1.stop();
    variant = 'second';
    const w2 = await t.engine.runWorker({ concurrency: 1, queues: ['shifty'], leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      await expect(handle.result()).rejects.toBeInstanceOf(RunFailedError);
      const run = await t.engine.getRun(handle.runId);
      expect(run?.status).toBe('DEAD_LETTER');
      expect(run?.terminationReason).toBe('NON_DETERMINISM');
      expect(run?.terminationEvidence).toMatchObject({ seq: 0, expected: 'alpha', actual: 'beta' });
      const view = await db.pool.query('select termination_reason from runledger.dead_letter where run_id = $1', [handle.runId]);
      expect(view.rows).toEqual([{ termination_reason: 'NON_DETERMINISM' }]);
    } finally {
      await w2.stop();
    }
  });
});
