import { Logger, makeWorkerUtils, run, runMigrations, type Task } from 'graphile-worker';
import { config } from '../lib/config.js';
import { stepBody, type Plan, type Producer, type RunningWorker, type System, type WorkerSettings } from './types.js';

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
      const runner = await run({
        connectionString: url,
        concurrency: settings.concurrency,
        maxPoolSize: settings.poolMax,
        noHandleSignals: true,
        logger,
        taskList: { [TASK]: task },
        ...(preset ? { preset } : {}),
      });
      return { stop: () => runner.stop() };
    },
    pendingSql: () => 'select count(*)::int from graphile_worker._private_jobs',
  };
}
