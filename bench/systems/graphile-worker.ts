import { Logger, makeWorkerUtils, run, runMigrations, type Runner, type RunnerOptions, type Task } from 'graphile-worker';
import pg from 'pg';
import { config } from '../lib/config.js';
import { stepBody, type BulkPaths, type Plan, type Producer, type RunningWorker, type System, type WorkerSettings } from './types.js';

const TASK = 'bench';
const logger = new Logger(() => (level, message) => {
  if (level === 'error') console.error(`[graphile-worker] ${message}`);
});

/** Multi-step work is a chain of jobs: each job is one step and enqueues the next one. */
export function graphileWorker(options: { batched?: boolean } = {}): System {
  const batched = options.batched ?? false;
  const preset = batched
    ? {
        worker: {
          localQueue: { size: config.gwLocalQueueSize },
          completeJobBatchDelay: config.gwCompleteBatchDelayMs,
          failJobBatchDelay: config.gwCompleteBatchDelayMs,
        },
      }
    : undefined;
  return {
    id: batched ? 'graphile-worker-batched' : 'graphile-worker',
    label: batched ? 'graphile-worker (batched)' : 'graphile-worker',
    settings: batched
      ? `0.17.3, concurrency = concurrency, localQueue.size ${config.gwLocalQueueSize}, completeJobBatchDelay ${config.gwCompleteBatchDelayMs} ms, failJobBatchDelay ${config.gwCompleteBatchDelayMs} ms`
      : '0.17.3, concurrency = concurrency, defaults otherwise (no local queue, no completion batching, poll 2 s + LISTEN/NOTIFY)',
    supportsTx: false,
    async setup(url) {
      await runMigrations({ connectionString: url, logger });
    },
    async producer(url, _plan, poolMax): Promise<Producer> {
      const utils = await makeWorkerUtils({ connectionString: url, logger, preset: { worker: { maxPoolSize: poolMax } } });
      return {
        enqueue: async (n) => void (await utils.addJob(TASK, { n, s: 0 })),
        close: async () => void (await utils.release()),
      };
    },
    async worker(url, plan: Plan, settings: WorkerSettings): Promise<RunningWorker> {
      const last = plan.steps.length - 1;
      const task: Task = async (payload, helpers) => {
        const { n, s } = payload as { n: number; s: number };
        await stepBody(plan.steps[s]!, n, s, settings.hooks);
        if (s < last) await helpers.addJob(TASK, { n, s: s + 1 });
        else settings.hooks.afterLastStep?.(n);
      };
      // pausable: a pool of our own that graphile-worker does not end at stop and that never closes idle sessions
      const pgPool = settings.pausable
        ? new pg.Pool({ connectionString: url, max: settings.poolMax, keepAlive: true, idleTimeoutMillis: 0 })
        : undefined;
      pgPool?.on('error', (error) => console.error(`[graphile-worker pool] ${error.message}`));
      const options: RunnerOptions = {
        ...(pgPool ? { pgPool } : { connectionString: url }),
        concurrency: settings.concurrency,
        maxPoolSize: settings.poolMax,
        noHandleSignals: true,
        logger,
        taskList: { [TASK]: task },
        ...(preset ? { preset } : {}),
      };
      let runner: Runner = await run(options);
      return {
        stop: async () => {
          await runner.stop();
          await pgPool?.end();
        },
        pause: () => runner.stop(),
        resume: async () => void (runner = await run(options)),
      };
    },
    pendingSql: () => 'select count(*)::int from graphile_worker._private_jobs',
    async bulk(url, _plan, poolMax): Promise<BulkPaths> {
      const utils = await makeWorkerUtils({ connectionString: url, logger, preset: { worker: { maxPoolSize: poolMax } } });
      const pool = new pg.Pool({ connectionString: url, max: 2 });
      return {
        api: async (inputs) => (await utils.addJobs(inputs.map((n) => ({ identifier: TASK, payload: { n, s: 0 } })))).length,
        sqlBatch: async (inputs) => {
          const { rows } = await pool.query(
            `select count(*)::int as n from graphile_worker.add_jobs(
               array(select row($1::text, json_build_object('n', n, 's', 0), null, null, null, null, null, null)::graphile_worker.job_spec
                     from unnest($2::int[]) n))`,
            [TASK, inputs],
          );
          return rows[0].n as number;
        },
        sqlSeries: async (count) => {
          const { rows } = await pool.query(
            `select count(graphile_worker.add_job($1, json_build_object('n', i, 's', 0)))::int as n from generate_series(0, $2::int - 1) i`,
            [TASK, count],
          );
          return rows[0].n as number;
        },
        close: async () => {
          await utils.release();
          await pool.end();
        },
      };
    },
  };
}
