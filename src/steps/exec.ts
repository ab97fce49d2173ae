import type { Execution } from '../engine/run/execution.js';
import {
  checkCommandOptions,
  runCommand,
  type CommandResult,
  type ExecOptions,
  type ExecOutputArtifact,
  type ExecResult,
} from './command.js';
import { storeBlob } from './blob.js';
import { runStep } from './step.js';
import { allowedByPolicy } from './policy.js';

export type { ExecOptions, ExecResult, ExecOutputArtifact } from './command.js';

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
      const position = exec.activeSteps.at(-1) ?? null;
      const ran = await runCommand(options, {
        signal,
        name,
        attempt,
        ...(ms === null || ms === undefined ? {} : { deadlineMs: Math.max(0, Number(ms)) }),
        onKill: (killing) => exec.holdCancel(killing),
      });
      return options.keepOutput ? keepOutput(exec, name, position, ran) : ran;
    },
    {
      ...(options.retry ? { retry: options.retry } : {}),
      ...(options.rateLimit !== undefined ? { rateLimit: options.rateLimit } : {}),
    },
  );
}

/**
 * The whole output as artifacts of the run, stored before the step's checkpoint (which names
 * them): an attempt that crashes before its checkpoint leaves its output stored, and the next
 * attempt's is stored beside it (the same row when it is the same content).
 */
async function keepOutput(exec: Execution, name: string, position: number | null, ran: CommandResult): Promise<ExecResult> {
  const { stdout, stderr, stdoutTruncated, stderrTruncated, ...result } = ran;
  const store = async (stream: 'stdout' | 'stderr', bytes: Buffer | undefined, truncated = false): Promise<ExecOutputArtifact | null> => {
    if (!bytes || bytes.length === 0) return null;
    // Kind 'value': content a checkpoint refers to, one row per content (a second attempt's same output is the same row).
    const stored = await storeBlob(exec, { name: `${name}.${stream}`, kind: 'value', bytes, position });
    return { artifactId: stored.row.artifact_id as string, sha256: stored.sha256, size: stored.size, truncated };
  };
  return {
    ...result,
    stdoutArtifact: await store('stdout', stdout, stdoutTruncated),
    stderrArtifact: await store('stderr', stderr, stderrTruncated),
  };
}
