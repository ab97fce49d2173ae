/**
 * One worker in a process of its own, for the recovery workload (which SIGKILLs it).
 * Every step body first appends (unit, step) to bench_exec in its own autocommit
 * statement, so re-executed steps can be counted afterwards.
 *   BENCH_WORKER={"system":"runledger","url":"postgres://...","plan":"recovery","leaseMs":2000}
 */
import pg from 'pg';
import { config } from './lib/config.js';
import { PLANS, type PlanName } from './lib/plans.js';
import { systemById } from './systems/index.js';

const task = JSON.parse(process.env.BENCH_WORKER ?? '{}') as { system: string; url: string; plan: PlanName; leaseMs?: number };
const system = systemById(task.system);
const plan = PLANS[task.plan];
const log = new pg.Pool({ connectionString: task.url, max: config.concurrency });

const worker = await system.worker(task.url, plan, {
  concurrency: config.concurrency,
  poolMax: config.poolMax,
  leaseMs: task.leaseMs,
  hooks: {
    beforeStep: async (unit, step) => {
      await log.query('insert into bench_exec (unit, step, pid) values ($1, $2, $3)', [unit, step, process.pid]);
    },
  },
});
console.log('READY');

process.once('SIGTERM', async () => {
  await worker.stop().catch((error) => console.error('worker stop:', error));
  await log.end();
  process.exit(0);
});
