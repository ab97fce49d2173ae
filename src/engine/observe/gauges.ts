import type pg from 'pg';
import type { BatchObservableCallback, Meter, Observable } from '@opentelemetry/api';
import type { EngineMetrics } from './metrics.js';
import { WAIT_KINDS } from '../core/states.js';

/**
 * Unfinished runs per queue, status and wait kind, in one statement, plus every configured
 * queue (so an empty one reports 0). The predicate `created_at > '-infinity'` is that of
 * the partial index runs_console (status, workflow_name, run_id): the statement reads the index
 * entries of unfinished runs only, never the finished millions (sql/0011_views.sql).
 */
export const GAUGES_SQL = `
  select r.queue_name, r.status::text as status, r.wait_kind, count(*)::int as runs,
         extract(epoch from runledger.now() - min(r.created_at))::float8 as oldest_s
    from runledger.runs r
   where r.status in ('PENDING', 'RUNNING', 'CANCELLING', 'WAITING') and r.created_at > '-infinity'
   group by 1, 2, 3
  union all
  select q.name, null, null, 0, null from runledger.queues q`;

interface GaugeRow {
  queue_name: string;
  status: string | null;
  wait_kind: string | null;
  runs: number;
  oldest_s: number | null;
}

export interface Gauges {
  /** Stops reading the database on collection (a worker's stop). */
  remove(): void;
}

/**
 * The gauges read from the database when the provider collects: runs waiting by kind,
 * queue depth (PENDING), running (RUNNING and CANCELLING) and admission wait (age of the
 * oldest PENDING run) per queue. One batch callback: one statement per collection, for
 * all four. The figures are the database's, the same from every worker that reports them.
 */
export function observeGauges(pool: pg.Pool, metrics: EngineMetrics, served: readonly string[], onError: (error: unknown) => void): Gauges {
  // Several workers of one engine share one registration: still one statement per collection.
  let shared = registered.get(metrics);
  if (!shared) {
    const queues = new Map<string, number>();
    shared = { workers: 0, queues, remove: register(pool, metrics, queues, onError) };
    registered.set(metrics, shared);
  }
  const entry = shared;
  entry.workers++;
  for (const queue of served) entry.queues.set(queue, (entry.queues.get(queue) ?? 0) + 1);
  let removed = false;
  return {
    remove() {
      if (removed) return;
      removed = true;
      for (const queue of served) {
        const left = entry.queues.get(queue)! - 1;
        if (left > 0) entry.queues.set(queue, left);
        else entry.queues.delete(queue);
      }
      if (--entry.workers > 0) return;
      entry.remove();
      registered.delete(metrics);
    },
  };
}

const registered = new WeakMap<EngineMetrics, { workers: number; queues: Map<string, number>; remove: () => void }>();

/** `served`: the queues this engine's workers serve (by how many), reported with 0 when they have no runs. */
function register(pool: pg.Pool, metrics: EngineMetrics, served: Map<string, number>, onError: (error: unknown) => void): () => void {
  // Always an @opentelemetry/api Meter (createMetrics); EngineMetrics types it loosely for the published declarations.
  const meter = metrics.meter as Meter;
  const waiting = meter.createObservableGauge('runledger.runs.waiting', {
    description: 'Runs WAITING (holding no worker), by what they wait for',
    unit: '{run}',
  });
  const depth = meter.createObservableGauge('runledger.queue.depth', { description: 'Runs PENDING on the queue', unit: '{run}' });
  const running = meter.createObservableGauge('runledger.queue.running', {
    description: 'Runs executing on the queue (RUNNING or CANCELLING)',
    unit: '{run}',
  });
  const admissionWait = meter.createObservableGauge('runledger.queue.admission_wait', {
    description: 'Age of the oldest PENDING run of the queue (0 when none)',
    unit: 's',
  });
  const observables: Observable[] = [waiting, depth, running, admissionWait];
  const callback: BatchObservableCallback = async (result) => {
    let rows: GaugeRow[];
    try {
      rows = (await pool.query<GaugeRow>(GAUGES_SQL)).rows;
    } catch (error) {
      onError(error);
      return;
    }
    const queues = new Map<string, { pending: number; running: number; oldest: number }>();
    for (const queue of served.keys()) queues.set(queue, { pending: 0, running: 0, oldest: 0 });
    const kinds = new Map<string, number>(WAIT_KINDS.map((kind) => [kind, 0]));
    for (const row of rows) {
      const queue = queues.get(row.queue_name) ?? { pending: 0, running: 0, oldest: 0 };
      queues.set(row.queue_name, queue);
      if (row.status === 'PENDING') {
        queue.pending += row.runs;
        queue.oldest = Math.max(queue.oldest, row.oldest_s ?? 0);
      } else if (row.status === 'RUNNING' || row.status === 'CANCELLING') queue.running += row.runs;
      else if (row.status === 'WAITING') {
        const kind = row.wait_kind ?? 'unknown';
        kinds.set(kind, (kinds.get(kind) ?? 0) + row.runs);
      }
    }
    for (const [kind, runs] of kinds) result.observe(waiting, runs, { kind });
    for (const [queue, figures] of queues) {
      result.observe(depth, figures.pending, { queue });
      result.observe(running, figures.running, { queue });
      result.observe(admissionWait, Math.max(0, figures.oldest), { queue });
    }
  };
  meter.addBatchObservableCallback(callback, observables);
  return () => meter.removeBatchObservableCallback(callback, observables);
}
