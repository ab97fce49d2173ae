/**
 * openAiChatModel against a local fake OpenAI-compatible server (test/helpers/fake-openai.ts,
 * real HTTP on 127.0.0.1): requests as the API expects them, replies plain and streamed by
 * server-sent events, tool calls assembled across deltas, usage and cost, HTTP errors coded,
 * abort. Then through ctx.generate in a workflow.
 */
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  defineTool,
  ModelError,
  openAiChatModel,
  type Engine,
  type GenerateResult,
  type ModelCallArgs,
  type ToolSpec,
} from '../../src/index.js';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';
import { waitFor } from '../helpers/database.js';
import { FakeOpenAi } from '../helpers/fake-openai.js';
import { useTestEngine } from '../helpers/test-engine.js';

let fake: FakeOpenAi;
beforeAll(async () => {
  fake = await FakeOpenAi.start();
});
afterAll(async () => {
  await fake.stop();
});
beforeEach(() => {
  fake.requests.length = 0;
  fake.replies.length = 0;
});

const weather: ToolSpec = {
  name: 'get_weather',
  description: 'The weather in a city',
  parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
};

/** Calls the model as generate would, collecting what it writes to its stream. */
async function call(model: ReturnType<typeof openAiChatModel>, extra: Partial<ModelCallArgs> = {}) {
  const written: string[] = [];
  const reply = await model.call({
    messages: [{ role: 'user', content: 'hello' }],
    tools: [],
    signal: new AbortController().signal,
    stream: { write: (text) => void written.push(text) },
    ...extra,
  });
  return { reply, written };
}

describe('requests', () => {
  it('sends the chat-completions body: messages (tool calls and results too), tools as functions, max_tokens, headers', async () => {
    fake.reply({ content: 'sunny' });
    const model = openAiChatModel({
      baseUrl: fake.url,
      apiKey: 'sk-test',
      model: 'gpt-test',
      headers: { 'x-team': 'agents' },
      stream: false,
    });
    await call(model, {
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: 'weather in Oslo?' },
        { role: 'assistant', content: null, toolCalls: [{ id: 'c1', name: 'get_weather', arguments: { city: 'Oslo' } }] },
        { role: 'tool', content: '{"ok":true,"result":"rain"}', toolCallId: 'c1' },
      ],
      tools: [weather],
      maxOutputTokens: 321,
    });
    const [request] = fake.requests;
    expect(request!.path).toBe('/v1/chat/completions');
    expect(request!.headers).toMatchObject({ authorization: 'Bearer sk-test', 'x-team': 'agents', 'content-type': 'application/json' });
    expect(request!.body).toEqual({
      model: 'gpt-test',
      messages: [
        { role: 'system', content: 'be brief' },
        { role: 'user', content: 'weather in Oslo?' },
        {
          role: 'assistant',
          content: null,
          tool_calls: [{ id: 'c1', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }],
        },
        { role: 'tool', content: '{"ok":true,"result":"rain"}', tool_call_id: 'c1' },
      ],
      tools: [{ type: 'function', function: weather }],
      max_tokens: 321,
    });
  });

  it('no max_tokens without a cap; max_completion_tokens when asked; extra body fields pass through', async () => {
    fake.reply({ content: 'a' }, { content: 'b' });
    await call(openAiChatModel({ baseUrl: fake.url, model: 'm', stream: false }));
    await call(
      openAiChatModel({ baseUrl: `${fake.url}/`, model: 'm', stream: false, maxTokensField: 'max_completion_tokens', body: { seed: 7 } }),
      {
        maxOutputTokens: 9,
      },
    );
    expect(fake.requests[0]!.body).not.toHaveProperty('max_tokens');
    expect(fake.requests[0]!.headers.authorization).toBeUndefined();
    expect(fake.requests[1]!.body).toMatchObject({ max_completion_tokens: 9, seed: 7 });
    expect(fake.requests[1]!.body).not.toHaveProperty('max_tokens');
  });
});

describe('replies', () => {
  it('non-streamed: content, finish reason, usage mapped, cost from the prices per token', async () => {
    fake.reply({ content: 'it is sunny', usage: { prompt_tokens: 120, completion_tokens: 30 } });
    const model = openAiChatModel({ baseUrl: fake.url, model: 'm', stream: false, costPerToken: { input: 0.000001, output: 0.000004 } });
    const { reply, written } = await call(model);
    expect(reply).toEqual({
      message: { role: 'assistant', content: 'it is sunny' },
      usage: { inputTokens: 120, outputTokens: 30, costUsd: 120 * 0.000001 + 30 * 0.000004 },
      finishReason: 'stop',
    });
    expect(written).toEqual([]);
  });

  it('streamed by SSE: each content delta is written to the stream as it comes; the usage comes from the last event', async () => {
    fake.reply({ content: 'The quick brown fox', chunk: 4, usage: { prompt_tokens: 8, completion_tokens: 5 } });
    const model = openAiChatModel({ baseUrl: fake.url, model: 'm' });
    const { reply, written } = await call(model, { maxOutputTokens: 50 });
    expect(fake.requests[0]!.body).toMatchObject({ stream: true, stream_options: { include_usage: true }, max_tokens: 50 });
    expect(fake.requests[0]!.headers.accept).toBe('text/event-stream');
    expect(written).toEqual(['The ', 'quic', 'k br', 'own ', 'fox']);
    expect(reply).toEqual({
      message: { role: 'assistant', content: 'The quick brown fox' },
      usage: { inputTokens: 8, outputTokens: 5 },
      finishReason: 'stop',
    });
  });

  it('tool calls streamed in pieces across deltas are assembled by index', async () => {
    fake.reply({
      content: 'Checking.',
      toolCalls: [
        { id: 'call_a', name: 'get_weather', arguments: '{"city": "Oslo"}' },
        { id: 'call_b', name: 'get_weather', arguments: '{"city": "Bergen", "unit": "C"}' },
      ],
      chunk: 2,
    });
    const { reply } = await call(openAiChatModel({ baseUrl: fake.url, model: 'm' }), { tools: [weather] });
    expect(reply.finishReason).toBe('tool_calls');
    expect(reply.message).toEqual({
      role: 'assistant',
      content: 'Checking.',
      toolCalls: [
        { id: 'call_a', name: 'get_weather', arguments: '{"city": "Oslo"}' },
        { id: 'call_b', name: 'get_weather', arguments: '{"city": "Bergen", "unit": "C"}' },
      ],
    });
  });
});

describe('errors', () => {
  it('HTTP 500 and 429 are retryable MODEL_ERRORs with the status (and Retry-After); 400 is not retryable', async () => {
    fake.reply(
      { status: 500, message: 'upstream exploded' },
      { status: 429, message: 'slow down', retryAfterSeconds: 2 },
      { status: 400, message: 'bad' },
    );
    const model = openAiChatModel({ baseUrl: fake.url, model: 'm' });
    const server = await call(model).catch((error) => error);
    expect(server).toBeInstanceOf(ModelError);
    expect(server).toMatchObject({
      code: 'MODEL_ERROR',
      status: 500,
      retryable: true,
      message: expect.stringContaining('upstream exploded'),
    });
    const limited = await call(model).catch((error) => error);
    expect(limited).toMatchObject({ code: 'MODEL_ERROR', status: 429, retryable: true, details: { retryAfterMs: 2000 } });
    const bad = await call(model).catch((error) => error);
    expect(bad).toMatchObject({ code: 'MODEL_ERROR', status: 400, retryable: false, nonRetryable: true });
  });

  it('a reply without usage is a non-retryable MODEL_ERROR (a budget cannot meter it)', async () => {
    fake.reply({ content: 'x', usage: null }, { content: 'y', usage: null });
    await expect(call(openAiChatModel({ baseUrl: fake.url, model: 'm' }))).rejects.toMatchObject({ code: 'MODEL_ERROR', retryable: false });
    await expect(call(openAiChatModel({ baseUrl: fake.url, model: 'm', stream: false }))).rejects.toMatchObject({
      code: 'MODEL_ERROR',
      message: expect.stringContaining('no usage'),
    });
  });

  it('abort: the run signal cancels the request mid-stream; the server sees the client go', async () => {
    fake.reply({ content: 'a long answer that never ends', hang: true });
    const controller = new AbortController();
    const model = openAiChatModel({ baseUrl: fake.url, model: 'm' });
    const written: string[] = [];
    const pending = model.call({
      messages: [],
      tools: [],
      signal: controller.signal,
      stream: { write: (text) => (written.push(text), controller.abort('cancelled')) },
    });
    const error = await pending.catch((e) => e);
    expect(error).toMatchObject({ code: 'MODEL_ERROR', retryable: false, details: { aborted: true } });
    expect(written).toEqual(['a l']);
    await waitFor('the server saw the client go away', async () => fake.aborted === 1);
  });

  it('a refused connection is a retryable MODEL_ERROR without a status; a timeout too', async () => {
    const closed = await FakeOpenAi.start();
    const url = closed.url;
    await closed.stop();
    await expect(call(openAiChatModel({ baseUrl: url, model: 'm' }))).rejects.toMatchObject({
      code: 'MODEL_ERROR',
      status: null,
      retryable: true,
    });
    fake.reply({ content: 'slow', hang: true });
    await expect(call(openAiChatModel({ baseUrl: fake.url, model: 'm', timeoutMs: 100 }))).rejects.toMatchObject({
      code: 'MODEL_ERROR',
      retryable: true,
      details: { timedOut: true },
    });
  });

  it('bad options are CONFIG errors', () => {
    const config = expect.objectContaining({ code: 'CONFIG' });
    expect(() => openAiChatModel({ baseUrl: 'not a url', model: 'm' })).toThrow(config);
    expect(() => openAiChatModel({ baseUrl: fake.url, model: '' })).toThrow(config);
    expect(() => openAiChatModel({ baseUrl: fake.url, model: 'm', costPerToken: -1 })).toThrow(config);
    expect(() => openAiChatModel({ baseUrl: fake.url, model: 'm', timeoutMs: 0 })).toThrow(config);
    expect(() => openAiChatModel({ baseUrl: fake.url, model: 'has space' })).toThrow(config);
  });
});

describe('through ctx.generate', () => {
  const t = useTestEngine({ engine: false });
  const engines: Engine[] = [];
  afterAll(async () => {
    await Promise.all(engines.map((engine) => engine.close()));
  });

  it('a workflow calls the API once: the tool calls are parsed and checked, the reply is checkpointed and replayed', async () => {
    const clock = createTestClock('2030-01-01T00:00:00Z');
    const engine = createTestEngine({ connectionString: t.db.url, clock });
    engines.push(engine);
    fake.reply({
      toolCalls: [
        { id: 'c1', name: 'get_weather', arguments: '{"city":"Oslo"}' },
        { id: 'c2', name: 'get_weather', arguments: '{"city":' },
      ],
      usage: { prompt_tokens: 40, completion_tokens: 12 },
    });
    const tool = defineTool({
      name: 'get_weather',
      description: 'The weather in a city',
      input: z.object({ city: z.string() }),
      sideEffect: 'none',
      run: async ({ city }) => `rain in ${city}`,
    });
    const model = openAiChatModel({ baseUrl: fake.url, model: 'gpt-test', stream: false });
    const wf = engine.workflow({ name: 'openai-generate' }, async (ctx) => {
      const reply = await ctx.generate(model, { messages: [{ role: 'user', content: 'weather?' }], tools: [tool] });
      await ctx.sleep('replay', '1h');
      return reply;
    });
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    clock.advance('1h');
    await worker.drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect(fake.requests).toHaveLength(1);
    expect(fake.requests[0]!.body.tools).toEqual([{ type: 'function', function: tool.spec }]);
    const reply = run?.output as GenerateResult;
    expect(reply.usage).toEqual({ inputTokens: 40, outputTokens: 12 });
    expect(reply.message.toolCalls).toEqual([
      { id: 'c1', name: 'get_weather', arguments: { city: 'Oslo' } },
      { id: 'c2', name: 'get_weather', arguments: '{"city":', error: { code: 'INVALID_TOOL_ARGUMENTS', message: expect.any(String) } },
    ]);
  });
});
