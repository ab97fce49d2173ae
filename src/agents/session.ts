import type { StepContext } from '../steps/context.js';
import type { Execution } from '../engine/run/execution.js';
import type { Duration } from '../engine/core/duration.js';

export type SessionRole = 'system' | 'user' | 'assistant' | 'tool';

/** One entry of a session's history, as appended. `content` is any JSON value. */
export interface SessionEntry {
  role: SessionRole;
  content: unknown;
}

/** An entry as stored: its place in the session and the run and step position that appended it. */
export interface StoredSessionEntry extends SessionEntry {
  seq: number;
  runId: string;
  stepPosition: number;
  createdAt: string;
}

export interface SessionOptions {
  /** How long to wait for another run holding the session; default: as long as it takes. */
  timeout?: Duration;
}

export interface Session {
  readonly id: string;
  history(): Promise<StoredSessionEntry[]>;
  append(entries: SessionEntry[]): Promise<void>;
  release(): Promise<void>;
}

export function openSession(_ctx: StepContext, _exec: Execution, _sessionId: string, _options?: SessionOptions): Promise<Session> {
  throw new Error('sessions: not built yet');
}
