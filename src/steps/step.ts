import { monotonicMark, msSince, toMs, type Duration } from '../engine/core/duration.js';
import { ConfigError } from '../engine/core/errors.js';
import { flushPending, writeCheckpoint } from '../engine/run/checkpoint.js';
import type { Execution } from '../engine/run/execution.js';
import { attemptWithTimeout } from './attempt.js';
import { acquirePermit, checkRateLimitKey, pauseOnRetryAfter } from './rate-limit.js';
import { heartbeatStep } from './heartbeat.js';
import { streamsFlushed } from './stream.js';
import { encodeOutput, replayCheckpoint, stepFailure } from './replay.js';
import { decideRetry, resolveRetryPolicy, type RetryPolicy } from './retry.js';

export interface StepInfo {
  /** Fires when the run is cancelled or its lease is lost. */
  signal: AbortSignal;
  /** 1 on the first attempt of this step; grows with retries. */
  attempt: number;
  /** The last progress recorded by an earlier attempt of this step (heartbeats), if any. */
  progress: unknown;
  /** Renews the run's lease from inside a long step and records progress (same as ctx.heartbeat, for this step). */
  heartbeat: (progress?: unknown) => Promise<void>;
}

export type StepFunction<T> = (info: StepInfo) => Promise<T> | T;

export interface StepOptions {
  retry?: RetryPolicy;
  /**
   * How long one attempt may run: past it the attempt's signal fires and the attempt fails
   * with STEP_TIMEOUT, into the retry policy (a retry gets the full timeout again). It bounds
   * an attempt, not the step: the run's deadline bounds the run, and the lease only says the
   * worker is alive (a long step heartbeats). Default: none.
   */
  timeout?: Duration;
  /**
   * A shared rate limit key (set_rate_limit / engine.setRateLimit): each attempt first waits
   * for a permit on it, across every run and worker (a long wait holds no worker), and an
   * attempt that fails with a Retry-After pauses the key for every run. Default: none.
   */
  rateLimit?: string;
}

/** The longest timer Node.js keeps (about 24.8 days); a longer one would fire at once. */
const MAX_TIMEOUT_MS = 2_147_483_647;

/** A step's timeout in milliseconds: from 1 ms to about 24.8 days (Node's longest timer), else a ConfigError. */
export function stepTimeoutMs(timeout: Duration | undefined, what: string): number | undefined {
  if (timeout === undefined) return undefined;
  const ms = toMs(timeout, what);
  if (ms < 1 || ms > MAX_TIMEOUT_MS)
    throw new ConfigError(`${what}: ${JSON.stringify(timeout)} is not from 1 ms to ${MAX_TIMEOUT_MS} ms (about 24.8 days)`);
  return ms;
}

/** The attempt a step position resumes at: after a durable backoff its WAITING row holds the attempt reached. */
export function resumeAttempt(recorded: readonly unknown[] | undefined): number {
  if (recorded?.[2] !== 'WAITING') return 1;
  const output = (recorded[3] as [{ attempt?: number }] | null)?.[0];
  return (output?.attempt ?? 0) + 1;
}

/**
 * `ctx.step(name, fn)`: at least once until its checkpoint commits, never again
 * after. The result is stored as JSON; the caller gets the stored value back
 * (also on the first execution), so replays see exactly what the first run saw.
 */
export async function runStep<T>(exec: Execution, name: string, fn: StepFunction<T>, options: StepOptions = {}): Promise<T> {
  const policy = resolveRetryPolicy(options.retry, `step ${JSON.stringify(name)}`);
  const timeoutMs = stepTimeoutMs(options.timeout, `step ${JSON.stringify(name)}: timeout`);
  const rateLimit = checkRateLimitKey(options.rateLimit, `step ${JSON.stringify(name)}`);
  const position = exec.takeStep(name, 'step');
  if (!position) return exec.suspend();
  if (position.recorded && position.recorded[2] !== 'WAITING') return replayCheckpoint<T>(position.recorded);
  if (!(await flushPending(exec))) return exec.suspend();
  if (exec.stopping) return exec.noNewStep();
  const { seq } = position;
  const firstAttempt = resumeAttempt(position.recorded);
  return exec.inStep(async () => {
    for (let attempt = firstAttempt; ;) {
      if (rateLimit && !(await acquirePermit(exec, rateLimit, { seq, name, kind: 'step' }, attempt))) return exec.suspend<T>();
      const startedAt = monotonicMark();
      let outcome: { ok: true; text: string | undefined; value: unknown } | { ok: false; error: unknown };
      try {
        const result = await attemptWithTimeout(exec, name, attempt, timeoutMs, (signal) => {
          const info: StepInfo = {
            signal,
            attempt,
            progress: exec.progress[String(seq)],
            heartbeat: (progress) => heartbeatStep(exec, seq, progress),
          };
          return exec.trace ? exec.trace.child('step', name, seq, attempt, () => fn(info)) : fn(info);
        });
        outcome = { ok: true, ...encodeOutput(exec, name, result) };
      } catch (error) {
        outcome = { ok: false, error };
      }
      if (exec.haltReason) return exec.suspend<T>();
      if (!outcome.ok && rateLimit && !(await pauseOnRetryAfter(exec, rateLimit, outcome.error))) return exec.suspend<T>();
      if (!outcome.ok && !exec.cancelRequested) {
        const decision = await decideRetry(exec, policy, { seq, name, kind: 'step' }, attempt, outcome.error);
        if (decision.kind === 'suspended') return exec.suspend<T>();
        if (decision.kind === 'again') {
          attempt = decision.attempt;
          continue;
        }
      }
      if (exec.deps.crash?.hit('before-checkpoint', name)) return exec.suspend<T>();
      // The chunks this step wrote are stored before its checkpoint: once that commits the step never runs again.
      const flushing = streamsFlushed(exec);
      if (flushing && !(await flushing)) return exec.suspend<T>();
      const record = {
        seq,
        name,
        kind: 'step' as const,
        status: outcome.ok ? ('SUCCEEDED' as const) : ('FAILED' as const),
        outputText: outcome.ok ? outcome.text : undefined,
        error: outcome.ok ? undefined : outcome.error,
        attempts: attempt,
        startedAt,
      };
      exec.deps.metrics?.stepFinished(exec.workflowName, name, 'step', record.status, msSince(startedAt));
      if (outcome.ok && exec.inFlightCount === 1 && !exec.cancelRequested) {
        // Written before whatever the workflow does next, or with its completion.
        exec.pendingCheckpoint = record;
        return outcome.value as T;
      }
      const written = await writeCheckpoint(exec, record);
      if (!written.ok) return exec.suspend<T>();
      if (!outcome.ok) throw stepFailure(name, exec.serializeError(outcome.error), outcome.error);
      return outcome.value as T;
    }
  }, seq);
}
