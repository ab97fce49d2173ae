import { DBOS, DBOSClient } from '@dbos-inc/dbos-sdk';
import { config } from '../lib/config.js';
import { PgDataSource } from './dbos-datasource.js';
import {
  stepBody,
  type ClosedLoop,
  type Hooks,
  type Plan,
  type Producer,
  type RunningWorker,
  type System,
  type WorkerSettings,
} from './types.js';

const APP = 'bench';
const QUEUE = 'bench';
const WORKFLOW = 'bench';

// DBOS is a process-wide singleton: the workflow is registered once per process
// (each measurement runs in its own child process), its hooks swapped per worker.
interface Registered {
  plan: Plan;
  hooks: Hooks;
  ds: PgDataSource;
  fn?: (n: number) => Promise<null>;
}
let registered: Registered | undefined;

function register(plan: Plan, url: string, poolMax: number) {
  if (registered) {
    if (registered.plan !== plan) throw new Error('DBOS adapter: one plan per process');
    return registered;
  }
  const state: Registered = { plan, hooks: {} as Hooks, ds: new PgDataSource('app', { connectionString: url, max: poolMax }) };
  async function bench(n: number): Promise<null> {
    for (const [i, spec] of plan.steps.entries()) {
      if (spec.kind === 'tx') {
        await state.ds.runTransaction(async () => {
          await state.hooks.beforeStep?.(n, i);
          await PgDataSource.client.query('insert into bench_business (unit) values ($1)', [n]);
        }, spec.name);
      } else {
        await DBOS.runStep(() => stepBody(spec, n, i, state.hooks), { name: spec.name });
      }
    }
    state.hooks.afterLastStep?.(n);
    return null;
  }
  state.fn = DBOS.registerWorkflow(bench, { name: WORKFLOW });
  registered = state;
  return state;
}

export function dbos(options: { pollMs?: number } = {}): System {
  const fast = options.pollMs !== undefined;
  const configure = (url: string, poolMax: number) =>
    DBOS.setConfig({ name: APP, systemDatabaseUrl: url, systemDatabasePoolSize: poolMax, logLevel: 'error' });
  return {
    id: fast ? 'dbos-fastpoll' : 'dbos',
    label: fast ? `DBOS (poll ${options.pollMs} ms)` : 'DBOS',
    settings: fast
      ? `queue workerConcurrency = concurrency, minPollingIntervalMs ${options.pollMs}; enqueue with DBOSClient`
      : 'queue workerConcurrency = concurrency, default minPollingIntervalMs (1 s); enqueue with DBOSClient',
    supportsTx: true,
    async setup(url) {
      await DBOS.migrate(url);
      const client = await DBOSClient.create({ systemDatabaseUrl: url, systemDatabasePoolSize: 2, applicationName: APP });
      try {
        await client.registerQueue(QUEUE, {
          workerConcurrency: config.concurrency,
          ...(fast ? { minPollingIntervalMs: options.pollMs } : {}),
        });
      } finally {
        await client.destroy();
      }
    },
    async producer(url, _plan, poolMax): Promise<Producer> {
      const client = await DBOSClient.create({ systemDatabaseUrl: url, systemDatabasePoolSize: poolMax, applicationName: APP });
      return {
        enqueue: async (n) => void (await client.enqueue({ queueName: QUEUE, workflowName: WORKFLOW }, n)),
        close: () => client.destroy(),
      };
    },
    async worker(url, plan, settings: WorkerSettings): Promise<RunningWorker> {
      const state = register(plan, url, settings.poolMax);
      state.hooks = settings.hooks;
      configure(url, settings.poolMax);
      await DBOS.launch();
      return {
        stop: () => DBOS.shutdown({ workflowCompletionTimeoutMS: 10_000 }),
        // DBOS is a singleton with no way to stop dequeuing but shutdown: a relaunch opens new sessions
        // (its statements are unnamed, so no session holds a cached plan to lose)
        pause: () => DBOS.shutdown({ workflowCompletionTimeoutMS: 10_000 }),
        resume: async () => {
          configure(url, settings.poolMax);
          await DBOS.launch();
        },
      };
    },
    async closedLoop(url, plan, settings): Promise<ClosedLoop> {
      const state = register(plan, url, settings.poolMax);
      state.hooks = settings.hooks;
      configure(url, settings.poolMax);
      await DBOS.launch();
      const fn = state.fn!;
      return {
        call: async (n) => {
          const handle = await DBOS.startWorkflow(fn)(n);
          await handle.getResult();
        },
        stop: () => DBOS.shutdown({ workflowCompletionTimeoutMS: 10_000 }),
      };
    },
    pendingSql: () => `select count(*)::int from dbos.workflow_status where status <> 'SUCCESS'`,
  };
}
