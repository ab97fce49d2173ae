/**
 * Read queries that more than one front end uses (the CLI's read commands and the web
 * console), kept here so that both show the same rows: one query, one meaning.
 */
import type pg from 'pg';

/** Queues with unfinished runs (runledger.queue_stats) and configured queues that have none. */
export const QUEUE_TOTALS_SQL = `
  select coalesce(s.queue_name, q.name) as queue_name, null::text as concurrency_key,
         coalesce(s.waiting_admission, 0)::int as waiting_admission, coalesce(s.dispatched, 0)::int as dispatched,
         coalesce(s.running, 0)::int as running, coalesce(s.waiting, 0)::int as waiting,
         extract(epoch from s.oldest_pending_age)::float8 as oldest_pending_s,
         q.concurrency, q.per_key_concurrency, q.rate_limit_max, q.rate_limit_period_ms, coalesce(q.paused, false) as paused
    from (select * from runledger.queue_stats where queue_total) s
    full join runledger.queues q on q.name = s.queue_name
   order by 1`;

/** One row per queue and concurrency key (concurrency_key '' for runs without one). */
export const QUEUE_KEYS_SQL = `
  select queue_name, concurrency_key, waiting_admission::int, dispatched::int, running::int, waiting::int,
         extract(epoch from oldest_pending_age)::float8 as oldest_pending_s,
         concurrency, per_key_concurrency, rate_limit_max, rate_limit_period_ms, coalesce(paused, false) as paused
    from runledger.queue_stats where not queue_total
   order by 1, 2`;

/**
 * A worker's state from its row (runledger.workers, aliased w), on the database's clock:
 *
 * - `live`: not stopped, heard from within its lease (what runledger.live_workers lists);
 * - `stopped`: stopped gracefully (`_stop_worker` set stopped_at while it was heartbeating);
 * - `lost`: silent for longer than its lease without stopping: killed, crashed or cut off.
 *   Its runs are recovered by the others. The sweep (`_recover_expired`) later sets its
 *   stopped_at too, two lease lengths after its last heartbeat; such a row is still `lost`,
 *   because its last heartbeat is more than a lease older than its stopped_at, which a
 *   graceful stop never leaves.
 */
export const WORKER_STATE_SQL = `case
    when w.stopped_at is null and w.last_heartbeat_at > runledger.now() - make_interval(secs => w.lease_ms / 1000.0) then 'live'
    when w.stopped_at is null or w.stopped_at - w.last_heartbeat_at > make_interval(secs => w.lease_ms / 1000.0) then 'lost'
    else 'stopped' end`;

/**
 * One run as psql shows it: its runledger.runs row with, under their table's name, its rows
 * of steps, operations, approvals, signals, events and its child runs, and `wait` (its
 * runledger.waiting row, or null). Undefined for an unknown run. Payloads as stored.
 */
export async function runDocument(pool: pg.Pool, runId: string): Promise<Record<string, unknown> | undefined> {
  const query = async (text: string) => (await pool.query(text, [runId])).rows;
  const [run] = await query('select * from runledger.runs where run_id = $1');
  if (!run) return undefined;
  const [steps, operations, wait, approvals, signals, children, events] = await Promise.all([
    query('select * from runledger.steps where run_id = $1 order by seq'),
    query('select * from runledger.operations where run_id = $1 order by seq'),
    query('select * from runledger.waiting where run_id = $1'),
    query('select * from runledger.approvals where run_id = $1 order by seq'),
    query('select * from runledger.signals where run_id = $1 order by received_at, signal_id'),
    query(
      'select run_id, workflow_name, workflow_version, status, created_at from runledger.runs where parent_run_id = $1 order by created_at, run_id',
    ),
    query('select * from runledger.events where run_id = $1 order by event_id'),
  ]);
  return { ...run, wait: wait[0] ?? null, steps, operations, approvals, signals, children, events };
}

/** A row of QUEUE_TOTALS_SQL or QUEUE_KEYS_SQL (runledger.queue_stats with the queue's limits). */
export interface QueueRow {
  queue_name: string;
  concurrency_key: string | null;
  waiting_admission: number;
  dispatched: number;
  running: number;
  waiting: number;
  oldest_pending_s: number | null;
  concurrency: number | null;
  per_key_concurrency: number | null;
  rate_limit_max: number | null;
  rate_limit_period_ms: number | null;
  paused: boolean;
}
