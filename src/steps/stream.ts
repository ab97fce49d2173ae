import type { Execution } from '../engine/run/execution.js';
import { InvalidInputError, InvalidStateError, PayloadTooLargeError } from '../engine/core/errors.js';
import { toJsonText } from '../engine/core/json.js';
import { checkStreamTopic } from '../engine/core/stream-topic.js';
import { isConnectionError } from '../engine/db/pg-errors.js';
import { backoff } from '../engine/run/checkpoint.js';
import { haltOnDbError } from '../engine/run/halts.js';

/** A run's durable stream on one topic (docs/streams.md). */
export interface DurableStream {
  readonly topic: string;
  /**
   * Appends a chunk (any JSON value) at the stream's next offset. Need not be awaited:
   * chunks are buffered and stored in batches, in order, before the step that wrote them
   * records its checkpoint and before the run ends. The promise resolves once the chunk
   * is stored. A bad chunk (not JSON, over the payload limit), a closed stream or a run
   * that ended is refused at the call, synchronously, and nothing is stored.
   */
  write(chunk: unknown): Promise<void>;
  /** Marks the stream ended: readers stop after the last chunk. Later writes are refused; a second close is a no-op. */
  close(): Promise<void>;
}

/** At most this many chunks, and about this many bytes of them, in one batch (one round trip). */
export const STREAM_BATCH_CHUNKS = 1_000;
export const STREAM_BATCH_BYTES = 1024 * 1024;
const WRITE_TRIES = 5;

const WRITE_SQL =
  'select runledger._stream_write(p_run_id => $1, p_token => $2, p_topic => $3, p_attempt => $4, p_first_offset => $5, ' +
  'p_base_seq => $6, p_after_earlier => $7, p_seqs => $8::int[], p_chunks => $9::jsonb, p_close => $10) as next';

/** Chunks stored together, in one call of runledger._stream_write. */
interface Batch {
  seqs: number[];
  texts: string[];
  bytes: number;
  close: boolean;
  /** The offset is not known in this process: the database continues after the chunks of positions before baseSeq. */
  needsBase: boolean;
  baseSeq: number;
  /** baseSeq has a WAITING row (a step retried after a durable backoff): its earlier attempts' chunks stay before this batch. */
  afterEarlier: boolean;
  /** Taken by the sender: nothing more goes into it. */
  sealed: boolean;
  /** Resolves once the batch is stored; never settles if it cannot be (the execution halted). */
  stored: Promise<void>;
  resolve: () => void;
}

/**
 * The writer of one topic of one execution. Offsets are counted here, from what the
 * database says once per stream per execution (the first batch, whose offset the
 * database fills in), and again only where this execution stepped over positions it
 * replayed from their checkpoints: the chunks their first execution wrote were not
 * written again here, so the count must be read (docs/streams.md, "Offsets and replay").
 */
class StreamWriter implements DurableStream {
  readonly #exec: Execution;
  readonly topic: string;
  readonly #queue: Batch[] = [];
  #next: number | undefined;
  #lastSeq: number | undefined;
  #closed: Promise<void> | undefined;
  #draining: Promise<void> | undefined;
  /** A batch could not be stored (the execution halted): the stream lost chunks, nothing more is sent. */
  failed = false;

  constructor(exec: Execution, topic: string) {
    this.#exec = exec;
    this.topic = topic;
  }

  write(chunk: unknown): Promise<void> {
    const what = `ctx.stream(${JSON.stringify(this.topic)}).write()`;
    this.#exec.assertLive(what);
    if (this.#closed) throw new InvalidStateError(`${what}: stream ${JSON.stringify(this.topic)} of run ${this.#exec.runId} is closed`);
    const clear = toJsonText(chunk, `chunk of stream ${JSON.stringify(this.topic)}`);
    if (clear === undefined) throw new InvalidInputError(`${what}: a chunk is a JSON value; undefined is not one (write null instead)`);
    this.#exec.checkPayload(clear, `a chunk of stream ${JSON.stringify(this.topic)}`);
    // As stored (the codec's envelope, when there is one): the limit and the batches count these bytes.
    const text = this.#exec.payloads.text(clear);
    const bytes = Buffer.byteLength(text);
    if (bytes > this.#exec.deps.maxPayloadBytes) {
      throw new PayloadTooLargeError(
        `${what}: the chunk is ${bytes} bytes, over the payload limit of ${this.#exec.deps.maxPayloadBytes}; nothing was stored`,
        { details: { topic: this.topic, bytes, limit: this.#exec.deps.maxPayloadBytes } },
      );
    }
    const seq = currentPosition(this.#exec);
    const batch = this.#batchFor(seq, bytes);
    batch.seqs.push(seq);
    batch.texts.push(text);
    batch.bytes += bytes;
    this.#drainSoon();
    return batch.stored;
  }

  close(): Promise<void> {
    this.#exec.assertLive(`ctx.stream(${JSON.stringify(this.topic)}).close()`);
    if (this.#closed) return this.#closed;
    const batch = this.#batchFor(currentPosition(this.#exec), 0);
    batch.close = true;
    this.#closed = batch.stored;
    this.#drainSoon();
    return batch.stored;
  }

  /** True while chunks are buffered or on their way. */
  get busy(): boolean {
    return this.#queue.length > 0;
  }

  /** Resolves once every chunk written so far is stored (true), or could not be (false: the execution halted). */
  async flushed(): Promise<boolean> {
    while (this.#draining) await this.#draining;
    return !this.failed;
  }

  /** The open batch an item at position seq joins, or a new one. */
  #batchFor(seq: number, bytes: number): Batch {
    const last = this.#lastSeq;
    this.#lastSeq = seq;
    // A position replayed from its checkpoint lies between the last write and this one: its chunks were counted by an
    // earlier execution, not this one, so the database says where this write goes.
    const needsBase = last === undefined || (seq !== last && last < this.#exec.checkpoints.length);
    const open = this.#queue.at(-1);
    if (
      !needsBase &&
      open &&
      !open.sealed &&
      !open.close &&
      open.texts.length < STREAM_BATCH_CHUNKS &&
      (open.texts.length === 0 || open.bytes + bytes <= STREAM_BATCH_BYTES)
    ) {
      return open;
    }
    let resolve!: () => void;
    const stored = new Promise<void>((r) => (resolve = r));
    const batch: Batch = {
      seqs: [],
      texts: [],
      bytes: 0,
      close: false,
      needsBase,
      baseSeq: seq,
      afterEarlier: needsBase && this.#exec.checkpoints[seq]?.[2] === 'WAITING',
      sealed: false,
      stored,
      resolve,
    };
    this.#queue.push(batch);
    return batch;
  }

  /** Starts the sender after the current synchronous code, so a burst of writes leaves in one batch. */
  #drainSoon(): void {
    if (this.#draining || this.failed) return;
    this.#draining = Promise.resolve()
      .then(() => this.#drain())
      .finally(() => {
        this.#draining = undefined;
        // A write that came after the sender's last look at the queue, before this ran.
        if (this.#queue.length > 0) this.#drainSoon();
      });
  }

  /** One batch at a time, in order: each continues from the offset the previous one ended at. */
  async #drain(): Promise<void> {
    while (this.#queue.length > 0 && !this.failed) {
      const batch = this.#queue[0]!;
      batch.sealed = true;
      const halt = this.#exec.haltReason?.kind;
      const ok = halt !== 'lease_lost' && halt !== 'crashed' && (await this.#send(batch));
      this.#queue.shift();
      if (ok) batch.resolve();
      else this.failed = true;
    }
    // Whatever is left can never be stored in order: dropped, its promises never settle (the execution is over).
    if (this.failed) this.#queue.length = 0;
  }

  async #send(batch: Batch): Promise<boolean> {
    const exec = this.#exec;
    const values = [
      exec.runId,
      exec.fencingToken.toString(),
      this.topic,
      exec.attempt,
      batch.needsBase ? null : (this.#next ?? null),
      batch.baseSeq,
      batch.afterEarlier,
      batch.seqs,
      `[${batch.texts.join(',')}]`,
      batch.close,
    ];
    for (let attempt = 1; ; attempt++) {
      try {
        // Sent again after a lost connection, it changes nothing if the first one committed: the same offsets.
        const result = await exec.deps.pool.query({ name: 'runledger_stream_write', text: WRITE_SQL, values });
        this.#next = Number(result.rows[0].next);
        return true;
      } catch (error) {
        if (isConnectionError(error) && attempt < WRITE_TRIES) {
          await backoff(attempt);
          continue;
        }
        exec.log('warn', `run ${exec.runId}: stream ${this.topic}: ${batch.texts.length} chunk(s) not stored: ${(error as Error).message}`);
        haltOnDbError(exec, error);
        return false;
      }
    }
  }
}

/**
 * The step position a write belongs to: the step (or other ctx call) in flight, whose
 * body writes it, else the next position (the workflow body between two steps).
 */
function currentPosition(exec: Execution): number {
  const active = exec.activeSteps.at(-1);
  if (active !== undefined) return active;
  let position: number | undefined;
  for (const call of exec.pendingCalls.values()) position = call.position;
  return position ?? exec.stepsTaken;
}

const writers = new WeakMap<Execution, Map<string, StreamWriter>>();

/** ctx.stream(topic): the execution's one writer for the topic (every call with the same topic shares its offsets). */
export function openStream(exec: Execution, topic: string): DurableStream {
  checkStreamTopic(topic, 'ctx.stream');
  let byTopic = writers.get(exec);
  if (!byTopic) {
    writers.set(exec, (byTopic = new Map()));
    // The run's terminal write (run/finish.ts) waits for every chunk written.
    exec.onBeforeEnd(() => streamsFlushed(exec));
  }
  let writer = byTopic.get(topic);
  if (!writer) byTopic.set(topic, (writer = new StreamWriter(exec, topic)));
  return writer;
}

/**
 * Waits until every chunk the execution wrote so far is stored: called before a step's
 * checkpoint (a step whose checkpoint committed is never run again, so its chunks must
 * be in by then), before a durable wait parks the run, and before the run's terminal
 * write (a reader stops at a terminal run). Undefined when nothing is pending (the hot
 * path pays nothing); else true once stored, false when chunks were lost because the
 * execution halted (it must not go on as if they were stored).
 */
export function streamsFlushed(exec: Execution): Promise<boolean> | undefined {
  const byTopic = writers.get(exec);
  if (!byTopic) return undefined;
  let pending = false;
  let failed = false;
  for (const writer of byTopic.values()) {
    if (writer.busy) pending = true;
    if (writer.failed) failed = true;
  }
  if (!pending) return failed ? Promise.resolve(false) : undefined;
  return Promise.all([...byTopic.values()].map((writer) => writer.flushed())).then((all) => all.every(Boolean));
}
