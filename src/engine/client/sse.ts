import type { IncomingMessage, ServerResponse } from 'node:http';
import { RunledgerError } from '../core/errors.js';
import type { ReadStreamOptions, StreamChunk } from './streams.js';

/** What streamToSse needs of the engine. */
export interface SseSource {
  readStream(runId: string, topic: string, options?: ReadStreamOptions): AsyncIterable<StreamChunk>;
}

export interface SseOptions {
  /** Where a client without Last-Event-ID starts; default 0. */
  fromOffset?: number;
  /** A comment line this often keeps proxies from closing an idle stream; default 15 s (0: none). */
  keepAliveMs?: number;
}

const STATUS_OF_CODE: Record<string, number> = { NOT_FOUND: 404, INVALID_INPUT: 400 };

/**
 * Serves a run's durable stream as server-sent events on a node:http response: each chunk
 * is `id: <offset>` and `data: <chunk as JSON>`; a browser's EventSource that reconnects
 * sends `Last-Event-ID` and gets the chunks after that offset, none twice. When the stream
 * ends (closed, or the run ended) it sends `event: end` (data `{"nextOffset": N}`) and ends
 * the response: the client should then close its EventSource, or it reconnects and gets
 * `end` again. An unknown run is a 404 and a bad topic or Last-Event-ID a 400, before any
 * event; an error later is an `event: error` with `{code, message}`. Resolves once the
 * response is over (ended here, or closed by the client, which stops the reading).
 */
export async function streamToSse(
  engine: SseSource,
  req: IncomingMessage,
  res: ServerResponse,
  runId: string,
  topic: string,
  options: SseOptions = {},
): Promise<void> {
  const lastEventId = req.headers['last-event-id'];
  let fromOffset = options.fromOffset ?? 0;
  if (typeof lastEventId === 'string' && lastEventId.trim() !== '') {
    const last = Number(lastEventId.trim());
    if (!Number.isSafeInteger(last) || last < 0)
      return refuse(res, 400, 'INVALID_INPUT', `Last-Event-ID ${JSON.stringify(lastEventId)} is not an offset`);
    fromOffset = last + 1;
  }
  const stop = new AbortController();
  res.on('close', () => stop.abort());
  let iterator: AsyncIterator<StreamChunk>;
  let first: Promise<IteratorResult<StreamChunk>>;
  try {
    iterator = engine.readStream(runId, topic, { fromOffset, signal: stop.signal })[Symbol.asyncIterator]();
    // The run is looked up by the first read, so an unknown one is still a plain HTTP error. The headers go out
    // after a short moment all the same: a client waits on an open stream, not on a silent request.
    first = iterator.next();
    await Promise.race([first, delay(250)]);
  } catch (error) {
    if (!res.headersSent) return refuse(res, statusOf(error), codeOf(error), (error as Error).message);
    return endWithError(res, error);
  }
  sendHeaders(res);
  const keepAliveMs = options.keepAliveMs ?? 15_000;
  const keepAlive = keepAliveMs > 0 ? setInterval(() => res.write(': keep-alive\n\n'), keepAliveMs) : undefined;
  keepAlive?.unref();
  let nextOffset = fromOffset;
  try {
    for (let result = await first; !result.done; result = await iterator.next()) {
      const { offset, chunk } = result.value;
      nextOffset = offset + 1;
      if (!res.write(`id: ${offset}\ndata: ${JSON.stringify(chunk)}\n\n`)) await drained(res);
      if (stop.signal.aborted) return;
    }
    if (!stop.signal.aborted) res.end(`event: end\ndata: ${JSON.stringify({ nextOffset })}\n\n`);
  } catch (error) {
    endWithError(res, error);
  } finally {
    clearInterval(keepAlive);
    await iterator.return?.();
  }
}

function delay(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms).unref());
}

function sendHeaders(res: ServerResponse): void {
  if (res.headersSent) return;
  res.writeHead(200, {
    'content-type': 'text/event-stream; charset=utf-8',
    'cache-control': 'no-cache, no-transform',
    connection: 'keep-alive',
    'x-accel-buffering': 'no',
  });
  res.flushHeaders();
}

function refuse(res: ServerResponse, status: number, code: string, message: string): void {
  res.writeHead(status, { 'content-type': 'application/json; charset=utf-8' });
  res.end(JSON.stringify({ error: { code, message } }));
}

function endWithError(res: ServerResponse, error: unknown): void {
  if (res.writableEnded) return;
  res.end(`event: error\ndata: ${JSON.stringify({ code: codeOf(error), message: (error as Error)?.message ?? String(error) })}\n\n`);
}

function codeOf(error: unknown): string {
  return error instanceof RunledgerError ? error.code : 'ERROR';
}

function statusOf(error: unknown): number {
  return STATUS_OF_CODE[codeOf(error)] ?? 500;
}

function drained(res: ServerResponse): Promise<void> {
  return new Promise((resolve) => {
    const done = () => {
      res.off('drain', done);
      res.off('close', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
  });
}
