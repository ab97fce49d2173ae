import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';
import { RETENTION_TASK } from '../core/retention.js';

/** How often the cluster applies runledger.retention by default: every 10 minutes. */
export const RETENTION_INTERVAL_MS_DEFAULT = 600_000;
/** Rows per kind each runledger.prune_due call removes at most. */
export const RETENTION_BATCH = 1000;
/** A pass stops after this many batches (the next pass goes on), so one pass stays bounded. */
export const RETENTION_BATCHES_MAX = 500;
/** How long a pass holds the cluster's lease without renewing it; each batch renews it. */
export const RETENTION_LEASE_MS = 120_000;

export interface RetentionPass {
  /** Batches run (calls of prune_due). */
  batches: number;
  /** Rows removed per kind, over the whole pass. */
  removed: Record<string, number>;
}

/**
 * The retention task: at most one worker of the cluster runs it at a time, once per
 * interval (runledger._maintenance_begin leases it). It calls runledger.prune_due in
 * batches until no kind fills a batch, renewing the lease after each one, and logs one
 * line per pass that removed anything. Returns the pass, or undefined when another
 * worker had it or it was not due.
 */
export function createRetention(options: {
  pool: pg.Pool;
  workerId: string;
  intervalMs: number;
  log: LogFunction;
  stopping: () => boolean;
  batch?: number;
}): () => Promise<RetentionPass | undefined> {
  const batch = options.batch ?? RETENTION_BATCH;
  return async () => {
    try {
      const begun = await options.pool.query(
        'select runledger._maintenance_begin(p_task => $1, p_worker_id => $2, p_every_ms => $3, p_lease_ms => $4) as ok',
        [RETENTION_TASK, options.workerId, options.intervalMs, RETENTION_LEASE_MS],
      );
      if (!begun.rows[0].ok) return undefined;
      const pass: RetentionPass = { batches: 0, removed: {} };
      let full = true;
      let leased = true;
      while (full && leased && pass.batches < RETENTION_BATCHES_MAX && !options.stopping()) {
        const result = await options.pool.query<{ kind: string; removed: string }>(
          'select kind, removed from runledger.prune_due(p_batch => $1)',
          [batch],
        );
        pass.batches++;
        full = false;
        for (const row of result.rows) {
          const n = Number(row.removed);
          pass.removed[row.kind] = (pass.removed[row.kind] ?? 0) + n;
          if (n >= batch) full = true;
        }
        if (full) {
          const renewed = await options.pool.query(
            'select runledger._maintenance_end(p_task => $1, p_worker_id => $2, p_result => $3, p_lease_ms => $4) as ok',
            [RETENTION_TASK, options.workerId, pass, RETENTION_LEASE_MS],
          );
          leased = renewed.rows[0].ok;
        }
      }
      await options.pool.query('select runledger._maintenance_end(p_task => $1, p_worker_id => $2, p_result => $3)', [
        RETENTION_TASK,
        options.workerId,
        pass,
      ]);
      const removed = Object.entries(pass.removed).filter(([, n]) => n > 0);
      if (removed.length > 0) {
        options.log('info', `retention: removed ${removed.map(([kind, n]) => `${n} ${kind}`).join(', ')} in ${pass.batches} batch(es)`, {
          ...pass,
        });
      }
      return pass;
    } catch (error) {
      options.log('warn', 'retention pass failed', { error: serializeError(error) });
      return undefined;
    }
  };
}
