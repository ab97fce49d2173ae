import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';
import type { EngineMetrics } from '../observe/metrics.js';
import { FINISHED_RUN_COLUMNS } from '../observe/finished.js';
import { TERMINAL_STATUSES } from '../observe/metrics.js';

/** A due timer this late is woken by the sweeper instead of a worker's own claim. */
export const WAKE_GRACE_MS = 2_000;
/** Most rows each maintenance function handles per sweep, so one sweep stays short. */
const SWEEP_BATCH = 1000;

const RECOVER_SQL = 'select runledger._recover_expired(p_limit => $1) as recovered';
/**
 * With metrics: the runs _recover_expired will handle, locked first (the same rows in the
 * same order, by the runs_lease_expiry index), so no other sweeper takes them meanwhile and
 * their outcome can be read in the same transaction.
 */
const EXPIRED_SQL =
  "select r.run_id from runledger.runs r where r.lease_expires_at < (select runledger.now()) and r.status in ('RUNNING', 'CANCELLING') " +
  'order by r.lease_expires_at limit $1 for update skip locked';
const TERMINAL = new Set<string>(TERMINAL_STATUSES);
const OUTCOME_SQL = `select ${FINISHED_RUN_COLUMNS} from runledger.runs r where r.run_id = any($1::text[])`;

/**
 * The maintenance every live worker runs on a timer; each function takes its rows
 * with SKIP LOCKED, so sweepers on several workers do not collide: runs whose lease
 * expired are recovered, deadlines enforced on runs no worker executes, queued runs
 * admitted, and due timers woken that no live worker claims (or that runledger.fake_now moved).
 */
export function createSweeper(pool: pg.Pool, log: LogFunction, metrics?: EngineMetrics): () => Promise<void> {
  return async () => {
    try {
      const recovered = metrics ? await recoverCounted(pool, metrics) : (await pool.query(RECOVER_SQL, [SWEEP_BATCH])).rows[0].recovered;
      if (recovered > 0) log('info', `recovered ${recovered} run(s) with expired leases`);
      await pool.query('select runledger._enforce_deadlines(p_limit => $1)', [SWEEP_BATCH]);
      await pool.query('select runledger._admit_all(p_limit => $1)', [SWEEP_BATCH]);
      await pool.query('select runledger._wake_due(p_limit => $1, p_grace_ms => $2)', [SWEEP_BATCH, WAKE_GRACE_MS]);
    } catch (error) {
      log('warn', 'sweep failed', { error: serializeError(error) });
    }
  };
}

/** _recover_expired in a transaction that also reads how each run it handled came out: runledger.recoveries, runs.finished. */
async function recoverCounted(pool: pg.Pool, metrics: EngineMetrics): Promise<number> {
  const client = await pool.connect();
  let broken = false;
  try {
    await client.query('begin');
    const expired = await client.query<{ run_id: string }>(EXPIRED_SQL, [SWEEP_BATCH]);
    if (expired.rows.length === 0) {
      await client.query('commit');
      return 0;
    }
    const recovered: number = (await client.query(RECOVER_SQL, [SWEEP_BATCH])).rows[0].recovered;
    const outcomes = await client.query(OUTCOME_SQL, [expired.rows.map((row) => row.run_id)]);
    await client.query('commit');
    for (const run of outcomes.rows) {
      if (run.status === 'PENDING' || run.status === 'CANCELLING') metrics.recovered('requeued');
      else if (TERMINAL.has(run.status)) {
        metrics.recovered(run.status === 'DEAD_LETTER' ? 'dead_letter' : 'ended');
        metrics.runFinished(run);
      }
    }
    return recovered;
  } catch (error) {
    broken = true;
    await client.query('rollback').catch(() => undefined);
    throw error;
  } finally {
    client.release(broken);
  }
}
