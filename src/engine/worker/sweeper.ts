import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';

/** A due timer this late is woken by the sweeper instead of a worker's own claim. */
export const WAKE_GRACE_MS = 2_000;
/** Most rows each maintenance function handles per sweep, so one sweep stays short. */
const SWEEP_BATCH = 1000;

/**
 * The maintenance every live worker runs on a timer; each function takes its rows
 * with SKIP LOCKED, so sweepers on several workers do not collide: runs whose lease
 * expired are recovered, deadlines enforced on runs no worker executes, queued runs
 * admitted, and due timers woken that no live worker claims (or that runledger.fake_now moved).
 */
export function createSweeper(pool: pg.Pool, log: LogFunction): () => Promise<void> {
  return async () => {
    try {
      const result = await pool.query('select runledger._recover_expired(p_limit => $1) as recovered', [SWEEP_BATCH]);
      if (result.rows[0].recovered > 0) log('info', `recovered ${result.rows[0].recovered} run(s) with expired leases`);
      await pool.query('select runledger._enforce_deadlines(p_limit => $1)', [SWEEP_BATCH]);
      await pool.query('select runledger._admit_all(p_limit => $1)', [SWEEP_BATCH]);
      await pool.query('select runledger._wake_due(p_limit => $1, p_grace_ms => $2)', [SWEEP_BATCH, WAKE_GRACE_MS]);
    } catch (error) {
      log('warn', 'sweep failed', { error: serializeError(error) });
    }
  };
}
