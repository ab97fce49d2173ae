import type pg from 'pg';
import { Wakers } from './wakers.js';
import { fromPgError, InvalidInputError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';
import { TERMINAL_STATES, type RunStatus } from '../core/states.js';
import { checkStreamTopic } from '../core/stream-topic.js';
import { isConnectionError } from '../db/pg-errors.js';
import { FINISHED_CHANNEL, listen, STREAM_CHANNEL, type Listener } from '../db/listen.js';
import { FALLBACK_POLL_MS } from './results.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';

/** One chunk of a durable stream, as a reader receives it. */
export interface StreamChunk<T = unknown> {
  /** Its position in the stream, from 0, without gaps. */
  offset: number;
  /** The value the workflow wrote (its JSON form). */
  chunk: T;
  /** ctx.attempt of the execution that wrote it: it changes where another worker took the run over. */
  attempt: number;
}

export interface ReadStreamOptions {
  /** The first offset to deliver; default 0. A reconnecting reader passes the offset after the last one it received. */
  fromOffset?: number;
  /** Aborting it ends the iteration (quietly: the loop just ends). */
  signal?: AbortSignal;
  /** Chunks read per query; default 1000. */
  batchSize?: number;
}

const POLL_SQL =
  'select "offset", chunk, attempt, end_offset, run_status from runledger._stream_poll(p_run_id => $1, p_topic => $2, p_from_offset => $3, p_limit => $4)';
const BATCH_DEFAULT = 1_000;
/** Read again this often even while LISTEN is up: a wake-up lost some way we did not foresee delays a reader, never stops it. */
const SAFETY_POLL_MS = 10_000;
/** After a failed read (lost connection), read again on this backoff. */
const RETRY_MS: readonly number[] = [100, 250, 500, 1_000, 2_000, 5_000];

interface PollRow {
  offset: string | null;
  chunk: unknown;
  attempt: number | null;
  end_offset: string | null;
  run_status: RunStatus;
}

/**
 * How readers learn that a stream moved, without polling: one LISTEN connection per
 * engine (opened by the first reader) hears `runledger_stream` (a batch of chunks or a
 * close, payload the run id) and `runledger_finished` (the run ended: a reader of a
 * stream never closed stops there). While the connection is down, readers read on a
 * short backoff; when it is back (or lost) they all read once.
 */
export class StreamWatch {
  readonly #config: pg.PoolConfig;
  readonly #log: LogFunction;
  #listener: Promise<Listener> | undefined;
  readonly #wakers = new Wakers();
  closed = false;

  constructor(config: pg.PoolConfig, log: LogFunction) {
    this.#config = config;
    this.#log = log;
  }

  listen(): Promise<Listener> {
    this.#listener ??= listen(
      this.#config,
      this.#log,
      {
        [STREAM_CHANNEL]: (runId) => this.wake(runId),
        [FINISHED_CHANNEL]: (payload) => {
          for (const runId of payload.split(',')) this.wake(runId);
        },
      },
      () => this.#wakeAll(),
      () => this.#wakeAll(),
    );
    return this.#listener;
  }

  wake(runId: string): void {
    this.#wakers.wake(runId);
  }

  /** Readers waiting now (tests). */
  get waiting(): number {
    return this.#wakers.size;
  }

  add(runId: string, wake: () => void): void {
    this.#wakers.add(runId, wake);
  }

  remove(runId: string, wake: () => void): void {
    this.#wakers.remove(runId, wake);
  }

  async close(): Promise<void> {
    this.closed = true;
    this.#wakeAll();
    const listener = await this.#listener?.catch(() => undefined);
    await listener?.close();
  }

  #wakeAll(): void {
    this.#wakers.wakeAll();
  }
}

/**
 * engine.readStream: the chunks of a run's stream from `fromOffset`, each exactly once and
 * in offset order, live. It ends once the stream is closed and read to its end, or the run
 * is terminal and every chunk was read (the worker stores a run's chunks before it ends it);
 * an unknown run is NOT_FOUND. A lost connection (the reader's or a worker's) costs a
 * delay, never a chunk: the reader keeps its place and reads on from there.
 * Arguments are checked at the call (INVALID_INPUT); the database is read once iterated.
 */
export function readStream<T = unknown>(
  pool: pg.Pool,
  watch: StreamWatch,
  runId: string,
  topic: string,
  options: ReadStreamOptions = {},
  payloads: Payloads = NO_CODEC,
): AsyncIterable<StreamChunk<T>> {
  if (typeof runId !== 'string' || runId === '')
    throw new InvalidInputError(`readStream: a run id is required, got ${JSON.stringify(runId)}`);
  checkStreamTopic(topic, 'readStream');
  const fromOffset = options.fromOffset ?? 0;
  if (!Number.isSafeInteger(fromOffset) || fromOffset < 0)
    throw new InvalidInputError(`readStream: fromOffset must be a whole number >= 0, got ${JSON.stringify(options.fromOffset)}`);
  const batchSize = options.batchSize ?? BATCH_DEFAULT;
  if (!Number.isSafeInteger(batchSize) || batchSize < 1)
    throw new InvalidInputError(`readStream: batchSize must be a whole number >= 1, got ${JSON.stringify(options.batchSize)}`);
  return chunks<T>(pool, watch, runId, topic, fromOffset, batchSize, options.signal, payloads);
}

async function* chunks<T>(
  pool: pg.Pool,
  watch: StreamWatch,
  runId: string,
  topic: string,
  fromOffset: number,
  batchSize: number,
  signal: AbortSignal | undefined,
  payloads: Payloads,
): AsyncGenerator<StreamChunk<T>> {
  const listener = await watch.listen();
  let next = fromOffset;
  let polls = 0;
  let failures = 0;
  const aborted = signal ? new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true })) : undefined;
  for (;;) {
    if (signal?.aborted || watch.closed) return;
    // Armed before the read: a notification that comes while the chunks are read (or delivered) is not lost.
    let wake!: () => void;
    const woken = new Promise<void>((resolve) => (wake = resolve));
    watch.add(runId, wake);
    try {
      let rows: PollRow[];
      try {
        rows = (await pool.query<PollRow>({ name: 'runledger_stream_poll', text: POLL_SQL, values: [runId, topic, next, batchSize] })).rows;
        failures = 0;
      } catch (error) {
        if (!isConnectionError(error) || watch.closed) throw fromPgError(error);
        await pause(woken, aborted, RETRY_MS[Math.min(failures++, RETRY_MS.length - 1)]!);
        continue;
      }
      const state = rows[0]!;
      const end = state.end_offset === null ? null : Number(state.end_offset);
      const final = end !== null || TERMINAL_STATES.has(state.run_status);
      let gap = false;
      for (const row of rows) {
        if (row.offset === null) break;
        const offset = Number(row.offset);
        if (offset < next) continue;
        // Offsets are stored without gaps; one seen here is a batch not yet committed. Past the stream's end
        // (closed, or the run ended) nothing more can come: what is there is delivered.
        if (offset > next && !final) {
          gap = true;
          break;
        }
        // Decoded before the offset moves: a chunk this reader cannot decode (PAYLOAD_KEY_MISSING) ends the iteration at it.
        const chunk = payloads.decode<T>(row.chunk);
        next = offset + 1;
        yield { offset, chunk, attempt: row.attempt! };
        if (signal?.aborted) return;
      }
      if (end !== null && next >= end) return;
      const more = !gap && rows.length === batchSize && rows[0]!.offset !== null;
      if (more) continue;
      if (final && !gap && end === null) return; // the run ended and every chunk was read
      // Caught up: the wake-up armed before the read says when there is more (a batch committed since).
      const listening = listener.listening;
      polls = listening ? 0 : polls + 1;
      await pause(woken, aborted, listening ? SAFETY_POLL_MS : FALLBACK_POLL_MS[Math.min(polls, FALLBACK_POLL_MS.length) - 1]!);
    } finally {
      watch.remove(runId, wake);
    }
  }
}

/** Until woken, aborted, or ms have passed. */
async function pause(woken: Promise<void>, aborted: Promise<void> | undefined, ms: number): Promise<void> {
  let timer: NodeJS.Timeout | undefined;
  try {
    await Promise.race([woken, ...(aborted ? [aborted] : []), new Promise<void>((resolve) => (timer = setTimeout(resolve, ms)))]);
  } finally {
    clearTimeout(timer);
  }
}
