import type { Execution } from '../engine/run/execution.js';

/** A run's durable stream on one topic (docs/streams.md). */
export interface DurableStream {
  readonly topic: string;
  /** Appends a chunk (any JSON value) at the stream's next offset. */
  write(chunk: unknown): Promise<void>;
  /** Marks the stream ended: readers stop after the last chunk. */
  close(): Promise<void>;
}

export function openStream(_exec: Execution, _topic: string): DurableStream {
  throw new Error('streams: not built yet');
}
