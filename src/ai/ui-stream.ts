import type { ChatTransport, UIMessage, UIMessageChunk } from 'ai';
import type { Engine } from '../index.js';
import { UI_STREAM_TOPIC } from './ui-chunks.js';

/** The response header that names the run a chat request started. */
export const RUN_ID_HEADER = 'x-runledger-run-id';

export interface UiStreamOptions {
  /** The durable stream topic; default 'ui' (what durableModel and durableTools write to). */
  topic?: string;
  /** Where to start; default 0 (the whole answer, as a reloaded page needs it). */
  fromOffset?: number;
  /** Stops reading (the client went away). */
  signal?: AbortSignal;
}

/**
 * A run's durable UI stream as the AI SDK's UI message stream over server-sent events: a
 * web `Response` for a route handler (Next.js, Hono, any fetch server). Each chunk is sent
 * with its offset as the event id, so a client that lost the connection asks again from
 * the next offset; the stream ends with `finish` and `[DONE]` once the run's stream ends
 * (the run finished, or its stream was closed). The response names the run in the
 * `x-runledger-run-id` header.
 */
export function uiMessageStreamResponse(engine: Pick<Engine, 'readStream'>, runId: string, options: UiStreamOptions = {}): Response {
  const topic = options.topic ?? UI_STREAM_TOPIC;
  const fromOffset = options.fromOffset ?? 0;
  const stop = new AbortController();
  options.signal?.addEventListener('abort', () => stop.abort(), { once: true });
  const encoder = new TextEncoder();
  const body = new ReadableStream<Uint8Array>({
    async start(controller) {
      const send = (text: string) => controller.enqueue(encoder.encode(text));
      try {
        if (fromOffset === 0) send(`data: ${JSON.stringify({ type: 'start' })}\n\n`);
        for await (const { offset, chunk } of engine.readStream(runId, topic, { fromOffset, signal: stop.signal })) {
          send(`id: ${offset}\ndata: ${JSON.stringify(chunk)}\n\n`);
        }
        if (!stop.signal.aborted) send(`data: ${JSON.stringify({ type: 'finish' })}\n\ndata: [DONE]\n\n`);
      } catch (error) {
        send(`data: ${JSON.stringify({ type: 'error', errorText: (error as Error)?.message ?? String(error) })}\n\n`);
      }
      controller.close();
    },
    cancel() {
      stop.abort();
    },
  });
  return new Response(body, {
    headers: {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache, no-transform',
      'x-vercel-ai-ui-message-stream': 'v1',
      'x-accel-buffering': 'no',
      [RUN_ID_HEADER]: runId,
    },
  });
}

export interface RunledgerChatTransportOptions {
  /** The route: POST starts a run and streams it (uiMessageStreamResponse); GET `?runId=&from=` streams a run again. */
  api: string;
  headers?: Record<string, string>;
  /** More fields for the POST body. */
  body?: Record<string, unknown>;
  fetch?: typeof fetch;
  /** Where the transport remembers each chat's run across a page reload; default sessionStorage when there is one. */
  storage?: Pick<Storage, 'getItem' | 'setItem'>;
}

/**
 * A `useChat` transport for chats whose answers are runledger runs: sending starts a run
 * (the route's POST) and reads its UI stream; `resumeStream()` after a page reload finds the
 * chat's last run (remembered in sessionStorage) and reads its stream again from the start,
 * while the run goes on on the server whether or not a browser is listening. A dropped
 * connection is picked up from the last offset read.
 */
export function runledgerChatTransport<M extends UIMessage = UIMessage>(options: RunledgerChatTransportOptions): ChatTransport<M> {
  const doFetch = options.fetch ?? fetch;
  const storage = options.storage ?? (globalThis as { sessionStorage?: Storage }).sessionStorage;
  const runs = new Map<string, string>();
  const keyOf = (chatId: string) => `runledger:chat:${chatId}`;
  const remember = (chatId: string, runId: string) => {
    runs.set(chatId, runId);
    storage?.setItem(keyOf(chatId), runId);
  };
  const runOf = (chatId: string) => runs.get(chatId) ?? storage?.getItem(keyOf(chatId)) ?? undefined;
  const reopen = (runId: string, from: number, signal?: AbortSignal) =>
    doFetch(`${options.api}?${new URLSearchParams({ runId, from: String(from) })}`, {
      headers: options.headers ?? {},
      ...(signal ? { signal } : {}),
    });

  return {
    resumeStreamIsReplay: true,
    async sendMessages({ chatId, messages, trigger, messageId, abortSignal, body, headers }) {
      const response = await doFetch(options.api, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...options.headers, ...(headers as Record<string, string> | undefined) },
        body: JSON.stringify({ ...options.body, ...body, id: chatId, chatId, messages, trigger, messageId }),
        ...(abortSignal ? { signal: abortSignal } : {}),
      });
      if (!response.ok || !response.body) throw new Error(`chat request failed: HTTP ${response.status} ${await response.text()}`);
      const runId = response.headers.get(RUN_ID_HEADER);
      if (runId) remember(chatId, runId);
      return chunksOf(response, runId ? (from) => reopen(runId, from, abortSignal) : undefined);
    },
    async reconnectToStream({ chatId }) {
      const runId = runOf(chatId);
      if (!runId) return null;
      const response = await reopen(runId, 0);
      if (response.status === 404 || !response.body) return null;
      return chunksOf(response, (from) => reopen(runId, from));
    },
  };
}

/**
 * The UI message chunks of an SSE response. When the connection drops before `[DONE]`, it
 * asks again from the offset after the last one read (`reopen`), so nothing is lost or repeated.
 */
function chunksOf(first: Response, reopen: ((from: number) => Promise<Response>) | undefined): ReadableStream<UIMessageChunk> {
  let next = 0;
  let done = false;
  return new ReadableStream<UIMessageChunk>({
    async start(controller) {
      let response = first;
      for (let tries = 0; ; tries++) {
        try {
          for await (const event of events(response)) {
            if (event.data === '[DONE]') {
              done = true;
              break;
            }
            if (event.id !== undefined) next = Number(event.id) + 1;
            controller.enqueue(JSON.parse(event.data) as UIMessageChunk);
          }
        } catch (error) {
          if (!reopen || tries >= 5) return controller.error(error);
        }
        if (done || !reopen || tries >= 5) break;
        response = await reopen(next);
      }
      controller.close();
    },
  });
}

async function* events(response: Response): AsyncGenerator<{ id?: string; data: string }> {
  const decoder = new TextDecoder();
  let buffer = '';
  for await (const bytes of response.body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(bytes, { stream: true });
    for (let end = buffer.indexOf('\n\n'); end !== -1; end = buffer.indexOf('\n\n')) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      let id: string | undefined;
      const data: string[] = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('id:')) id = line.slice(3).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).trimStart());
      }
      if (data.length) yield { ...(id !== undefined ? { id } : {}), data: data.join('\n') };
    }
  }
}
