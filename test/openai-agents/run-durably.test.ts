import { Agent, MemorySession, tool } from '@openai/agents-core';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { runAgentDurably, runledgerSession } from '../../src/openai-agents/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';
import { FakeAgentModel } from './fake-model.js';

/**
 * runledger/openai-agents: an Agents SDK agent run by runAgentDurably, with a fake model
 * (offline). Model calls are steps that a replay does not make again; a tool that needs
 * approval is a durable approval; the session holds each item once.
 */
process.env.OPENAI_AGENTS_DISABLE_TRACING = '1';
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'agents-sdk');

const steps = async (runId: string) =>
  (await db.pool.query('select name from runledger.steps where run_id = $1 order by seq', [runId])).rows.map((r) => r.name as string);

describe('runAgentDurably', () => {
  it('turns a tool approval into a durable approval, replays without calling the model again, and appends the session once', async () => {
    const model = new FakeAgentModel([
      { calls: [{ callId: 'c1', name: 'lookup_order', input: { orderId: 'o-7' } }] },
      { calls: [{ callId: 'c2', name: 'refund', input: { orderId: 'o-7', amount: 12 } }] },
      { text: 'Refunded 12 on o-7.' },
    ]);
    const effects = { lookup: 0, refund: 0 };
    const agent = new Agent({
      name: 'support',
      instructions: 'Refund when asked.',
      model,
      tools: [
        tool({
          name: 'lookup_order',
          description: 'Looks an order up',
          parameters: z.object({ orderId: z.string() }),
          execute: async ({ orderId }) => (effects.lookup++, `order ${orderId}: paid 12`),
        }),
        tool({
          name: 'refund',
          description: 'Refunds an order',
          parameters: z.object({ orderId: z.string(), amount: z.number() }),
          needsApproval: true,
          execute: async ({ orderId, amount }) => (effects.refund++, `refunded ${amount} on ${orderId}`),
        }),
      ],
    });
    const wf = t.engine.workflow(
      { name: 'agents-refund', queue: 'agents-sdk' },
      async (ctx, input: { sessionId: string; task: string }) => {
        const session = runledgerSession(ctx, input.sessionId);
        const result = await runAgentDurably(ctx, agent, input.task, {
          session,
          tools: { refund: { sideEffect: 'external', idempotencyKey: ({ input: args }) => `refund-${JSON.parse(args).orderId}` } },
        });
        await session.release();
        return result.finalOutput as string;
      },
    );
    await worker();
    const handle = await t.engine.start(wf, { sessionId: 'agents-1', task: 'Refund o-7' });
    await waitFor(
      'the approval request',
      async () => (await db.pool.query('select 1 from runledger.approvals where run_id = $1', [handle.runId])).rowCount === 1,
    );
    const request = (await db.pool.query('select request_id, action, evidence from runledger.approvals where run_id = $1', [handle.runId]))
      .rows[0];
    expect(request).toMatchObject({ action: 'refund', evidence: { tool: 'refund', callId: 'c2', agent: 'support' } });
    expect(effects).toEqual({ lookup: 1, refund: 0 });
    await t.engine.decideApproval(request.request_id, { approved: true, decidedBy: 'ops' });
    await expect(handle.result()).resolves.toBe('Refunded 12 on o-7.');
    expect(model.requests).toHaveLength(3);
    expect(effects).toEqual({ lookup: 1, refund: 1 });
    const names = await steps(handle.runId);
    expect(names.filter((n) => n.startsWith('model:'))).toEqual(['model:support:1', 'model:support:2', 'model:support:3']);
    expect(names).toContain('agents:state:1');
    expect(names).toContain('approval:refund:c2');
    const state = (await db.pool.query("select output from runledger.steps where run_id = $1 and name = 'agents:state:1'", [handle.runId]))
      .rows[0];
    expect(state.output).toMatchObject({ agent: 'support', schemaVersion: expect.any(String) });
    const ops = (await db.pool.query('select idempotency_key, status from runledger.operations where run_id = $1', [handle.runId])).rows;
    expect(ops).toEqual([{ idempotency_key: 'refund-o-7', status: 'SUCCEEDED' }]);
    // The session's items, folded from its history: each once, in order.
    const history = (await db.pool.query(`select content from runledger.session_history('agents-1')`)).rows.map((r) => r.content);
    const items = history.filter((c) => 'item' in c).map((c) => c.item);
    const callIds = items.filter((i) => i.type === 'function_call').map((i) => i.callId);
    expect(callIds).toEqual(['c1', 'c2']);
    const results = items.filter((i) => i.type === 'function_call_result').map((i) => i.callId);
    expect(results).toEqual(['c1', 'c2']);
    // Each user message once too (the task), whatever the replays.
    expect(items.filter((i) => i.role === 'user')).toHaveLength(1);
  });

  it('a rejected approval reaches the model as the tool’s refusal and the tool never runs', async () => {
    const model = new FakeAgentModel([{ calls: [{ callId: 'w1', name: 'wire', input: { amount: 5 } }] }, { text: 'Not wired.' }]);
    let wires = 0;
    const agent = new Agent({
      name: 'payer',
      model,
      tools: [
        tool({
          name: 'wire',
          description: 'Wires money',
          parameters: z.object({ amount: z.number() }),
          needsApproval: true,
          execute: async () => String(++wires),
        }),
      ],
    });
    const wf = t.engine.workflow(
      { name: 'agents-reject', queue: 'agents-sdk' },
      async (ctx) => (await runAgentDurably(ctx, agent, 'pay')).finalOutput,
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await waitFor(
      'the approval request',
      async () => (await db.pool.query('select 1 from runledger.approvals where run_id = $1', [handle.runId])).rowCount === 1,
    );
    const { request_id } = (await db.pool.query('select request_id from runledger.approvals where run_id = $1', [handle.runId])).rows[0];
    await t.engine.decideApproval(request_id, { approved: false, decidedBy: 'ops', note: 'no' });
    await expect(handle.result()).resolves.toBe('Not wired.');
    expect(wires).toBe(0);
    const lastInput = JSON.stringify(model.requests[1]!.input);
    expect(lastInput).toContain('ops rejected it: no');
  });
});

describe('runledgerSession', () => {
  it('applies each history transaction once per operationId, refuses a different one under the same id, and folds pops and replacements', async () => {
    const wf = t.engine.workflow({ name: 'agents-session', queue: 'agents-sdk' }, async (ctx) => {
      const session = runledgerSession(ctx, 'agents-tx');
      const a = { role: 'user' as const, content: 'a' };
      const b = { role: 'user' as const, content: 'b' };
      const c = { role: 'user' as const, content: 'c' };
      await session.applyHistoryTransaction({ operationId: 'op1', transaction: { type: 'append_items', items: [a, b] } });
      await session.applyHistoryTransaction({ operationId: 'op1', transaction: { type: 'append_items', items: [a, b] } });
      let refused = '';
      try {
        await session.applyHistoryTransaction({ operationId: 'op1', transaction: { type: 'append_items', items: [c] } });
      } catch (error) {
        refused = (error as Error).message;
      }
      await session.applyHistoryTransaction({
        operationId: 'op2',
        transaction: { type: 'replace_suffix', expectedSuffix: [b], replacement: [c] },
      });
      await session.addItems([b]);
      const popped = await session.popItem();
      const items = await session.getItems();
      const last = await session.getItems(1);
      await session.release();
      return { refused, popped, items, last };
    });
    await worker();
    const out = await (await t.engine.start(wf, undefined)).result();
    expect(out.refused).toContain('different transaction');
    expect(out.popped).toEqual({ role: 'user', content: 'b' });
    expect(out.items).toEqual([
      { role: 'user', content: 'a' },
      { role: 'user', content: 'c' },
    ]);
    expect(out.last).toEqual([{ role: 'user', content: 'c' }]);
    // The same semantics as the SDK's own MemorySession for the same calls.
    const memory = new MemorySession();
    await memory.applyHistoryTransaction({
      operationId: 'op1',
      transaction: {
        type: 'append_items',
        items: [
          { role: 'user', content: 'a' },
          { role: 'user', content: 'b' },
        ],
      },
    });
    await memory.applyHistoryTransaction({
      operationId: 'op2',
      transaction: {
        type: 'replace_suffix',
        expectedSuffix: [{ role: 'user', content: 'b' }],
        replacement: [{ role: 'user', content: 'c' }],
      },
    });
    expect(await memory.getItems()).toEqual(out.items);
  });
});
