import type pg from 'pg';
import { Logger, run, type Runner, type Task } from 'graphile-worker';

/**
 * The only file that talks to graphile-worker. Its schema is foreign: we call its
 * public `add_job` (from SQL, in runledger._dispatch) and its runner, never its
 * private tables.
 */
export const GRAPHILE_SCHEMA = 'graphile_worker';

/** The task that dispatches runs of one workflow version in one queue (same as SQL runledger._task_identifier). */
export function taskIdentifier(queue: string, workflow: string, version: string): string {
  return `runledger:${queue}:${workflow}@${version}`;
}

export function graphileLogger(onError: (message: string) => void = () => {}): Logger {
  return new Logger(() => (level, message) => {
    if (level === 'error') onError(message);
  });
}

export interface DispatchRunnerOptions {
  pool: pg.Pool;
  concurrency: number;
  pollIntervalMs: number;
  /** task identifier -> handler(runId); a handler must never throw (a dispatch is never retried by graphile-worker). */
  tasks: Map<string, (runId: string) => Promise<void>>;
  onError: (message: string) => void;
}

export async function startDispatchRunner(options: DispatchRunnerOptions): Promise<Runner> {
  const taskList: Record<string, Task> = {};
  for (const [identifier, handler] of options.tasks) {
    taskList[identifier] = async (payload) => {
      const runId = (payload as { runId?: unknown } | null)?.runId;
      if (typeof runId === 'string') await handler(runId);
    };
  }
  return run({
    pgPool: options.pool,
    schema: GRAPHILE_SCHEMA,
    concurrency: options.concurrency,
    pollInterval: options.pollIntervalMs,
    noHandleSignals: true,
    taskList,
    logger: graphileLogger(options.onError),
    preset: {
      worker: {
        // Batched completion retries any error (a terminated connection included) instead
        // of leaving an unhandled rejection; delay 0 batches within one tick only.
        completeJobBatchDelay: 0,
        failJobBatchDelay: 0,
      },
    },
  });
}
