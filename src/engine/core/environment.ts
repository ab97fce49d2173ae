import type { WorkflowContext } from './workflow-context.js';

/**
 * A run's execution environment (a workspace, a browser session, a sandbox), described by a
 * JSON manifest (`engine.workflow({ environment })`, docs/environments.md):
 * - `create` makes it once per run, as the run's first step (`@environment`): its manifest is
 *   checkpointed, and every attempt's manifest is recorded in runledger.environments first;
 * - `rehydrate` rebuilds it from the manifest on a worker process that does not have it (the
 *   run resumed there after a crash, a deploy, a long wait);
 * - `reclaim` releases it once the run has finished, whatever its status (cancelled and
 *   dead-lettered too): by the run's worker at once, or by any worker serving the workflow
 *   when that one is gone. Called for the manifest of every create attempt; make it
 *   idempotent (a worker that dies during a reclaim leaves it to be called again).
 */
export interface EnvironmentSpec<M = unknown> {
  /** Gets the run's input (as the workflow function does). */
  create: (ctx: WorkflowContext, input: any) => Promise<M> | M;
  rehydrate?: (ctx: WorkflowContext, manifest: M) => Promise<void> | void;
  /**
   * `signal` aborts when this worker lost the reclaim's lease (it stalled past the worker's
   * leaseMs): another worker may reclaim it by now. The lease is renewed while the reclaim
   * runs, however long.
   */
  reclaim: (manifest: M, info: { runId: string; status: string; envId: string; signal: AbortSignal }) => Promise<void> | void;
}
