import PgBoss from 'pg-boss';
import { config } from '../lib/config.js';
import { sleep } from '../lib/stats.js';
import { stepBody, type BulkPaths, type Plan, type Producer, type RunningWorker, type System, type WorkerSettings } from './types.js';

const QUEUE = 'bench';

function boss(url: string, max: number, extra: Partial<PgBoss.ConstructorOptions> = {}): PgBoss {
  const b = new PgBoss({ connectionString: url, max, ...extra });
  b.on('error', (error) => console.error(`[pg-boss] ${error.message}`));
  return b;
}

/**
 * pg-boss 10 has no per-worker concurrency setting: concurrency is `concurrency`
 * work() loops. Each loop fetches, runs its batch one job after another, then waits
 * out the rest of its polling interval (it has no LISTEN/NOTIFY).
 */
export function pgBoss(options: { batched?: boolean } = {}): System {
  const batched = options.batched ?? false;
  const workOptions: PgBoss.WorkOptions = batched
    ? { batchSize: config.pgbossBatchSize, pollingIntervalSeconds: config.pgbossBatchedPollSeconds }
    : {};
  return {
    id: batched ? 'pg-boss-batched' : 'pg-boss',
    label: batched ? 'pg-boss (batched)' : 'pg-boss',
    settings: batched
      ? `10.4.2, concurrency = work() loops, each batchSize ${config.pgbossBatchSize}, pollingIntervalSeconds ${config.pgbossBatchedPollSeconds}`
      : '10.4.2, concurrency = work() loops, defaults otherwise (batchSize 1, pollingIntervalSeconds 2)',
    supportsTx: false,
    async setup(url) {
      const b = boss(url, 2, { supervise: false, schedule: false });
      await b.start();
      await b.createQueue(QUEUE);
      await b.stop({ graceful: false, wait: true });
    },
    async producer(url, _plan, poolMax): Promise<Producer> {
      const b = boss(url, poolMax, { supervise: false, schedule: false });
      await b.start();
      return {
        enqueue: async (n) => void (await b.send(QUEUE, { n, s: 0 })),
        close: () => b.stop({ graceful: false, wait: true }),
      };
    },
    async worker(url, plan: Plan, settings: WorkerSettings): Promise<RunningWorker> {
      const last = plan.steps.length - 1;
      // pausable: the pool keeps idle sessions (pg-boss hands its options to pg.Pool)
      const b = boss(url, settings.poolMax, settings.pausable ? ({ idleTimeoutMillis: 0 } as Partial<PgBoss.ConstructorOptions>) : {});
      await b.start();
      const handler = async (jobs: PgBoss.Job<{ n: number; s: number }>[]) => {
        for (const job of jobs) {
          const { n, s } = job.data;
          await stepBody(plan.steps[s]!, n, s, settings.hooks);
          if (s < last) await b.send(QUEUE, { n, s: s + 1 });
          else settings.hooks.afterLastStep?.(n);
        }
      };
      const start = async () => {
        for (let i = 0; i < settings.concurrency; i++) await b.work(QUEUE, workOptions, handler);
      };
      await start();
      return {
        stop: () => b.stop({ graceful: true, wait: true, timeout: 10_000 }),
        // offWork does not wait for its loops: a loop ends at its next poll (2 s at the defaults)
        pause: async () => {
          await b.offWork(QUEUE);
          await sleep(3_000);
        },
        resume: start,
      };
    },
    // failed or cancelled jobs count too: their work is not done
    pendingSql: () => `select count(*)::int from pgboss.job where name = '${QUEUE}' and state <> 'completed'`,
    async bulk(url, _plan, poolMax): Promise<BulkPaths> {
      const b = boss(url, poolMax, { supervise: false, schedule: false });
      await b.start();
      return {
        // pg-boss 10: insert(jobs) with the queue name in each job (insert(name, jobs) is the v11 signature)
        api: async (inputs) => {
          await b.insert(inputs.map((n) => ({ name: QUEUE, data: { n, s: 0 } })));
          return inputs.length;
        },
        close: () => b.stop({ graceful: false, wait: true }),
      };
    },
  };
}
