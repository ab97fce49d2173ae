/**
 * A support agent written with the Vercel AI SDK, made durable by runledger/ai: the
 * `generateText` loop is the AI SDK's own; what runledger adds is the two wrappers.
 *
 * The model here is the AI SDK's MockLanguageModelV4 with a script, so the demo runs
 * offline. With a real provider, replace `supportModel()` by e.g. `openai('gpt-4.1')`
 * (npm install @ai-sdk/openai; OPENAI_API_KEY) or `anthropic('claude-sonnet-4')`: nothing
 * else changes.
 */
import type { LanguageModelV4, LanguageModelV4CallOptions, LanguageModelV4GenerateResult } from '@ai-sdk/provider';
import { generateText, stepCountIs, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import type { Engine } from '../../src/index.js';
import { durableModel, durableTools } from '../../src/ai/index.js';

export const APPROVER = 'finance.fay';

export function defineRefundAgent(engine: Engine, paymentsUrl: string) {
  return engine.workflow(
    { name: 'ai-refund-agent', queue: 'ai-refund', limits: { budget: { tokens: 50_000, toolCalls: 10 } } },
    async (ctx, input: { orderId: string; message: string }) => {
      // ---- the user's AI SDK code; runledger's part is durableModel and durableTools ----
      const result = await generateText({
        model: durableModel(ctx, supportModel(), { name: 'support' }),
        system: 'You are a support agent. Look the order up before refunding it.',
        prompt: input.message,
        tools: durableTools(
          ctx,
          {
            lookupOrder: tool({
              description: 'Looks an order up',
              inputSchema: z.object({ orderId: z.string() }),
              execute: async ({ orderId }) => ({ orderId, paid: 49, currency: 'EUR', item: 'headphones' }),
            }),
            refund: tool({
              description: 'Refunds an order through the payment provider',
              inputSchema: z.object({ orderId: z.string(), amount: z.number() }),
              execute: async ({ orderId, amount }) => {
                const url = `${paymentsUrl}/refunds?key=refund-${orderId}&order=${orderId}&amount=${amount}`;
                const response = await fetch(url, { method: 'POST' });
                if (!response.ok) throw new Error(`the payment provider answered ${response.status}`);
                return (await response.json()) as { refundId: string };
              },
            }),
          },
          {
            refund: {
              sideEffect: 'external',
              idempotencyKey: ({ input }) => `refund-${input.orderId}`,
              // After a crash between the call and its record: ask the provider, never refund twice.
              reconcile: async ({ idempotencyKey }) => {
                const response = await fetch(`${paymentsUrl}/refunds?key=${idempotencyKey}`);
                if (response.status === 404) return { status: 'failed', error: new Error('no refund was made') };
                return response.ok ? { status: 'succeeded', result: await response.json() } : { status: 'unknown' };
              },
              needsApproval: { approvers: [APPROVER] },
            },
          },
        ),
        stopWhen: stepCountIs(6),
      });
      // ---- end of the user's code ----
      return { answer: result.text, steps: result.steps.length };
    },
  );
}

/** The demo's model: looks the order up, refunds what was paid, then answers (the AI SDK's mock, scripted). */
function supportModel(): LanguageModelV4 {
  const usage = {
    inputTokens: { total: 120, noCache: 120, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 30, text: 30, reasoning: undefined },
  };
  const reply = (options: LanguageModelV4CallOptions): LanguageModelV4GenerateResult => {
    const turn = options.prompt.filter((m) => m.role === 'assistant').length;
    const orderId = /order ([A-Z]+-\d+)/.exec(JSON.stringify(options.prompt))?.[1] ?? 'unknown';
    const call = (toolName: string, input: unknown): LanguageModelV4GenerateResult => ({
      content: [{ type: 'tool-call', toolCallId: `call_${turn + 1}`, toolName, input: JSON.stringify(input) }],
      finishReason: { unified: 'tool-calls', raw: 'tool_calls' },
      usage,
      warnings: [],
    });
    if (turn === 0) return call('lookupOrder', { orderId });
    if (turn === 1) return call('refund', { orderId, amount: 49 });
    return {
      content: [{ type: 'text', text: `I refunded 49 EUR for order ${orderId}.` }],
      finishReason: { unified: 'stop', raw: 'stop' },
      usage,
      warnings: [],
    };
  };
  return new MockLanguageModelV4({ modelId: 'support-mock', doGenerate: async (options) => reply(options) });
}
