import type { LanguageModelV4StreamPart } from '@ai-sdk/provider';
import { readUIMessageStream, stepCountIs, streamText, tool, type UIMessage, type UIMessageChunk } from 'ai';
import { MockLanguageModelV4, simulateReadableStream } from 'ai/test';
import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { durableModel, durableTools, runledgerChatTransport, uiMessageStreamResponse, RUN_ID_HEADER } from '../../src/ai/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';

/**
 * The resumable UI stream: a streamText agent's run writes AI SDK UI message chunks to its
 * durable stream; uiMessageStreamResponse serves them as the UI message stream (SSE, offsets
 * as event ids); runledgerChatTransport, useChat's transport, reads them, picks a dropped
 * connection up from the next offset and, after a reload, reads the chat's run again.
 */
const t = useTestEngine();
const worker = queueWorkers(() => t.engine, 'ai-ui');

const usage = {
  inputTokens: { total: 4, noCache: 4, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 3, text: 3, reasoning: undefined },
};
const toolTurn: LanguageModelV4StreamPart[] = [
  { type: 'stream-start', warnings: [] },
  { type: 'tool-call', toolCallId: 'w1', toolName: 'weather', input: '{"city":"Oslo"}' },
  { type: 'finish', finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage },
];
const textTurn: LanguageModelV4StreamPart[] = [
  { type: 'stream-start', warnings: [] },
  { type: 'text-start', id: 'x' },
  { type: 'text-delta', id: 'x', delta: 'Oslo: ' },
  { type: 'text-delta', id: 'x', delta: '4 degrees.' },
  { type: 'text-end', id: 'x' },
  { type: 'finish', finishReason: { unified: 'stop', raw: 'stop' }, usage },
];

function chatWorkflow(name: string) {
  let turn = 0;
  const model = new MockLanguageModelV4({
    modelId: 'mock',
    doStream: async () => ({ stream: simulateReadableStream({ chunks: turn++ === 0 ? toolTurn : textTurn }) }),
  });
  return t.engine.workflow({ name, queue: 'ai-ui' }, async (ctx, input: { messages: Array<{ role: 'user'; content: string }> }) => {
    const result = streamText({
      model: durableModel(ctx, model),
      tools: durableTools(ctx, {
        weather: tool({ inputSchema: z.object({ city: z.string() }), execute: async ({ city }) => ({ city, celsius: 4 }) }),
      }),
      stopWhen: stepCountIs(3),
      messages: input.messages,
    });
    return await result.text;
  });
}

/** A fetch that routes the transport's requests to the route a user would write (POST starts a run, GET re-reads one). */
function routeFetch(wf: ReturnType<typeof chatWorkflow>, cutFirstAfter?: number, reopened: number[] = []): typeof fetch {
  let first = true;
  return (async (url: string | URL, init?: RequestInit) => {
    if (init?.method === 'POST') {
      const body = JSON.parse(String(init.body)) as { messages: UIMessage[] };
      const messages = body.messages.map((m) => ({
        role: 'user' as const,
        content: m.parts.map((p) => (p.type === 'text' ? p.text : '')).join(''),
      }));
      const run = await t.engine.start(wf, { messages });
      const response = uiMessageStreamResponse(t.engine, run.runId);
      if (!first || cutFirstAfter === undefined) return response;
      first = false;
      return cut(response, cutFirstAfter);
    }
    const params = new URL(String(url), 'http://localhost').searchParams;
    reopened.push(Number(params.get('from')));
    return uiMessageStreamResponse(t.engine, params.get('runId')!, { fromOffset: Number(params.get('from') ?? 0) });
  }) as typeof fetch;
}

/** The response with its connection dropped right after its first `events` server-sent events. */
function cut(response: Response, events: number): Response {
  const reader = response.body!.getReader();
  const encoder = new TextEncoder();
  let text = '';
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      let blocks: string[] = [];
      while (blocks.length - 1 < events) {
        const { value, done } = await reader.read();
        if (done) return controller.close();
        text += new TextDecoder().decode(value);
        blocks = text.split('\n\n');
      }
      controller.enqueue(encoder.encode(blocks.slice(0, events).join('\n\n') + '\n\n'));
      await reader.cancel();
      controller.error(new TypeError('terminated'));
    },
  });
  return new Response(body, { headers: response.headers });
}

async function messageOf(stream: ReadableStream<UIMessageChunk>): Promise<UIMessage> {
  let last: UIMessage | undefined;
  for await (const message of readUIMessageStream({ stream })) last = message;
  return last!;
}

const ask = { chatId: 'chat-1', trigger: 'submit-message' as const, messageId: undefined, abortSignal: undefined };
const userMessage: UIMessage = { id: 'u1', role: 'user', parts: [{ type: 'text', text: 'Weather in Oslo?' }] };

describe('the resumable UI message stream', () => {
  it('a chat answered by a run reaches useChat’s transport as UI message chunks: text, tool input and output', async () => {
    const wf = chatWorkflow('ai-ui-chat');
    await worker();
    const storage = new Map<string, string>();
    const transport = runledgerChatTransport({
      api: '/api/chat',
      fetch: routeFetch(wf),
      storage: { getItem: (k) => storage.get(k) ?? null, setItem: (k, v) => void storage.set(k, v) },
    });
    const message = await messageOf(await transport.sendMessages({ ...ask, messages: [userMessage] }));
    const text = message.parts
      .filter((p) => p.type === 'text')
      .map((p) => (p as { text: string }).text)
      .join('');
    expect(text).toBe('Oslo: 4 degrees.');
    const toolPart = message.parts.find((p) => p.type === 'tool-weather') as { state: string; input: unknown; output: unknown } | undefined;
    expect(toolPart).toMatchObject({ state: 'output-available', input: { city: 'Oslo' }, output: { city: 'Oslo', celsius: 4 } });

    // A reload: a new transport with the same storage finds the chat's run and reads the same answer again.
    const reloaded = runledgerChatTransport({
      api: '/api/chat',
      fetch: routeFetch(wf),
      storage: { getItem: (k) => storage.get(k) ?? null, setItem: (k, v) => void storage.set(k, v) },
    });
    const again = await reloaded.reconnectToStream({ chatId: 'chat-1' });
    expect(again).not.toBeNull();
    expect((await messageOf(again!)).parts).toEqual(message.parts);
    expect(await reloaded.reconnectToStream({ chatId: 'another-chat' })).toBeNull();
  });

  it('a dropped connection is picked up from the next offset: nothing lost, nothing twice', async () => {
    const wf = chatWorkflow('ai-ui-drop');
    const wf2 = chatWorkflow('ai-ui-drop-2');
    await worker();
    const whole = await messageOf(
      await runledgerChatTransport({ api: '/c', fetch: routeFetch(wf), storage: new MapStorage() }).sendMessages({
        ...ask,
        messages: [userMessage],
      }),
    );
    const reopened: number[] = [];
    const dropped = runledgerChatTransport({ api: '/c', fetch: routeFetch(wf2, 4, reopened), storage: new MapStorage() });
    const resumed = await messageOf(await dropped.sendMessages({ ...ask, messages: [userMessage] }));
    expect(resumed.parts).toEqual(whole.parts);
    // Four events were read (start, then offsets 0, 1 and 2): it asked again from offset 3.
    expect(reopened).toEqual([3]);
  });

  it('the response names its run and ends with [DONE] once the run’s stream ends', async () => {
    const wf = chatWorkflow('ai-ui-raw');
    await worker();
    const run = await t.engine.start(wf, { messages: [{ role: 'user', content: 'hi' }] });
    const response = uiMessageStreamResponse(t.engine, run.runId);
    expect(response.headers.get(RUN_ID_HEADER)).toBe(run.runId);
    expect(response.headers.get('content-type')).toContain('text/event-stream');
    const text = await response.text();
    expect(text.startsWith('data: {"type":"start"}\n\n')).toBe(true);
    expect(text.trimEnd().endsWith('data: [DONE]')).toBe(true);
    expect(text).toContain('"type":"tool-output-available"');
    const ids = [...text.matchAll(/^id: (\d+)$/gm)].map((m) => Number(m[1]));
    expect(ids).toEqual(ids.map((_, i) => i));
  });
});

class MapStorage {
  #map = new Map<string, string>();
  getItem(key: string) {
    return this.#map.get(key) ?? null;
  }
  setItem(key: string, value: string) {
    this.#map.set(key, value);
  }
}
