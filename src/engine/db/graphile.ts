import type pg from 'pg';
import { isConnectionError } from './pg-errors.js';
import { Logger, run, type Runner, type Task } from 'graphile-worker';

/**
 * The only file that talks to graphile-worker, which fires cron ticks (runs are
 * claimed from runledger.runs, see dispatcher.ts). Its schema is foreign: we use its
 * migrator and runner, never its private tables.
 */
export const GRAPHILE_SCHEMA = 'graphile_worker';

export function graphileLogger(onError: (message: string) => void = () => {}): Logger {
  return new Logger(() => (level, message) => {
    if (level === 'error') onError(message);
  });
}

export interface CronRunnerOptions {
  pool: pg.Pool;
  concurrency: number;
  pollIntervalMs: number;
  /** Jobs fetched (and locked) per query; 0 or 1 fetches one at a time. */
  fetchBatchSize: number;
  /** task identifier -> handler(payload); a throw fails the job, which graphile-worker retries later. */
  tasks: Map<string, (payload: Record<string, unknown>) => Promise<void>>;
  /** graphile-worker crontab lines (scheduled workflows); graphile-worker fires each tick once across workers. */
  crontab?: string;
  onError: (message: string) => void;
}

/** graphile-worker's own statements that are safe to run again on another connection. */
const IDEMPOTENT_STATEMENTS = /^(complete_job|fail_job)/;
const STATEMENT_TRIES = 5;

/**
 * graphile-worker 0.17 treats a failed job completion as fatal: its pool shuts down
 * and, because its batch retry gives up at once, never finishes shutting down, so the
 * worker stops taking jobs. Completing (or failing) a job is idempotent, so on this
 * pool those statements are re-run on a fresh connection when theirs was terminated.
 */
export function retryIdempotentStatements(pool: pg.Pool): void {
  pool.on('connect', (client) => {
    const original = client.query.bind(client) as (...args: unknown[]) => unknown;
    (client as unknown as { query: (...args: unknown[]) => unknown }).query = (...args: unknown[]) => {
      const config = args[0] as { name?: unknown } | undefined;
      const retryable =
        args.length === 1 && typeof config === 'object' && typeof config?.name === 'string' && IDEMPOTENT_STATEMENTS.test(config.name);
      if (!retryable) return original(...args);
      return (original(config) as Promise<unknown>).catch(async (error: unknown) => {
        let lastError = error;
        for (let attempt = 1; attempt < STATEMENT_TRIES && isConnectionError(lastError); attempt++) {
          await new Promise((resolve) => setTimeout(resolve, 50 * attempt));
          const fresh = await pool.connect().catch((e: unknown) => e as Error);
          if (fresh instanceof Error) {
            lastError = fresh;
            continue;
          }
          try {
            const result = await fresh.query(config as pg.QueryConfig);
            fresh.release();
            return result;
          } catch (retryError) {
            fresh.release(retryError as Error);
            lastError = retryError;
          }
        }
        throw lastError;
      });
    };
  });
}

export interface CronRunner {
  stop(): Promise<void>;
}

const RESTART_DELAY_MS_MAX = 5_000;

/**
 * Runs graphile-worker for our tasks and keeps it running: graphile-worker shuts its
 * pool down when it cannot record a job's completion (a connection terminated at the
 * wrong moment), so a runner that ends without our asking is started again. A cron
 * job it held is retried by graphile-worker; the run a tick starts has an idempotency
 * key, so a tick fired twice starts one run.
 */
export async function startCronRunner(options: CronRunnerOptions): Promise<CronRunner> {
  const taskList: Record<string, Task> = {};
  for (const [identifier, handler] of options.tasks) {
    taskList[identifier] = async (payload) => handler((payload ?? {}) as Record<string, unknown>);
  }
  const start = () =>
    run({
      pgPool: options.pool,
      schema: GRAPHILE_SCHEMA,
      concurrency: options.concurrency,
      pollInterval: options.pollIntervalMs,
      noHandleSignals: true,
      taskList,
      ...(options.crontab ? { crontab: options.crontab } : {}),
      logger: graphileLogger(options.onError),
      preset: {
        worker: {
          // Batched completion retries transient errors instead of leaving an unhandled
          // rejection; delay 0 batches within one tick only.
          completeJobBatchDelay: 0,
          failJobBatchDelay: 0,
          ...(options.fetchBatchSize > 1 ? { localQueue: { size: options.fetchBatchSize } } : {}),
        },
      },
    });

  let stopping = false;
  let current: Runner = await start();
  let restartDelay = 100;
  const supervise = (runner: Runner): void => {
    void runner.promise
      .catch((error: unknown) => options.onError(`cron runner stopped: ${(error as Error)?.message ?? String(error)}`))
      .then(async () => {
        while (!stopping) {
          options.onError('cron runner ended unexpectedly; starting it again');
          await new Promise((resolve) => setTimeout(resolve, restartDelay));
          restartDelay = Math.min(RESTART_DELAY_MS_MAX, restartDelay * 2);
          if (stopping) return;
          try {
            current = await start();
            restartDelay = 100;
            supervise(current);
            return;
          } catch (error) {
            options.onError(`cron runner failed to start: ${(error as Error).message}`);
          }
        }
      });
  };
  supervise(current);
  return {
    async stop() {
      stopping = true;
      await current.stop().catch(() => undefined);
    },
  };
}
