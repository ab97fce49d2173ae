import type { Execution } from '../engine/run/execution.js';
import { checkCommandOptions, runCommand, type ExecOptions, type ExecResult } from './command.js';
import { runStep } from './step.js';
import { allowedByPolicy } from './policy.js';

export type { ExecOptions, ExecResult } from './command.js';

/**
 * `ctx.exec(name, options)`: runCommand as a step. When the run is cancelled, its deadline
 * passes, the worker loses its lease or the attempt's timeout passes, the group gets SIGTERM,
 * then SIGKILL after `grace`; the step ends once the process has exited, and a cancelled run
 * ends only after that (past the cancel grace too). At least once, like a step: the result
 * (exit code or signal, output tails, duration) is checkpointed.
 */
export function runExec(exec: Execution, name: string, options: ExecOptions): Promise<ExecResult> {
  checkCommandOptions(name, options);
  if (!allowedByPolicy(exec, { kind: 'exec', name, command: options.command, args: options.args ?? [] })) return exec.suspend();
  return runStep<ExecResult>(
    exec,
    name,
    async ({ signal, attempt }) => {
      // Nothing aborts a step when the run's deadline passes (its next write is refused): the kill is timed here.
      const deadline = await exec.deps.pool.query<{ ms: string | null }>(
        `select ceil(extract(epoch from deadline_at - runledger.now()) * 1000)::bigint as ms from runledger.runs where run_id = $1`,
        [exec.runId],
      );
      const ms = deadline.rows[0]?.ms;
      return runCommand(options, {
        signal,
        name,
        attempt,
        ...(ms === null || ms === undefined ? {} : { deadlineMs: Math.max(0, Number(ms)) }),
        onKill: (killing) => exec.holdCancel(killing),
      });
    },
    {
      ...(options.retry ? { retry: options.retry } : {}),
      ...(options.rateLimit !== undefined ? { rateLimit: options.rateLimit } : {}),
    },
  );
}
