import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, type PolicyAction } from '../src/index.js';
import { useTestEngine } from './helpers/test-engine.js';
import { queueWorkers } from './helpers/cleanup.js';
import { waitFor } from './helpers/database.js';

/**
 * A workflow's policy (WorkflowOptions.policy, sql/0019_policy.sql): asked before each tool
 * call, operation and ctx.exec is first taken; a refusal ends the run TERMINATED with the
 * reason POLICY and the action as evidence, nothing of the action done, the compensations of
 * what was done run; a replay does not ask again; a policy that throws or awaits refuses.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'policy');

const runRow = async (runId: string) =>
  (await db.pool.query(`select status, termination_reason, termination_evidence from runledger.runs where run_id = $1`, [runId])).rows[0];

describe('policy', () => {
  it('a refused tool call is not made; the run ends TERMINATED, POLICY, with the action, reason and evidence', async () => {
    const refunded: number[] = [];
    const refund = defineTool({
      name: 'refund',
      description: 'Refunds an amount',
      input: z.object({ amount: z.number() }),
      sideEffect: 'external',
      run: ({ amount }) => (refunded.push(amount), { refunded: amount }),
    });
    const asked: PolicyAction[] = [];
    const wf = t.engine.workflow(
      {
        name: 'policy-tool',
        queue: 'policy',
        policy: (action) => {
          asked.push(action);
          if (action.kind === 'tool' && (action.args as { amount: number }).amount > 500)
            return { refuse: 'refunds above 500 need a human', evidence: { limit: 500 } };
        },
      },
      async (ctx) => {
        await ctx.callTool(refund, { amount: 100 });
        await ctx.callTool(refund, { amount: 900 });
        return 'done';
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(refunded).toEqual([100]);
    const run = await runRow(handle.runId);
    expect(run).toMatchObject({
      status: 'TERMINATED',
      termination_reason: 'POLICY',
      termination_evidence: {
        action: { kind: 'tool', name: 'refund', args: { amount: 900 }, sideEffect: 'external' },
        reason: 'refunds above 500 need a human',
        evidence: { limit: 500 },
      },
    });
    // The tool's operation was asked about once, as the tool call.
    expect(asked.map((a) => a.kind)).toEqual(['tool', 'tool']);
    const operations = await db.pool.query(`select name, status from runledger.operations where run_id = $1`, [handle.runId]);
    expect(operations.rows).toEqual([{ name: 'tool:refund', status: 'SUCCEEDED' }]);
  });

  it('a refused operation is not begun; the operations done before it are compensated first', async () => {
    const undone: string[] = [];
    const wf = t.engine.workflow(
      {
        name: 'policy-operation',
        queue: 'policy',
        policy: (action) => (action.kind === 'operation' && action.name === 'wire' ? { refuse: 'wires are off today' } : undefined),
      },
      async (ctx) => {
        await ctx.operation('hold', { compensate: ({ result }) => void undone.push(String(result)) }, async () => 'hold-1');
        await ctx.operation('wire', {}, async () => 'never');
        return 'done';
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    const run = await runRow(handle.runId);
    expect(run).toMatchObject({
      status: 'TERMINATED',
      termination_reason: 'POLICY',
      termination_evidence: { action: { kind: 'operation', name: 'wire' }, reason: 'wires are off today', seq: 1 },
    });
    expect(undone).toEqual(['hold-1']);
    const operations = await db.pool.query(`select name from runledger.operations where run_id = $1 order by seq`, [handle.runId]);
    expect(operations.rows.map((r) => r.name)).toEqual(['hold']);
  });

  it('a refused command is not run', async () => {
    const wf = t.engine.workflow(
      {
        name: 'policy-exec',
        queue: 'policy',
        policy: (action) => (action.kind === 'exec' && action.command === 'rm' ? { refuse: 'no rm' } : undefined),
      },
      async (ctx) => {
        const echo = await ctx.exec('echo', { command: 'echo', args: ['hi'] });
        await ctx.exec('clean', { command: 'rm', args: ['-rf', '/tmp/runledger-policy-never'] });
        return echo.stdoutTail;
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(await runRow(handle.runId)).toMatchObject({
      termination_reason: 'POLICY',
      termination_evidence: { action: { kind: 'exec', name: 'clean', command: 'rm', args: ['-rf', '/tmp/runledger-policy-never'] } },
    });
  });

  it('is asked once per action: a replay of a recorded action does not ask again', async () => {
    const asked: string[] = [];
    const wf = t.engine.workflow(
      { name: 'policy-replay', queue: 'policy', policy: (action) => void asked.push(action.name) },
      async (ctx) => {
        await ctx.operation('first', {}, async () => 1);
        await ctx.waitForSignal('go');
        await ctx.operation('second', {}, async () => 2);
        return 'done';
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await waitFor('the run waiting', async () => (await runRow(handle.runId)).status === 'WAITING');
    await t.engine.signal(handle.runId, 'go');
    await expect(handle.result()).resolves.toBe('done');
    expect(asked).toEqual(['first', 'second']);
  });

  it('fails closed: a policy that throws or answers a promise refuses, saying so', async () => {
    const throwing = t.engine.workflow(
      {
        name: 'policy-throws',
        queue: 'policy',
        policy: () => {
          throw new Error('rules unavailable');
        },
      },
      async (ctx) => ctx.operation('pay', {}, async () => 1),
    );
    const awaiting = t.engine.workflow({ name: 'policy-async', queue: 'policy', policy: (async () => undefined) as never }, async (ctx) =>
      ctx.operation('pay', {}, async () => 1),
    );
    await worker();
    const a = await t.engine.start(throwing, undefined);
    const b = await t.engine.start(awaiting, undefined);
    await expect(a.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    await expect(b.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect((await runRow(a.runId)).termination_evidence.reason).toBe('the policy threw: rules unavailable');
    expect((await runRow(b.runId)).termination_evidence.reason).toMatch(/a promise \(a policy decides synchronously\)/);
    expect(() => t.engine.workflow({ name: 'policy-bad', policy: 'allow' as never }, async () => 1)).toThrow(/policy must be a function/);
  });

  it('evidence JSON cannot write, or jsonb cannot store, is recorded as well as it can be: the run still ends POLICY', async () => {
    const withBigint: Record<string, unknown> = { amount: 10n };
    const bigint = t.engine.workflow(
      { name: 'policy-bigint', queue: 'policy', policy: () => ({ refuse: 'over the limit', evidence: withBigint }) },
      async (ctx) => ctx.operation('pay', {}, async () => 1),
    );
    const nul = t.engine.workflow(
      { name: 'policy-nul', queue: 'policy', policy: () => ({ refuse: 'bad\u0000name', evidence: { name: 'a\u0000b' } }) },
      async (ctx) => ctx.operation('pay', {}, async () => 1),
    );
    await worker();
    const a = await t.engine.start(bigint, undefined);
    const b = await t.engine.start(nul, undefined);
    await expect(a.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    await expect(b.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(await runRow(a.runId)).toMatchObject({
      termination_reason: 'POLICY',
      termination_evidence: {
        reason: 'over the limit',
        evidence: { unserializable: '[object Object]', error: expect.stringMatching(/BigInt/) },
      },
    });
    expect(await runRow(b.runId)).toMatchObject({
      termination_reason: 'POLICY',
      termination_evidence: { reason: 'bad\uFFFDname', evidence: { name: 'a\uFFFDb' } },
    });
  });
});
