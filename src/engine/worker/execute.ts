import { serializeError } from '../core/errors.js';
import { WorkflowContext } from '../../agents/context.js';
import { verifyOutput } from '../../steps/verify.js';
import { Execution, type CheckpointRow, type ExecutionDeps } from '../run/execution.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';
import type { ClaimedRun } from './dispatcher.js';
import type { Workflow } from '../core/workflow.js';
import { budgetStateOf } from '../run/budget-state.js';
import { release, RELEASE_DELAY_MS, releaseUnreadable } from '../run/finish.js';
import { runWorkflow, type OpenContext } from '../run/run-workflow.js';

export interface ExecuteOptions {
  deps: ExecutionDeps;
  workerId: string;
  leaseMs: number;
  resolveWorkflow: (name: string, version: string) => Workflow<any, any> | undefined;
  track: (exec: Execution) => void;
  untrack: (exec: Execution) => void;
}

/** How an execution ended, as far as this process knows: the committed output when the run SUCCEEDED here. */
export type ExecutionEnd = Execution['succeeded'];

/** The ctx of the workflows this worker runs: the step API and the agent API (agents/context.ts), verify through it. */
const openContext: OpenContext = (exec) => {
  const ctx = new WorkflowContext(exec);
  return { ctx, verify: (verify, output, input) => verifyOutput(exec, ctx, verify, output, input) };
};

/**
 * One claimed run (runledger._claim_batch gave it a new fencing token and a lease): its
 * payloads decoded and its Execution built from the claim, then handed to run/ (run-workflow.ts),
 * which replays the workflow and records how it ended. Never throws; resolves with the
 * committed output when this execution completed the run (undefined otherwise).
 */
export async function executeClaimed(run: ClaimedRun, options: ExecuteOptions): Promise<ExecutionEnd> {
  const { deps } = options;
  const runId = run.run_id;
  // The run's payloads in clear, once, before any workflow code runs: input, checkpoints, step progress.
  let decoded: ClaimedRun | undefined;
  let unreadable: unknown;
  try {
    decoded = decodeClaimed(run, deps.payloads ?? NO_CODEC);
  } catch (error) {
    unreadable = error;
  }
  const workflow = options.resolveWorkflow(run.workflow_name, run.workflow_version);
  const attempt = run.recovery_attempts + 1;
  const exec = new Execution(
    {
      runId,
      fencingToken: BigInt(run.fencing_token),
      attempt,
      checkpoints: (decoded ?? run).checkpoints,
      claimedAt: Date.now(),
      workflowName: run.workflow_name,
      workflowVersion: run.workflow_version,
      lineageId: run.lineage_id,
      limits: {
        maxSteps: run.max_steps,
        budget: run.budget === null ? null : Number(run.budget),
        budgetSpent: Number(run.budget_spent),
      },
      budget: budgetStateOf(run),
      progress: (decoded ?? run).progress,
      leaseMs: options.leaseMs,
      workflow,
      trace: deps.tracing?.startExecution(run, attempt),
    },
    deps,
  );
  recordTrace(exec);
  if (run.checkpoints.length > 0) deps.metrics?.resumed(run.workflow_name, run.workflow_version, run.recovery_attempts > 0);
  if (run.cancel_requested) exec.startCancelled();
  options.track(exec);
  try {
    if (decoded) await runWorkflow(exec, { input: decoded.input, cancelRequested: run.cancel_requested }, workflow, openContext);
    else await releaseUnreadable(exec, unreadable);
  } catch (error) {
    // Our own bookkeeping failed (database unreachable...): give the run back, or let its lease expire.
    exec.log('error', `run ${runId}: execution failed`, { error: serializeError(error) });
    await release(exec, RELEASE_DELAY_MS, 'infrastructure', error).catch(() => undefined);
  } finally {
    exec.end(exec.haltReason ? `this execution stopped: ${exec.haltReason.kind}` : 'this execution stopped');
    exec.trace?.end(exec.succeeded ? 'succeeded' : (exec.haltReason?.kind ?? 'ended'));
    options.untrack(exec);
  }
  return exec.succeeded;
}

/**
 * This execution's span, when a tracer provider records (observe/tracing.ts): its
 * traceparent is recorded on the run (fenced, not awaited) for the next execution to link to.
 */
function recordTrace(exec: Execution): void {
  const { trace } = exec;
  if (!trace) return;
  exec.deps.pool
    .query('select runledger._trace_execution(p_run_id => $1, p_token => $2, p_traceparent => $3)', [
      exec.runId,
      exec.fencingToken.toString(),
      trace.traceparent,
    ])
    .catch((error: unknown) =>
      exec.log('warn', `run ${exec.runId}: could not record the execution's span`, { error: serializeError(error) }),
    );
}

/**
 * The claimed run with its payloads decoded (a checkpoint's by its kind, see Payloads);
 * throws the codec's error (PAYLOAD_KEY_MISSING...) for one this worker cannot read.
 */
function decodeClaimed(run: ClaimedRun, payloads: Payloads): ClaimedRun {
  if (!payloads.enabled) return run;
  const checkpoints = run.checkpoints.map((row): CheckpointRow => {
    const [seq, name, status, output, error, kind] = row;
    return Array.isArray(output) ? [seq, name, status, [payloads.decodeStepOutput(kind, output[0])], error, kind] : row;
  });
  let progress = run.progress;
  if (progress) {
    progress = {};
    for (const [seq, value] of Object.entries(run.progress!)) progress[seq] = payloads.decode(value);
  }
  return { ...run, input: payloads.decode(run.input), checkpoints, progress };
}
