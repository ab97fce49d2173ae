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

export interface Heartbeat {
  /** Sends one heartbeat and acts on its answer. */
  beat(): Promise<void>;
  /**
   * Halts every execution once no heartbeat was answered for longer than the lease, even
   * while one is still waiting for its answer: on a half-open connection (the peer gone
   * without FIN or RST) a query gets neither an answer nor an error, and a check made
   * only when a heartbeat fails would never come.
   */
  checkLapse(): void;
}

/**
 * One heartbeat renews the leases of all runs the worker owns in one statement
 * (runledger._heartbeat). A run missing from the answer was lost (recovered by another
 * worker after a pause): its execution halts at once. A heartbeat failing for longer
 * than the lease means ownership can no longer be proved, so user code stops early
 * (its writes would be fenced anyway).
 */
export function createHeartbeat(options: HeartbeatOptions): Heartbeat {
  const { pool, workerId, leaseMs, executions, log } = options;
  // The lease itself is stamped in SQL (runledger.now() + lease). The times here are this
  // worker's own, only compared with each other (and exec.claimedAt, also Date.now()) as
  // durations: how long heartbeats have failed. They never meet the database's clock.
  let lastHeartbeatOk = Date.now();
  const checkLapse = () => {
    if (Date.now() - lastHeartbeatOk <= leaseMs) return;
    for (const exec of executions)
      exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: heartbeat failing for longer than the lease` });
  };
  const beat = async () => {
    const sentAt = Date.now();
    try {
      const selfBeating = [...executions].filter((exec) => exec.selfHeartbeat).map((exec) => exec.runId);
      const result = await pool.query('select runledger._heartbeat(p_worker_id => $1, p_lease_ms => $2, p_except => $3) as runs', [
        workerId,
        leaseMs,
        selfBeating,
      ]);
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
      checkLapse();
    }
  };
  return { beat, checkLapse };
}
