import type pg from 'pg';
import { toMs, type Duration } from '../core/duration.js';
import { ConfigError, fromPgError } from '../core/errors.js';

export interface RateLimitOptions {
  /** Calls let through in any window of `per`, across every run and worker (1 to 1,000,000). */
  max: number;
  /** The window: a duration from 1 ms to 1 day ('1s', '1m', 60_000). */
  per: Duration;
}

export interface RateLimitRecord {
  key: string;
  maxCalls: number | null;
  perMs: number | null;
  pausedUntil: Date | null;
  pauseReason: unknown;
}

const DAY_MS = 86_400_000;

function record(row: Record<string, unknown>): RateLimitRecord {
  return {
    key: row.key as string,
    maxCalls: row.max_calls as number | null,
    perMs: row.per_ms === null ? null : Number(row.per_ms),
    pausedUntil: (row.paused_until as Date | null) ?? null,
    pauseReason: row.pause_reason ?? null,
  };
}

/** engine.setRateLimit: runledger.set_rate_limit; `null` takes the limit off (the key keeps only pauses). */
export async function setRateLimit(pool: pg.Pool, key: string, options: RateLimitOptions | null): Promise<RateLimitRecord> {
  let max: number | null = null;
  let perMs: number | null = null;
  if (options !== null) {
    if (typeof options !== 'object') throw new ConfigError(`setRateLimit(${JSON.stringify(key)}): options must be { max, per } or null`);
    if (!Number.isInteger(options.max) || options.max < 1 || options.max > 1_000_000)
      throw new ConfigError(
        `setRateLimit(${JSON.stringify(key)}): max must be a whole number from 1 to 1000000, not ${String(options.max)}`,
      );
    perMs = toMs(options.per, `setRateLimit(${JSON.stringify(key)}): per`);
    if (perMs < 1 || perMs > DAY_MS)
      throw new ConfigError(`setRateLimit(${JSON.stringify(key)}): per must be from 1 ms to 1 day, not ${JSON.stringify(options.per)}`);
    max = options.max;
  }
  try {
    const result = await pool.query(
      "select k.*, extract(epoch from k.per) * 1000 as per_ms from runledger.set_rate_limit(p_key => $1, p_max => $2, p_per => $3 * interval '1 millisecond') k",
      [key, max, perMs],
    );
    return record(result.rows[0]);
  } catch (error) {
    throw fromPgError(error);
  }
}

/** engine.pauseRateLimit: runledger.pause_rate_limit; no call on the key before `until` (a Date, or a duration from now). */
export async function pauseRateLimit(pool: pg.Pool, key: string, until: Date | Duration, note?: string): Promise<RateLimitRecord> {
  const at = until instanceof Date ? until : new Date(Date.now() + toMs(until, `pauseRateLimit(${JSON.stringify(key)})`));
  if (Number.isNaN(at.getTime())) throw new ConfigError(`pauseRateLimit(${JSON.stringify(key)}): until is not a valid time`);
  try {
    const result = await pool.query(
      'select k.*, extract(epoch from k.per) * 1000 as per_ms from runledger.pause_rate_limit(p_key => $1, p_until => $2, p_note => $3) k',
      [key, at, note ?? null],
    );
    return record(result.rows[0]);
  } catch (error) {
    throw fromPgError(error);
  }
}
