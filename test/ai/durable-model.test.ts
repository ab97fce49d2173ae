import type { LanguageModelV4CallOptions, LanguageModelV4GenerateResult, LanguageModelV4StreamPart } from '@ai-sdk/provider';
import { generateText, stepCountIs, streamText, tool, ToolLoopAgent } from 'ai';
import { MockLanguageModelV4, simulateReadableStream } from 'ai/test';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { durableModel, durableTools } from '../../src/ai/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';

/**
 * runledger/ai with the AI SDK's own loop (generateText, streamText) and its mock models:
 * each model call is a checkpointed step that a replay does not make again, tools run
 * under the tool contract, usage is charged, the output cap is lowered by the budget.
 * The run parks on an approval in the middle, so what follows it is a replay.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'ai-sdk');

const usage = (input: number, output: number) => ({
  inputTokens: { total: input, noCache: input, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: output, text: output, reasoning: undefined },
});
const toolCallReply = (calls: Array<{ id: string; name: string; input: unknown }>): LanguageModelV4GenerateResult => ({
  content: calls.map((c) => ({ type: 'tool-call', toolCallId: c.id, toolName: c.name, input: JSON.stringify(c.input) })),
  finishReason: { unified: 'tool-calls', raw: 'tool_calls' },
  usage: usage(10, 5),
  warnings: [],
});
const textReply = (text: string): LanguageModelV4GenerateResult => ({
  content: [{ type: 'text', text }],
  finishReason: { unified: 'stop', raw: 'stop' },
  usage: usage(20, 7),
  warnings: [],
});

/** A mock model answering from a script, by call number across the whole test process (so a replay would show as an extra call). */
function scripted(replies: LanguageModelV4GenerateResult[]) {
  const calls: LanguageModelV4CallOptions[] = [];
  const model = new MockLanguageModelV4({
    modelId: 'mock',
    doGenerate: async (options) => {
      calls.push(options);
      const reply = replies[calls.length - 1];
      if (!reply) throw new Error(`the script has no reply ${calls.length}`);
      return reply;
    },
  });
  return { model, calls };
}

const steps = async (runId: string) =>
  (await db.pool.query('select name, kind, status from runledger.steps where run_id = $1 order by seq', [runId])).rows as Array<{
    name: string;
    kind: string;
    status: string;
  }>;

async function approveWhenAsked(runId: string) {
  await waitFor(
    'the approval request',
    async () => (await db.pool.query('select 1 from runledger.approvals where run_id = $1 and decided_at is null', [runId])).rowCount === 1,
  );
  const { request_id } = (await db.pool.query('select request_id from runledger.approvals where run_id = $1', [runId])).rows[0];
  await t.engine.decideApproval(request_id, { approved: true, decidedBy: 'ops' });
}

describe('durableModel and durableTools under generateText', () => {
  it('checkpoints each model call, runs tools once through the contract, waits durably for an approval and replays without calling the model again', async () => {
    const { model, calls } = scripted([
      toolCallReply([{ id: 'c1', name: 'lookup', input: { orderId: 'o-1' } }]),
      toolCallReply([{ id: 'c1', name: 'refund', input: { orderId: 'o-1', amount: 30 } }]),
      textReply('Refunded 30 on o-1.'),
    ]);
    const effects = { lookup: 0, refund: 0 };
    const wf = t.engine.workflow(
      { name: 'ai-refund', queue: 'ai-sdk', limits: { budget: { tokens: 10_000, toolCalls: 10 } } },
      async (ctx, input: { task: string }) => {
        const result = await generateText({
          model: durableModel(ctx, model),
          tools: durableTools(
            ctx,
            {
              lookup: tool({
                description: 'Looks an order up',
                inputSchema: z.object({ orderId: z.string() }),
                execute: async ({ orderId }) => {
                  effects.lookup++;
                  return { orderId, paid: 30 };
                },
              }),
              refund: tool({
                description: 'Refunds an order',
                inputSchema: z.object({ orderId: z.string(), amount: z.number() }),
                execute: async ({ orderId, amount }) => {
                  effects.refund++;
                  return { refundId: `r-${orderId}`, amount };
                },
              }),
            },
            {
              refund: {
                sideEffect: 'external',
                idempotencyKey: ({ input }) => `refund-${input.orderId}`,
                needsApproval: { approvers: ['ops'] },
              },
            },
          ),
          stopWhen: stepCountIs(5),
          prompt: input.task,
        });
        return { text: result.text, steps: result.steps.length };
      },
    );
    await worker();
    const handle = await t.engine.start(wf, { task: 'Refund order o-1' });
    await approveWhenAsked(handle.runId);
    await expect(handle.result()).resolves.toEqual({ text: 'Refunded 30 on o-1.', steps: 3 });
    // Three model calls in all: the replay after the approval did not call the model again.
    expect(calls).toHaveLength(3);
    expect(effects).toEqual({ lookup: 1, refund: 1 });
    const names = (await steps(handle.runId)).map((s) => s.name);
    expect(names).toEqual([
      'model:mock:1',
      'tool:lookup',
      'model:mock:2',
      'tool:refund:approval',
      'tool:refund:key',
      'tool:refund',
      'model:mock:3',
    ]);
    const op = (await db.pool.query('select idempotency_key, status from runledger.operations where run_id = $1', [handle.runId])).rows;
    expect(op).toEqual([{ idempotency_key: 'refund-o-1', status: 'SUCCEEDED' }]);
    const run = (await db.pool.query('select budget_used from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.budget_used).toMatchObject({ tokens: 15 + 15 + 27, tool_calls: 2 });
  });

  it('a tool whose approval is refused reaches the model as the tool error, and the effect never happens', async () => {
    const { model, calls } = scripted([toolCallReply([{ id: 'x', name: 'wire', input: { amount: 5 } }]), textReply('Not sent.')]);
    let wires = 0;
    const wf = t.engine.workflow({ name: 'ai-refused', queue: 'ai-sdk' }, async (ctx) => {
      const result = await generateText({
        model: durableModel(ctx, model),
        tools: durableTools(
          ctx,
          { wire: tool({ inputSchema: z.object({ amount: z.number() }), execute: async () => ++wires }) },
          { wire: { sideEffect: 'external', needsApproval: true } },
        ),
        stopWhen: stepCountIs(3),
        prompt: 'send',
      });
      const part = result.steps[0]!.content.find((p) => p.type === 'tool-error') as
        { error: { code: string; message: string } } | undefined;
      return { code: part?.error.code, message: part?.error.message };
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await waitFor(
      'the approval request',
      async () => (await db.pool.query('select 1 from runledger.approvals where run_id = $1', [handle.runId])).rowCount === 1,
    );
    const { request_id } = (await db.pool.query('select request_id from runledger.approvals where run_id = $1', [handle.runId])).rows[0];
    await t.engine.decideApproval(request_id, { approved: false, decidedBy: 'ops', note: 'too risky' });
    const toolError = await handle.result();
    expect(toolError.code).toBe('TOOL_REJECTED');
    expect(toolError.message).toContain('too risky');
    expect(wires).toBe(0);
    expect(calls).toHaveLength(2);
  });

  it('lowers the caller’s maxOutputTokens to what the token budget leaves, never raises it', async () => {
    const { model, calls } = scripted([textReply('a'), textReply('b')]);
    const wf = t.engine.workflow({ name: 'ai-cap', queue: 'ai-sdk', limits: { budget: { tokens: 100 } } }, async (ctx) => {
      await generateText({ model: durableModel(ctx, model), prompt: 'one', maxOutputTokens: 1_000 });
      await generateText({ model: durableModel(ctx, model), prompt: 'two', maxOutputTokens: 10 });
      return 'ok';
    });
    await worker();
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toBe('ok');
    expect(calls.map((c) => c.maxOutputTokens)).toEqual([100, 10]);
  });

  it('concurrent tool calls of one reply take their positions in the reply’s order, whatever order they arrive in', async () => {
    const { model } = scripted([
      toolCallReply([
        { id: 'a', name: 'slow', input: {} },
        { id: 'b', name: 'fast', input: {} },
      ]),
      textReply('done'),
    ]);
    const ran: string[] = [];
    const wf = t.engine.workflow({ name: 'ai-order', queue: 'ai-sdk' }, async (ctx) => {
      const result = await generateText({
        model: durableModel(ctx, model),
        tools: durableTools(ctx, {
          slow: tool({ inputSchema: z.object({}), execute: async () => (ran.push('slow'), 'slow') }),
          fast: tool({ inputSchema: z.object({}), execute: async () => (ran.push('fast'), 'fast') }),
        }),
        // The user's callback holds the first call a little: it reaches execute second.
        onToolExecutionStart: async ({ toolCall }: { toolCall: { toolName: string } }) => {
          if (toolCall.toolName === 'slow') await new Promise((resolve) => setTimeout(resolve, 5));
        },
        stopWhen: stepCountIs(3),
        prompt: 'both',
      } as Parameters<typeof generateText>[0]);
      return result.text;
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('done');
    // fast reached execute first, but slow holds the earlier position, as in the reply.
    expect([...ran].sort()).toEqual(['fast', 'slow']);
    expect((await steps(handle.runId)).map((s) => s.name)).toEqual(['model:mock:1', 'tool:slow', 'tool:fast', 'model:mock:2']);
  });
});

describe('durableModel under ToolLoopAgent', () => {
  it('an agent object built in the workflow with the wrapped model and tools is durable the same way', async () => {
    const { model, calls } = scripted([
      toolCallReply([{ id: 'k1', name: 'lookup', input: { orderId: 'o-9' } }]),
      textReply('o-9 is paid.'),
    ]);
    let lookups = 0;
    const wf = t.engine.workflow({ name: 'ai-agent-object', queue: 'ai-sdk' }, async (ctx) => {
      const agent = new ToolLoopAgent({
        model: durableModel(ctx, model),
        instructions: 'Answer about orders.',
        tools: durableTools(ctx, {
          lookup: tool({
            inputSchema: z.object({ orderId: z.string() }),
            execute: async ({ orderId }) => (lookups++, { orderId, paid: true }),
          }),
        }),
        stopWhen: stepCountIs(4),
      });
      const result = await agent.generate({ prompt: 'Is o-9 paid?' });
      await ctx.requestApproval('go-on', { action: 'go on' });
      return result.text;
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await approveWhenAsked(handle.runId);
    await expect(handle.result()).resolves.toBe('o-9 is paid.');
    expect(calls).toHaveLength(2);
    expect(lookups).toBe(1);
    expect((await steps(handle.runId)).map((s) => s.name)).toEqual(['model:mock:1', 'tool:lookup', 'model:mock:2', 'go-on']);
  });
});

describe('durableModel under streamText', () => {
  it('records the streamed parts, writes UI chunks to the run’s durable stream live, and re-emits the parts on replay', async () => {
    let streams = 0;
    const parts: LanguageModelV4StreamPart[] = [
      { type: 'stream-start', warnings: [] },
      { type: 'text-start', id: 't' },
      { type: 'text-delta', id: 't', delta: 'Hello' },
      { type: 'text-delta', id: 't', delta: ', world' },
      { type: 'text-end', id: 't' },
      { type: 'finish', finishReason: { unified: 'stop', raw: 'stop' }, usage: usage(3, 2) },
    ];
    const model = new MockLanguageModelV4({
      modelId: 'streamer',
      doStream: async () => {
        streams++;
        return { stream: simulateReadableStream({ chunks: parts }) };
      },
    });
    const wf = t.engine.workflow({ name: 'ai-stream', queue: 'ai-sdk' }, async (ctx) => {
      const first = streamText({ model: durableModel(ctx, model), prompt: 'hi' });
      const text = await first.text;
      // Parks the run: what comes after is a replay of the streamed call.
      await ctx.requestApproval('go-on', { action: 'go on' });
      return text;
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await approveWhenAsked(handle.runId);
    await expect(handle.result()).resolves.toBe('Hello, world');
    expect(streams).toBe(1);
    const chunks = [];
    for await (const { chunk } of t.engine.readStream(handle.runId, 'ui')) chunks.push(chunk);
    expect(chunks).toEqual([
      { type: 'start-step' },
      { type: 'text-start', id: 't' },
      { type: 'text-delta', id: 't', delta: 'Hello' },
      { type: 'text-delta', id: 't', delta: ', world' },
      { type: 'text-end', id: 't' },
      { type: 'finish-step' },
    ]);
    const run = (await db.pool.query('select budget_used from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.budget_used).toMatchObject({ tokens: 5 });
  });
});
