import type { LanguageModelV4CallOptions, LanguageModelV4StreamPart } from '@ai-sdk/provider';
import { APICallError } from 'ai';
import { MockLanguageModelV4, simulateReadableStream } from 'ai/test';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { fromAiSdk } from '../../src/ai/index.js';
import { defineTool, runAgent } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';

/**
 * fromAiSdk: an AI SDK model (here the AI SDK's own mock) as a runledger model under runAgent:
 * the prompt and tool specs mapped, tool calls and text mapped back, usage charged, the
 * stream's text forwarded to the run's 'model' stream, a provider error a ModelError.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'from-ai-sdk');

const usage = {
  inputTokens: { total: 9, noCache: 9, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 4, text: 4, reasoning: undefined },
};
let looked = 0;
const lookup = defineTool({
  name: 'lookup',
  description: 'Looks a word up',
  input: z.object({ word: z.string() }),
  sideEffect: 'none',
  run: async ({ word }) => (looked++, { word, meaning: 'lasting' }),
});

describe('fromAiSdk', () => {
  it('runs runAgent on an AI SDK model, streamed: tool calls and text mapped both ways, usage charged, text on the model stream', async () => {
    const prompts: LanguageModelV4CallOptions[] = [];
    const turns: LanguageModelV4StreamPart[][] = [
      [
        { type: 'stream-start', warnings: [] },
        { type: 'tool-call', toolCallId: 't1', toolName: 'lookup', input: '{"word":"durable"}' },
        { type: 'finish', finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage },
      ],
      [
        { type: 'stream-start', warnings: [] },
        { type: 'text-start', id: 'a' },
        { type: 'text-delta', id: 'a', delta: 'Durable means ' },
        { type: 'text-delta', id: 'a', delta: 'lasting.' },
        { type: 'text-end', id: 'a' },
        { type: 'finish', finishReason: { unified: 'stop', raw: 'stop' }, usage },
      ],
    ];
    const model = new MockLanguageModelV4({
      modelId: 'mock-stream',
      doStream: async (options) => {
        prompts.push(options);
        return { stream: simulateReadableStream({ chunks: turns[prompts.length - 1]! }) };
      },
    });
    const wf = t.engine.workflow({ name: 'from-ai-sdk-stream', queue: 'from-ai-sdk', limits: { budget: { tokens: 1_000 } } }, async (ctx) =>
      runAgent(ctx, { model: fromAiSdk(model), tools: [lookup], instructions: 'Be brief.', task: 'What is durable?', endOnText: true }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toMatchObject({ answer: { summary: 'Durable means lasting.' }, turns: 2 });
    expect(looked).toBe(1);
    // The first call's prompt and tools, as the AI SDK takes them; the second carries the tool's result.
    expect(prompts[0]!.prompt).toEqual([
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: [{ type: 'text', text: 'What is durable?' }] },
    ]);
    expect(prompts[0]!.tools?.map((tool) => tool.name)).toEqual(['lookup', 'complete']);
    expect(prompts[0]!.maxOutputTokens).toBe(1_000);
    expect(prompts[1]!.prompt.at(-1)).toMatchObject({
      role: 'tool',
      content: [{ type: 'tool-result', toolCallId: 't1', toolName: 'lookup' }],
    });
    const run = (await db.pool.query('select budget_used from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.budget_used).toMatchObject({ tokens: 26 });
    const chunks = [];
    for await (const { chunk } of t.engine.readStream(handle.runId, 'model')) chunks.push((chunk as { delta: string }).delta);
    expect(chunks.join('')).toBe('Durable means lasting.');
  });

  it('without streaming it uses doGenerate; a provider error is a ModelError, retried when the provider says it may help', async () => {
    let calls = 0;
    const model = new MockLanguageModelV4({
      modelId: 'mock-generate',
      doGenerate: async () => {
        calls++;
        if (calls === 1)
          throw new APICallError({
            message: 'rate limited',
            url: 'http://provider',
            requestBodyValues: {},
            statusCode: 429,
            isRetryable: true,
          });
        return { content: [{ type: 'text', text: 'Fine.' }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] };
      },
    });
    const wf = t.engine.workflow({ name: 'from-ai-sdk-generate', queue: 'from-ai-sdk' }, async (ctx) =>
      ctx.generate(fromAiSdk(model, { stream: false, name: 'gen' }), {
        messages: [{ role: 'user', content: 'hi' }],
        retry: { maxAttempts: 2, initialDelayMs: 10, retryable: (e) => (e as { retryable?: boolean }).retryable === true },
      }),
    );
    await worker();
    const reply = await (await t.engine.start(wf, undefined)).result();
    expect(reply).toMatchObject({
      message: { role: 'assistant', content: 'Fine.' },
      usage: { inputTokens: 9, outputTokens: 4 },
      finishReason: 'stop',
    });
    expect(calls).toBe(2);
  });
});
