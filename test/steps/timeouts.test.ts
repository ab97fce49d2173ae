import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineModel, defineTool } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';

/**
 * Step timeouts: an attempt past its `timeout` is aborted (its signal fires) and fails with
 * STEP_TIMEOUT into the step's retry policy; a retry gets the whole timeout again; the same
 * holds for a model call (ctx.generate) and a 'none' tool. A bad timeout is a ConfigError.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'timeouts');
const never = (signal: AbortSignal) =>
  new Promise<string>((_, reject) =>
    signal.addEventListener('abort', () => reject(new Error(`aborted: ${String((signal.reason as Error)?.message)}`)), { once: true }),
  );

describe('step timeouts', () => {
  it('an attempt past its timeout is aborted and fails with STEP_TIMEOUT; the step is FAILED with it', async () => {
    let sawAbort = false;
    const wf = t.engine.workflow({ name: 'timeout-fails', queue: 'timeouts' }, async (ctx) =>
      ctx.step(
        'slow',
        async ({ signal }) => {
          signal.addEventListener('abort', () => (sawAbort = true));
          return never(signal);
        },
        { timeout: '150ms' },
      ),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(sawAbort).toBe(true);
    const step = (
      await db.pool.query(`select status, error, attempts from runledger.steps where run_id = $1 and name = 'slow'`, [handle.runId])
    ).rows[0];
    expect(step).toMatchObject({ status: 'FAILED', attempts: 1, error: { code: 'STEP_TIMEOUT' } });
    expect(step.error.message).toContain('attempt 1 ran past its timeout of 150 ms');
  });

  it('a body that ignores its signal does not hold the step: the attempt fails at the timeout', async () => {
    const wf = t.engine.workflow({ name: 'timeout-ignored', queue: 'timeouts' }, async (ctx) => {
      const started = Date.now();
      const outcome = await ctx
        .step('stubborn', () => new Promise<string>((resolve) => setTimeout(() => resolve('late'), 5_000).unref()), { timeout: 100 })
        .then(
          () => 'finished',
          (error: { details?: { code?: string } }) => error.details?.code,
        );
      return { outcome, waitedMs: Date.now() - started };
    });
    await worker();
    const result = await (await t.engine.start(wf, undefined)).result();
    expect(result.outcome).toBe('STEP_TIMEOUT');
    expect(result.waitedMs).toBeLessThan(4_000);
  });

  it('a timed-out attempt goes into the retry policy; the next attempt gets the whole timeout', async () => {
    let attempts = 0;
    const wf = t.engine.workflow({ name: 'timeout-retried', queue: 'timeouts' }, async (ctx) =>
      ctx.step(
        'flaky',
        async ({ signal, attempt }) => {
          attempts++;
          if (attempt === 1) return never(signal);
          return `done on attempt ${attempt}`;
        },
        { timeout: '100ms', retry: { maxAttempts: 3, initialDelayMs: 10 } },
      ),
    );
    await worker();
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toBe('done on attempt 2');
    expect(attempts).toBe(2);
  });

  it('a model call and a none tool take a timeout too; a timeout on a tool with an effect, or out of range, is a ConfigError', async () => {
    const stuck = defineModel({ name: 'stuck', call: ({ signal }) => never(signal) as never });
    const slowTool = defineTool({
      name: 'slow_lookup',
      description: 'Never answers',
      input: z.object({}),
      sideEffect: 'none',
      timeout: '100ms',
      run: (_args, { signal }) => never(signal),
    });
    const wf = t.engine.workflow({ name: 'timeout-agents', queue: 'timeouts' }, async (ctx) => {
      const model = await ctx
        .generate(stuck, { messages: [{ role: 'user', content: 'hi' }], timeout: '100ms', retry: { maxAttempts: 1 } })
        .then(
          () => 'answered',
          (error: { details?: { code?: string } }) => error.details?.code,
        );
      const tool = await ctx.callTool(slowTool, {});
      return { model, tool };
    });
    const refused = t.engine.workflow({ name: 'timeout-bad', queue: 'timeouts' }, async (ctx) =>
      ctx.step('x', () => 1, { timeout: '30d' }),
    );
    await worker();
    const result = await (await t.engine.start(wf, undefined)).result();
    expect(result.model).toBe('STEP_TIMEOUT');
    expect(result.tool).toMatchObject({ ok: false, error: { code: 'TOOL_FAILED', details: { errorCode: 'STEP_TIMEOUT' } } });
    expect(() =>
      defineTool({ name: 'zero', description: 'Zero', input: z.object({}), sideEffect: 'none', timeout: 0, run: () => 1 }),
    ).toThrow(/not from 1 ms/);
    await expect((await t.engine.start(refused, undefined)).result()).rejects.toThrow(/about 24.8 days/);
  });

  it('an operation past its timeout has an unknown outcome: reconcile settles it; an idempotent one is called again with its key', async () => {
    const calls: string[] = [];
    const wf = t.engine.workflow({ name: 'timeout-operations', queue: 'timeouts' }, async (ctx) => {
      // Never answers: its outcome is UNKNOWN, and reconcile says the provider has it.
      const settled = await ctx.operation(
        'wire',
        {
          timeout: '100ms',
          reconcile: async ({ idempotencyKey }) => ({ status: 'succeeded', result: `found ${idempotencyKey}` }),
        },
        async ({ idempotencyKey, signal }) => (calls.push(`wire ${idempotencyKey}`), never(signal)),
      );
      // Idempotent: the second attempt, same key, answers in time.
      const again = await ctx.operation(
        'charge',
        { timeout: '100ms', idempotent: true, idempotencyKey: `charge-${ctx.runId}`, retry: { maxAttempts: 2, initialDelayMs: 10 } },
        async ({ idempotencyKey, attempt, signal }) => {
          calls.push(`charge ${idempotencyKey} ${attempt}`);
          return attempt === 1 ? never(signal) : `charged ${attempt}`;
        },
      );
      return { settled, again };
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    const result = await handle.result();
    expect(result.settled).toMatch(/^found /);
    expect(result.again).toBe('charged 2');
    expect(calls).toEqual([expect.stringMatching(/^wire /), `charge charge-${handle.runId} 1`, `charge charge-${handle.runId} 2`]);
    const events = await db.pool.query(`select kind from runledger.events where run_id = $1 and kind = 'operation_unknown'`, [
      handle.runId,
    ]);
    expect(events.rows).toHaveLength(1);
    const ledger = await db.pool.query(`select name, status, attempts from runledger.operations where run_id = $1 order by seq`, [
      handle.runId,
    ]);
    expect(ledger.rows).toEqual([
      { name: 'wire', status: 'SUCCEEDED', attempts: 1 },
      { name: 'charge', status: 'SUCCEEDED', attempts: 2 },
    ]);
  });

  it('an external tool past its timeout is UNKNOWN and waits for an operator when it has no reconcile', async () => {
    const wire = defineTool({
      name: 'wire',
      description: 'Wires money',
      input: z.object({}),
      sideEffect: 'external',
      timeout: '100ms',
      run: (_args, { signal }) => never(signal),
    });
    const wf = t.engine.workflow({ name: 'timeout-tool-effect', queue: 'timeouts' }, async (ctx) => ctx.callTool(wire, {}));
    await worker();
    const handle = await t.engine.start(wf, undefined);
    const parked = await waitFor('the run waiting for reconcile', async () => {
      const row = (await db.pool.query(`select status, wait_kind from runledger.runs where run_id = $1`, [handle.runId])).rows[0];
      return row.wait_kind === 'reconcile' ? row : undefined;
    });
    expect(parked.status).toBe('WAITING');
    const unknown = await db.pool.query(`select name from runledger.unknown_operations where run_id = $1`, [handle.runId]);
    expect(unknown.rows).toEqual([{ name: 'tool:wire' }]);
  });
});
