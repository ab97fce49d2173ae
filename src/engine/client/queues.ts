import type pg from 'pg';
import { ConfigError, fromPgError } from '../core/errors.js';

export interface QueueOptions {
  /** Runs RUNNING at once in this queue, across all workers; null clears the limit. */
  concurrency?: number | null;
  /** Runs RUNNING at once per concurrency key (e.g. a tenant); null clears it. */
  perKeyConcurrency?: number | null;
  /** Admissions (starts) per period; null clears it. */
  rateLimit?: { max: number; periodMs: number } | null;
  paused?: boolean;
}

export interface QueueRecord {
  name: string;
  concurrency: number | null;
  perKeyConcurrency: number | null;
  rateLimitMax: number | null;
  rateLimitPeriodMs: number | null;
  paused: boolean;
}

/** engine.setQueue: one call of runledger.set_queue; keys left out keep their current value. */
export async function setQueue(pool: pg.Pool, name: string, options: QueueOptions): Promise<QueueRecord> {
  if (typeof options !== 'object' || options === null) throw new ConfigError('setQueue: options must be an object');
  const sql: Record<string, unknown> = {};
  if (options.concurrency !== undefined) sql.concurrency = options.concurrency;
  if (options.perKeyConcurrency !== undefined) sql.per_key_concurrency = options.perKeyConcurrency;
  if (options.rateLimit !== undefined) {
    sql.rate_limit_max = options.rateLimit?.max ?? null;
    sql.rate_limit_period_ms = options.rateLimit?.periodMs ?? null;
  }
  if (options.paused !== undefined) sql.paused = options.paused;
  try {
    const result = await pool.query('select (runledger.set_queue(p_name => $1, p_options => $2::jsonb)).*', [name, JSON.stringify(sql)]);
    const row = result.rows[0];
    return {
      name: row.name,
      concurrency: row.concurrency,
      perKeyConcurrency: row.per_key_concurrency,
      rateLimitMax: row.rate_limit_max,
      rateLimitPeriodMs: row.rate_limit_period_ms,
      paused: row.paused,
    };
  } catch (error) {
    throw fromPgError(error);
  }
}
