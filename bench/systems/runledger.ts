import { createEngine, type Engine, type Workflow } from 'runledger';
import { stepBody, type Hooks, type Plan, type Producer, type RunningWorker, type System, type WorkerSettings } from './types.js';

const quiet = (level: string, message: string, meta?: unknown) => {
  if (level === 'error') console.error(`[runledger] ${message}`, meta ?? '');
};

function define(engine: Engine, plan: Plan, hooks: Hooks): Workflow<{ n: number }, null> {
  return engine.workflow({ name: 'bench' }, async (ctx, input: { n: number }) => {
    const n = input.n;
    for (const [i, spec] of plan.steps.entries()) {
      if (spec.kind === 'tx') {
        await ctx.transaction(spec.name, async (trx) => {
          await hooks.beforeStep?.(n, i);
          await trx.insertInto('bench_business').values({ unit: n }).execute();
        });
      } else {
        await ctx.step(spec.name, () => stepBody(spec, n, i, hooks));
      }
    }
    hooks.afterLastStep?.(n);
    return null;
  });
}

export function runledger(): System {
  return {
    id: 'runledger',
    label: 'runledger',
    settings:
      'runWorker defaults (claims from the runs table on LISTEN/NOTIFY, batch = free slots, poll 2 s, lease 30 s; lease 2 s in recovery)',
    supportsTx: true,
    async setup(url) {
      const engine = createEngine({ connectionString: url, poolMax: 2, log: quiet });
      await engine.migrate();
      await engine.close();
    },
    async producer(url, plan, poolMax): Promise<Producer> {
      const engine = createEngine({ connectionString: url, poolMax, log: quiet });
      const wf = define(engine, plan, {});
      return {
        enqueue: async (n) => void (await engine.start(wf, { n })),
        close: () => engine.close(),
      };
    },
    async worker(url, plan, settings: WorkerSettings): Promise<RunningWorker> {
      const engine = createEngine({ connectionString: url, poolMax: settings.poolMax, log: quiet });
      define(engine, plan, settings.hooks);
      const worker = await engine.runWorker({ concurrency: settings.concurrency, leaseMs: settings.leaseMs });
      return {
        stop: async () => {
          await worker.stop();
          await engine.close();
        },
      };
    },
    pendingSql: () => `select count(*)::int from runledger.runs where status <> 'SUCCEEDED'`,
  };
}
