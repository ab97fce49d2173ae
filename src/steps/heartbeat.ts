import { RunledgerError } from '../engine/core/errors.js';
import { observeRunStatus, haltOnDbError } from '../engine/run/halts.js';
import type { Execution } from '../engine/run/execution.js';
import { toJsonText } from '../engine/core/json.js';

/**
 * A long step proves it is alive: renews the run's lease and stores its progress,
 * so the attempt that takes over after a crash or a hang can continue from there.
 * From the first heartbeat until the step ends, only the step keeps the lease alive:
 * a step that stops heartbeating is taken over once the lease expires, even though
 * its worker process is still healthy.
 */
export async function heartbeatStep(exec: Execution, seq: number, progress?: unknown): Promise<void> {
  if (exec.haltReason) return;
  const clearProgress = progress === undefined ? null : (toJsonText(progress, 'heartbeat progress') ?? null);
  exec.checkPayload(clearProgress, 'heartbeat progress');
  const progressText = clearProgress === null ? null : (exec.payloads.optionalText(clearProgress) ?? null);
  exec.selfHeartbeat = true;
  try {
    const result = await exec.deps.pool.query(
      'select runledger._heartbeat_step(p_run_id => $1, p_token => $2, p_seq => $3, p_progress => $4::jsonb, p_lease_ms => $5) as status',
      [exec.runId, exec.fencingToken.toString(), seq, progressText, exec.leaseMs],
    );
    observeRunStatus(exec, result.rows[0].status);
  } catch (error) {
    haltOnDbError(exec, error);
  }
}

/** ctx.heartbeat: speaks for the newest step in flight. */
export function heartbeatCurrent(exec: Execution, progress?: unknown): Promise<void> {
  const seq = exec.activeSteps.at(-1);
  if (seq === undefined) throw new RunledgerError('NOT_IN_STEP', 'ctx.heartbeat is for use inside a step (ctx.step or ctx.operation)');
  return heartbeatStep(exec, seq, progress);
}
