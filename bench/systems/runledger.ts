import { createRequire } from 'node:module';
import type pg from 'pg';
import { createEngine, type Engine, type RunHandle, type Workflow } from 'runledger';
import {
  stepBody,
  type BulkPaths,
  type ClosedLoop,
  type Hooks,
  type Plan,
  type Producer,
  type RunningWorker,
  type System,
  type WorkerSettings,
} from './types.js';

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

/** engine.startMany(workflow, inputs) → handles in input order; being added on main, so looked up at run time. */
type StartMany = (workflow: Workflow<{ n: number }, null>, inputs: { n: number }[]) => Promise<RunHandle<null>[]>;

// runledger checks `pool instanceof pg.Pool` against its own copy of pg (../node_modules/pg), not bench's
const RunledgerPg = createRequire(import.meta.resolve('runledger'))('pg') as typeof pg;

/** A pool that keeps idle sessions (and the plans they cached) for as long as the worker lives. */
const keepingPool = (url: string, max: number) =>
  new RunledgerPg.Pool({ connectionString: url, max, keepAlive: true, idleTimeoutMillis: 0 });

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
      const pool = settings.pausable ? keepingPool(url, settings.poolMax) : undefined;
      const engine = pool
        ? createEngine({ pool, log: quiet })
        : createEngine({ connectionString: url, poolMax: settings.poolMax, log: quiet });
      define(engine, plan, settings.hooks);
      const options = { concurrency: settings.concurrency, leaseMs: settings.leaseMs };
      let worker = await engine.runWorker(options);
      return {
        stop: async () => {
          await worker.stop();
          await engine.close();
          await pool?.end();
        },
        pause: () => worker.stop(),
        resume: async () => void (worker = await engine.runWorker(options)),
      };
    },
    pendingSql: () => `select count(*)::int from runledger.runs where status <> 'SUCCEEDED'`,
    async closedLoop(url, plan, settings): Promise<ClosedLoop> {
      const pool = keepingPool(url, settings.poolMax);
      const engine = createEngine({ pool, log: quiet });
      const wf = define(engine, plan, settings.hooks);
      const worker = await engine.runWorker({ concurrency: settings.concurrency });
      return {
        call: async (n) => {
          const h = await engine.start(wf, { n });
          await h.result();
        },
        stop: async () => {
          await worker.stop();
          await engine.close();
          await pool.end();
        },
      };
    },
    async bulk(url, plan, poolMax): Promise<BulkPaths> {
      const engine = createEngine({ connectionString: url, poolMax, log: quiet });
      const wf = define(engine, plan, {});
      await engine.start(wf, { n: -1 }); // registers the workflow for the SQL paths (not timed)
      // looked up at run time, so that this adapter also measures a build from before startMany (reported as pending)
      const startMany = (engine as unknown as { startMany?: StartMany }).startMany?.bind(engine);
      const firstBatch: Record<string, { ids: string[]; inputs: number[] }> = {};
      const hasStartRuns =
        (
          await engine.pool.query(
            `select count(*)::int as n from pg_proc where proname = 'start_runs' and pronamespace = 'runledger'::regnamespace`,
          )
        ).rows[0].n > 0;
      return {
        api: startMany
          ? async (inputs) => {
              const handles = await startMany(
                wf,
                inputs.map((n) => ({ n })),
              );
              if (handles.length !== inputs.length)
                throw new Error(`startMany returned ${handles.length} handles for ${inputs.length} inputs`);
              firstBatch.startMany ??= { ids: handles.map((h) => h.runId), inputs };
              return handles.length;
            }
          : undefined,
        sqlBatch: hasStartRuns
          ? async (inputs) => {
              const { rows } = await engine.pool.query(`select runledger.start_runs('bench', $1::jsonb) as ids`, [
                JSON.stringify(inputs.map((n) => ({ n }))),
              ]);
              const ids = rows[0].ids as string[];
              if (ids.length !== inputs.length) throw new Error(`start_runs returned ${ids.length} ids for ${inputs.length} inputs`);
              firstBatch.start_runs ??= { ids, inputs };
              return ids.length;
            }
          : undefined,
        sqlSeries: async (count) => {
          const { rows } = await engine.pool.query(
            `select count(runledger.start_run('bench', jsonb_build_object('n', i)))::int as n from generate_series(0, $1::int - 1) i`,
            [count],
          );
          return rows[0].n as number;
        },
        missing: [...(startMany ? [] : ['engine.startMany']), ...(hasStartRuns ? [] : ['runledger.start_runs'])],
        async verify() {
          const problems: string[] = [];
          for (const [path, { ids, inputs }] of Object.entries(firstBatch)) {
            const { rows } = await engine.pool.query(`select run_id, (input->>'n')::int as n from runledger.runs where run_id = any($1)`, [
              ids,
            ]);
            const byId = new Map(rows.map((r) => [r.run_id as string, r.n as number]));
            const wrong = ids.filter((id, k) => byId.get(id) !== inputs[k]).length;
            if (wrong > 0) problems.push(`${path}: ${wrong} of ${ids.length} ids not in input order`);
          }
          return problems;
        },
        close: () => engine.close(),
      };
    },
  };
}
