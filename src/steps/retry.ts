import { ConfigError } from '../engine/core/errors.js';
import { MAX_DURATION_MS } from '../engine/core/duration.js';
import { haltOnDbError } from '../engine/run/halts.js';
import type { Execution } from '../engine/run/execution.js';
import { streamsFlushed } from './stream.js';
import { retryAfterMs } from './retry-after.js';

export interface RetryPolicy {
  /** Attempts in all, the first included; default 1 (no retry). */
  maxAttempts?: number;
  /** Backoff before the second attempt; default 1 s. */
  initialDelayMs?: number;
  /** Backoff grows by this factor per attempt; default 2. */
  factor?: number;
  /** Backoff never exceeds this; default 5 min. */
  maxDelayMs?: number;
  /** Randomise each backoff between 50% and 100% of its value; default true. */
  jitter?: boolean;
  /** Decides whether an error is worth another attempt; default: every error except NonRetryableError. */
  retryable?: (error: unknown) => boolean;
  /** A backoff longer than this is a durable wait that frees the worker; default 2 s. */
  durableAfterMs?: number;
}

export const RETRY_DEFAULTS = Object.freeze({
  maxAttempts: 1,
  initialDelayMs: 1_000,
  factor: 2,
  maxDelayMs: 300_000,
  jitter: true,
  durableAfterMs: 2_000,
});

export type ResolvedRetryPolicy = Required<Omit<RetryPolicy, 'retryable'>> & Pick<RetryPolicy, 'retryable'>;

export function resolveRetryPolicy(policy: RetryPolicy | undefined, what: string): ResolvedRetryPolicy {
  const resolved = { ...RETRY_DEFAULTS, ...(policy ?? {}) };
  if (!Number.isInteger(resolved.maxAttempts) || resolved.maxAttempts < 1)
    throw new ConfigError(`${what}: retry.maxAttempts must be a whole number >= 1`);
  for (const key of ['initialDelayMs', 'maxDelayMs', 'durableAfterMs'] as const) {
    if (!Number.isFinite(resolved[key]) || resolved[key] < 0 || resolved[key] > MAX_DURATION_MS)
      throw new ConfigError(`${what}: retry.${key} must be a number of milliseconds from 0 to ${MAX_DURATION_MS}`);
  }
  if (!Number.isFinite(resolved.factor) || resolved.factor < 1) throw new ConfigError(`${what}: retry.factor must be >= 1`);
  return resolved;
}

/** Exponential backoff with a cap and optional jitter, before attempt `attempt + 1`. */
export function backoffMs(policy: ResolvedRetryPolicy, attempt: number): number {
  const raw = Math.min(policy.maxDelayMs, policy.initialDelayMs * policy.factor ** (attempt - 1));
  return Math.round(policy.jitter ? raw * (0.5 + Math.random() / 2) : raw);
}

export function isRetryable(policy: ResolvedRetryPolicy, error: unknown): boolean {
  if ((error as { nonRetryable?: unknown } | null)?.nonRetryable === true) return false;
  return policy.retryable ? policy.retryable(error) : true;
}

export type RetryDecision = { kind: 'fail' } | { kind: 'again'; attempt: number } | { kind: 'suspended' };

/**
 * After attempt `attempt` failed: records it (and spends the run's retry budget), then
 * either sleeps a short backoff in memory, or parks the run for a long one (a durable
 * wait that frees the worker), or says the step fails.
 */
export async function decideRetry(
  exec: Execution,
  policy: ResolvedRetryPolicy,
  position: { seq: number; name: string; kind: 'step' | 'operation' },
  attempt: number,
  error: unknown,
): Promise<RetryDecision> {
  if (attempt >= policy.maxAttempts || !isRetryable(policy, error)) return { kind: 'fail' };
  // A provider that said when to call again is not called before then.
  const delay = Math.max(backoffMs(policy, attempt), retryAfterMs(error) ?? 0);
  try {
    return await recordAndWait(exec, policy, position, attempt, error, delay);
  } catch (dbError) {
    haltOnDbError(exec, dbError);
    return { kind: 'suspended' };
  }
}

async function recordAndWait(
  exec: Execution,
  policy: ResolvedRetryPolicy,
  position: { seq: number; name: string; kind: 'step' | 'operation' },
  attempt: number,
  error: unknown,
  delay: number,
): Promise<RetryDecision> {
  const allowed = await exec.deps.pool.query(
    'select runledger._record_retry(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_attempt => $5, p_error => $6::jsonb, p_delay_ms => $7) as ok',
    [exec.runId, exec.fencingToken.toString(), position.seq, position.name, attempt, JSON.stringify(exec.serializeError(error)), delay],
  );
  if (!allowed.rows[0].ok) return { kind: 'fail' };
  // In memory only what setTimeout can wait (2^31 - 1 ms; a longer one fires at once): a longer backoff is durable.
  if (delay <= Math.min(policy.durableAfterMs, 2 ** 31 - 1)) {
    // A cancel or a lost lease ends the backoff at once; the caller then stops.
    const signal = exec.abortController.signal;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, delay);
      signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
    });
    if (exec.haltReason) return { kind: 'suspended' }; // shutdown, lease lost: no failure is recorded
    if (signal.aborted) return { kind: 'fail' }; // cancelled: the step ends with the error it had
    return { kind: 'again', attempt: attempt + 1 };
  }
  // The failed attempt's stream chunks are stored before the run parks (a parked run's writes are refused).
  const flushing = streamsFlushed(exec);
  if (flushing && !(await flushing)) return { kind: 'suspended' };
  await exec.deps.pool.query(
    'select runledger._retry_wait(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_kind => $5, p_attempt => $6, p_delay_ms => $7)',
    [exec.runId, exec.fencingToken.toString(), position.seq, position.name, position.kind, attempt, delay],
  );
  exec.halt({ kind: 'suspended' });
  return { kind: 'suspended' };
}
