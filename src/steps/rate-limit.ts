import { ConfigError } from '../engine/core/errors.js';
import { haltOnDbError } from '../engine/run/halts.js';
import type { Execution } from '../engine/run/execution.js';
import { streamsFlushed } from './stream.js';
import { retryAfterMs } from './retry-after.js';

/** A rate limit key: what set_rate_limit accepts (sql/0017_rate_limits.sql). */
export const RATE_LIMIT_KEY_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$/;

/** A permit further off than this is waited for as a durable wait (no worker held); nearer, in memory. */
export const RATE_LIMIT_IN_MEMORY_MS = 2_000;

export function checkRateLimitKey(key: string | undefined, what: string): string | undefined {
  if (key === undefined) return undefined;
  if (typeof key !== 'string' || !RATE_LIMIT_KEY_PATTERN.test(key))
    throw new ConfigError(
      `${what}: rateLimit ${JSON.stringify(key)} is not 1 to 100 characters of [A-Za-z0-9_.:/-] starting with a letter or digit`,
    );
  return key;
}

export interface RatedPosition {
  seq: number;
  name: string;
  kind: 'step' | 'operation';
}

/**
 * Waits for a permit on a shared rate limit key before attempt `attempt` of the call at
 * `position`: true once given; false when the execution stopped meanwhile (cancel, lease lost,
 * shutdown) or the run was parked as a durable wait for the permit (the caller suspends).
 */
export async function acquirePermit(exec: Execution, key: string, position: RatedPosition, attempt: number): Promise<boolean> {
  for (;;) {
    if (exec.stopping) return false;
    let waitMs: number;
    try {
      const result = await exec.deps.pool.query<{ granted: boolean; wait_ms: string }>(
        'select granted, wait_ms from runledger._rate_limit_acquire(p_run_id => $1, p_token => $2, p_seq => $3, p_key => $4)',
        [exec.runId, exec.fencingToken.toString(), position.seq, key],
      );
      const answer = result.rows[0]!;
      if (answer.granted) return true;
      waitMs = Number(answer.wait_ms);
    } catch (error) {
      haltOnDbError(exec, error, position.name);
      return false;
    }
    if (waitMs > RATE_LIMIT_IN_MEMORY_MS) return parkForPermit(exec, key, position, attempt, waitMs);
    // Callers refused together would ask again together: a little jitter spreads them.
    const delay = waitMs + Math.floor(Math.random() * Math.min(50, waitMs / 4 + 1));
    const signal = exec.abortController.signal;
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, delay);
      signal.addEventListener('abort', () => (clearTimeout(timer), resolve()), { once: true });
    });
  }
}

async function parkForPermit(exec: Execution, key: string, position: RatedPosition, attempt: number, waitMs: number): Promise<false> {
  try {
    // Chunks an earlier attempt wrote are stored before the run parks (a parked run's writes are refused).
    const flushing = streamsFlushed(exec);
    if (flushing && !(await flushing)) return false;
    await exec.deps.pool.query(
      'select runledger._rate_limit_wait(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_kind => $5, p_attempt => $6, p_key => $7, p_wait_ms => $8)',
      [exec.runId, exec.fencingToken.toString(), position.seq, position.name, position.kind, attempt, key, waitMs],
    );
    exec.halt({ kind: 'suspended' });
  } catch (error) {
    haltOnDbError(exec, error, position.name);
  }
  return false;
}

/**
 * After a failed attempt on a key: an error that says when to call again (RetryAfterError, or
 * HTTP 429/503 with Retry-After) pauses the key for every run until then. A failure to record
 * the pause halts the execution like any failed write (replay asks again).
 */
export async function pauseOnRetryAfter(exec: Execution, key: string, error: unknown): Promise<boolean> {
  const ms = retryAfterMs(error);
  if (ms === undefined) return true;
  try {
    const serialized = exec.serializeError(error);
    await exec.deps.pool.query(
      'select runledger._rate_limit_pause(p_run_id => $1, p_token => $2, p_key => $3, p_ms => $4, p_reason => $5::jsonb)',
      [exec.runId, exec.fencingToken.toString(), key, ms, JSON.stringify({ error: exec.mask(serialized), retry_after_ms: ms })],
    );
    return true;
  } catch (dbError) {
    haltOnDbError(exec, dbError);
    return false;
  }
}
