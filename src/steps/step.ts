import { serializeError } from '../errors.js';
import { writeCheckpoint } from '../engine/checkpoint.js';
import type { Execution } from '../engine/execution.js';
import { failpoint } from '../engine/failpoints.js';
import { encodeOutput, replayCheckpoint, stepFailure } from './replay.js';

export interface StepInfo {
  /** Fires when the run is cancelled or its lease is lost. */
  signal: AbortSignal;
  /** 1 on the first execution of this step. */
  attempt: number;
  /** The last progress recorded by an earlier attempt of this step (heartbeats), if any. */
  progress: unknown;
}

export type StepFunction<T> = (info: StepInfo) => Promise<T> | T;

/**
 * `ctx.step(name, fn)`: at least once until its checkpoint commits, never again
 * after. The result is stored as JSON; the caller gets the stored value back
 * (also on the first execution), so replays see exactly what the first run saw.
 */
export async function runStep<T>(exec: Execution, name: string, fn: StepFunction<T>): Promise<T> {
  const position = exec.takeStep(name, 'step');
  if (!position) return exec.suspend();
  if (position.recorded) return replayCheckpoint<T>(position.recorded);
  if (exec.stopping) return exec.suspend();
  return exec.inStep(() => executeStep(exec, position.seq, name, fn));
}

async function executeStep<T>(exec: Execution, seq: number, name: string, fn: StepFunction<T>): Promise<T> {
  const startedAt = new Date();
  let outcome: { ok: true; text: string | undefined; value: unknown } | { ok: false; error: unknown };
  try {
    const result = await fn({ signal: exec.abortController.signal, attempt: 1, progress: undefined });
    outcome = { ok: true, ...encodeOutput(exec, name, result) };
  } catch (error) {
    outcome = { ok: false, error };
  }
  if (exec.haltReason) return exec.suspend();
  failpoint('before-checkpoint', name);

  const written = await writeCheckpoint(exec, {
    seq,
    name,
    kind: 'step',
    status: outcome.ok ? 'SUCCEEDED' : 'FAILED',
    outputText: outcome.ok ? outcome.text : undefined,
    error: outcome.ok ? undefined : outcome.error,
    attempts: 1,
    startedAt,
  });
  if (!written.ok) return exec.suspend();
  if (!outcome.ok) throw stepFailure(name, serializeError(outcome.error), outcome.error);
  return outcome.value as T;
}
