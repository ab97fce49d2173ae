import type { EnvironmentSpec } from '../core/environment.js';
import type { WorkflowContext } from '../core/workflow-context.js';
import type { Execution } from './execution.js';

/** The step that creates a run's environment: the run's first position. */
export const ENVIRONMENT_STEP = '@environment';

/**
 * Before the workflow function: the run's environment, made by its first step (`create`,
 * each attempt's manifest recorded in runledger.environments before the checkpoint), or, when
 * that step is recorded and this worker process does not have the environment, rebuilt from the
 * checkpointed manifest (`rehydrate`, not a step: it runs on every worker that lacks it).
 */
export async function establishEnvironment(exec: Execution, ctx: WorkflowContext, spec: EnvironmentSpec, input: unknown): Promise<void> {
  const here = exec.deps.localEnvironments;
  const seq = exec.stepsTaken;
  let createdNow = false;
  const manifest = await ctx.step(ENVIRONMENT_STEP, async ({ attempt }) => {
    const made = (await spec.create(ctx, input)) ?? null;
    const text = JSON.stringify(made);
    await exec.deps.pool.query(
      'select runledger._environment_record(p_run_id => $1, p_token => $2, p_seq => $3, p_attempt => $4, p_manifest => $5::jsonb)',
      [exec.runId, exec.fencingToken.toString(), seq, attempt, text],
    );
    createdNow = true;
    return made;
  });
  exec.environment = manifest;
  if (!createdNow && !here?.has(exec.runId)) await spec.rehydrate?.(ctx, manifest);
  here?.add(exec.runId);
}
