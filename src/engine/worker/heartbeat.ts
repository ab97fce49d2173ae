import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';
import type { Execution } from '../run/execution.js';

export interface HeartbeatOptions {
  pool: pg.Pool;
  workerId: string;
  leaseMs: number;
  /** The runs this worker executes right now. */
  executions: ReadonlySet<Execution>;
  log: LogFunction;
  /** A run is leased to this worker but not executed by it: the next claim should take it back. */
  reclaimUnexecuted: () => void;
  /** A start of this process in flight may have claimed this run for this worker (takeLocal): it is not executed yet. */
  isStarting: (runId: string) => boolean;
}

/**
 * One heartbeat renews the leases of all runs the worker owns in one statement
 * (runledger._heartbeat). A run missing from the answer was lost (recovered by another
 * worker after a pause): its execution halts at once. A heartbeat failing for longer
 * than the lease means ownership can no longer be proved, so user code stops early
 * (its writes would be fenced anyway). A heartbeat that gets no answer counts as failed
 * after a third of the lease: on a half-open connection (the peer gone without FIN or
 * RST) a query waits for a reply that never comes, and a heartbeat waiting with it
 * would never notice the lease running out.
 */
export function createHeartbeat(options: HeartbeatOptions): () => Promise<void> {
  const { pool, workerId, leaseMs, executions, log } = options;
  // The lease itself is stamped in SQL (runledger.now() + lease). The times here are this
  // worker's own, only compared with each other (and exec.claimedAt, also Date.now()) as
  // durations: how long heartbeats have failed. They never meet the database's clock.
  let lastHeartbeatOk = Date.now();
  return async () => {
    const sentAt = Date.now();
    try {
      const selfBeating = [...executions].filter((exec) => exec.selfHeartbeat).map((exec) => exec.runId);
      const result = await answeredWithin(
        pool.query('select runledger._heartbeat(p_worker_id => $1, p_lease_ms => $2, p_except => $3) as runs', [
          workerId,
          leaseMs,
          selfBeating,
        ]),
        Math.max(100, Math.floor(leaseMs / 3)),
      );
      lastHeartbeatOk = Date.now();
      const renewed = new Set<string>(result.rows[0].runs);
      for (const exec of executions) {
        // A run claimed after this heartbeat was sent may legitimately be missing from its answer.
        if (exec.claimedAt < sentAt && !renewed.has(exec.runId) && !selfBeating.includes(exec.runId)) {
          exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: lease no longer held by ${workerId}` });
        }
      }
      // A run leased to us that we do not execute was claimed by a claim whose answer we
      // never got: the next claim takes it back (claims are serial, so none is in flight then).
      // A run that a start of this process in flight claimed for us is not one: it is leased
      // to us before the start's answer arrives, and taken back it would run twice.
      const executingIds = new Set([...executions].map((exec) => exec.runId));
      if ([...renewed].some((runId) => !executingIds.has(runId) && !options.isStarting(runId))) options.reclaimUnexecuted();
    } catch (error) {
      log('warn', 'heartbeat failed', { error: serializeError(error) });
      if (Date.now() - lastHeartbeatOk > leaseMs) {
        for (const exec of executions)
          exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: heartbeat failing for longer than the lease` });
      }
    }
  };
}

/**
 * The query's answer, or an error after timeoutMs. The query itself goes on: the pool's
 * query_timeout (createEngine's queryTimeoutMs) ends it and discards its connection.
 */
async function answeredWithin<T>(query: Promise<T>, timeoutMs: number): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`heartbeat: no answer within ${timeoutMs} ms`)), timeoutMs);
  });
  query.catch(() => undefined); // answered after the deadline: nobody waits for it any more
  try {
    return await Promise.race([query, late]);
  } finally {
    clearTimeout(timer);
  }
}
