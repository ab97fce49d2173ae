import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';
import type { EnvironmentSpec } from '../core/environment.js';
import { workflowKey, type Workflow } from '../core/workflow.js';

/** Environments leased per pass. */
const BATCH = 20;
/** After a failed reclaim, the environment is due again after this long. */
const RETRY_IN_MS = 10_000;

interface Due {
  env_id: string;
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  manifest: unknown;
  run_status: string;
}

/**
 * A worker's reclaimer: releases the environments of finished runs (WorkflowOptions.environment)
 * of the workflow versions it serves, leased one batch at a time (_environments_due), each
 * outcome recorded (_environment_reclaimed). run() looks for every due one (the sweep, for
 * runs whose worker is gone); run(runId) for one run's, at once, after its terminal write.
 */
export function createReclaimer(options: {
  pool: pg.Pool;
  workerId: string;
  served: ReadonlyArray<Workflow<any, any>>;
  log: LogFunction;
  /** The runs whose environment this process has: a reclaimed one is forgotten (a retried run rebuilds it). */
  local: Set<string>;
  /**
   * A reclaim's lease: the worker's run lease. Renewed every third of it while the reclaim
   * runs (two renewals may fail before it runs out); a worker that stops renewing loses it.
   */
  leaseMs: number;
}): { run: (runId?: string) => Promise<void>; settled: () => Promise<void> } {
  const specs = new Map<string, EnvironmentSpec>();
  for (const workflow of options.served)
    if (workflow.environment) specs.set(workflowKey(workflow.name, workflow.version), workflow.environment);
  const keys = [...specs.keys()];
  const inFlight = new Set<Promise<void>>();

  const reclaimOne = async (due: Due) => {
    const spec = specs.get(workflowKey(due.workflow_name, due.workflow_version));
    let error: unknown;
    // The lease is renewed while the reclaim runs; once lost (this worker stalled past it),
    // the reclaim is told to stop (signal): another worker may be reclaiming by now.
    const leaseLost = new AbortController();
    const renewal = setInterval(() => {
      options.pool
        .query<{ held: boolean }>('select runledger._environment_renew(p_env_id => $1, p_worker_id => $2, p_lease_ms => $3) as held', [
          due.env_id,
          options.workerId,
          options.leaseMs,
        ])
        .then(
          (result) => {
            if (!result.rows[0]?.held) leaseLost.abort(new Error(`the reclaim lease of environment ${due.env_id} was lost`));
          },
          () => {}, // the next renewal tries again before the lease runs out
        );
    }, options.leaseMs / 3);
    try {
      await spec!.reclaim(due.manifest, { runId: due.run_id, status: due.run_status, envId: due.env_id, signal: leaseLost.signal });
    } catch (caught) {
      error = caught;
      options.log('warn', `run ${due.run_id}: reclaiming environment ${due.env_id} failed; it is tried again in ${RETRY_IN_MS} ms`, {
        error: serializeError(caught),
      });
    }
    clearInterval(renewal);
    options.local.delete(due.run_id);
    await options.pool.query(
      'select runledger._environment_reclaimed(p_env_id => $1, p_worker_id => $2, p_error => $3::jsonb, p_retry_in_ms => $4)',
      [due.env_id, options.workerId, error === undefined ? null : JSON.stringify(serializeError(error)), RETRY_IN_MS],
    );
  };

  const pass = async (runId?: string) => {
    for (;;) {
      const due = await options.pool.query<Due>(
        'select * from runledger._environments_due(p_worker_id => $1, p_workflows => $2, p_limit => $3, p_lease_ms => $4, p_run_id => $5)',
        [options.workerId, keys, BATCH, options.leaseMs, runId ?? null],
      );
      await Promise.all(due.rows.map(reclaimOne));
      if (due.rows.length < BATCH) return;
    }
  };

  return {
    run: (runId) => {
      if (keys.length === 0) return Promise.resolve();
      const work = pass(runId).catch((error) => options.log('warn', 'reclaiming environments failed', { error: serializeError(error) }));
      inFlight.add(work);
      void work.finally(() => inFlight.delete(work));
      return work;
    },
    settled: async () => {
      await Promise.allSettled([...inFlight]);
    },
  };
}
