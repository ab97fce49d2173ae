/**
 * bulk_enqueue: how fast each system takes jobs in bulk. Every path enqueues `bulkJobs`
 * one-step jobs on a database of its own (fresh, schema installed, no worker): the client
 * library's batch call in batches of `bulkBatch`, the SQL batch function in batches of
 * `bulkBatch`, and the single-job SQL function called once per row from one statement over
 * generate_series. One caller, one batch at a time.
 */
import { config } from '../lib/config.js';
import { createDatabase, dropDatabase, Probe, settledCommits } from '../lib/db.js';
import { statementCount } from '../lib/pg-count.js';
import { StatementStats } from '../lib/pgss.js';
import { PLANS } from '../lib/plans.js';
import { perSecond } from '../lib/stats.js';
import type { BulkPaths } from '../systems/types.js';
import type { TaskContext } from '../lib/drain.js';
import type { Measurement, MetricDef, Workload } from './types.js';

const plan = PLANS.one;
type Path = 'api' | 'sqlBatch' | 'sqlSeries';
const PATHS: Path[] = ['api', 'sqlBatch', 'sqlSeries'];

async function runPath(ctx: TaskContext, path: Path): Promise<Measurement> {
  const database = `${ctx.database}_${path.toLowerCase()}`;
  const url = await createDatabase(ctx.adminUrl, database);
  let bulk: BulkPaths | undefined;
  try {
    await ctx.system.setup(url, plan);
    bulk = await ctx.system.bulk!(url, plan, config.poolMax);
    const fn = bulk[path];
    if (!fn) {
      const wanted = path === 'api' ? 'engine.startMany' : 'runledger.start_runs';
      const note = bulk.missing?.includes(wanted) ? `pending: ${wanted} not in this build` : 'no such path';
      return Object.fromEntries(['PerSec', 'StatementsPerJob', 'CommitsPerJob', 'TopSharePct'].map((k) => [`note_${path}${k}`, note]));
    }
    const probe = new Probe(url);
    await probe.connect();
    const before = await probe.scalar(ctx.system.pendingSql(plan));
    // the bulk client's sessions stay open; they ran only a few set-up statements (at most those few are miscounted)
    const commitsBefore = await settledCommits(ctx.adminUrl, database, performance.now() - 11_000);
    const stats = new StatementStats(probe);
    await stats.begin();
    const probeBefore = probe.statements;
    const statementsBefore = statementCount();
    const t0 = performance.now();
    let jobs = 0;
    if (path === 'sqlSeries') jobs = await bulk.sqlSeries!(config.bulkJobs);
    else {
      for (let first = 0; first < config.bulkJobs; first += config.bulkBatch) {
        const inputs = Array.from({ length: Math.min(config.bulkBatch, config.bulkJobs - first) }, (_, k) => first + k);
        jobs += await fn(inputs as never);
      }
    }
    const ms = performance.now() - t0;
    const statements = statementCount() - statementsBefore;
    const share = await stats.end();
    const enqueued = (await probe.scalar(ctx.system.pendingSql(plan))) - before;
    if (jobs !== config.bulkJobs || enqueued !== config.bulkJobs)
      throw new Error(`${path}: ${jobs} reported, ${enqueued} in the tables, expected ${config.bulkJobs}`);
    const problems = (await bulk.verify?.()) ?? [];
    if (problems.length) throw new Error(problems.join('; '));
    const probeStatements = probe.statements - probeBefore;
    await probe.end();
    await bulk.close();
    bulk = undefined;
    const commits = (await settledCommits(ctx.adminUrl, database)) - commitsBefore - probeStatements;
    return {
      [`${path}PerSec`]: perSecond(jobs, ms),
      [`${path}StatementsPerJob`]: statements / jobs,
      [`${path}CommitsPerJob`]: commits / jobs,
      [`${path}TopSharePct`]: share.topSharePct,
      [`${path}Top`]: share.top,
    };
  } finally {
    await bulk?.close().catch(() => undefined);
    await dropDatabase(ctx.adminUrl, database);
  }
}

const LABEL: Record<Path, string> = {
  api: `client batch call, batches of ${config.bulkBatch.toLocaleString('en')} (jobs/s)`,
  sqlBatch: `SQL batch function, batches of ${config.bulkBatch.toLocaleString('en')} (jobs/s)`,
  sqlSeries: `single-job SQL function × ${config.bulkJobs.toLocaleString('en')} in one statement (jobs/s)`,
};

export const bulkEnqueue: Workload = {
  name: 'bulk_enqueue',
  description: `${config.bulkJobs.toLocaleString('en')} one-step jobs per path, each path on a fresh database of its own with no worker, one caller: the client's batch call in batches of ${config.bulkBatch.toLocaleString('en')} (runledger engine.startMany(workflow, inputs), handles in input order; graphile-worker WorkerUtils.addJobs; pg-boss 10 insert(jobs), its v10 form of insert(name, jobs)); the SQL batch function in batches of ${config.bulkBatch.toLocaleString('en')} (runledger select runledger.start_runs('bench', '[...]'::jsonb), ids in input order; graphile_worker.add_jobs(job_spec[])); and the single-job SQL function once per row in one statement over generate_series (runledger.start_run, graphile_worker.add_job). The tables are counted after each path (every job must be there), and runledger's first batch of each batch path is checked for input order. DBOS has no batch enqueue; the batched variants of graphile-worker and pg-boss enqueue as their default twins and are not run.`,
  runsOn: (system) => system.bulk !== undefined && !system.id.endsWith('-batched'),
  metrics: PATHS.flatMap((p): MetricDef[] => [
    { key: `${p}PerSec`, label: LABEL[p], better: 'higher' },
    { key: `${p}StatementsPerJob`, label: `${LABEL[p].replace(' (jobs/s)', '')}: round trips per job`, better: 'lower', digits: 3 },
    { key: `${p}CommitsPerJob`, label: `${LABEL[p].replace(' (jobs/s)', '')}: commits per job`, better: 'lower', digits: 4 },
    {
      key: `${p}TopSharePct`,
      label: `${LABEL[p].replace(' (jobs/s)', '')}: top statement, % of server time`,
      better: 'lower',
      digits: 1,
      noRatio: true,
    },
  ]),
  async run(ctx) {
    const result: Measurement = {};
    for (const path of PATHS) Object.assign(result, await runPath(ctx, path));
    return result;
  },
};
