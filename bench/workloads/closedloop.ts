/**
 * closedloop: callers that await their results, as a web handler does. `closedLoopCallers`
 * callers, each in a loop: start a three-step workflow, await its result, again; the worker
 * runs in the same process (runledger: `const h = await engine.start(wf, input); await
 * h.result()` on the worker's engine; DBOS: `DBOS.startWorkflow(wf)(input)` then
 * `handle.getResult()`, run in-process the way DBOS runs a directly started workflow).
 * graphile-worker and pg-boss have no result API and are not measured.
 */
import { config } from '../lib/config.js';
import { Probe, settledCommits } from '../lib/db.js';
import { HISTORY_DESCRIPTION, loadHistory } from '../lib/history.js';
import { statementCount } from '../lib/pg-count.js';
import { STATEMENT_METRICS, StatementStats } from '../lib/pgss.js';
import { PLANS } from '../lib/plans.js';
import { percentile, perSecond } from '../lib/stats.js';
import type { TaskContext } from '../lib/drain.js';
import type { Measurement, MetricDef, Workload } from './types.js';

const plan = PLANS.three;
const WARM_BASE = 1_000_000;

async function measure({ system, url, adminUrl, database }: TaskContext, withHistory: boolean): Promise<Measurement> {
  await system.setup(url, plan);
  let steps = 0;
  let counting = false;
  const loop = await system.closedLoop!(url, plan, {
    concurrency: config.concurrency,
    poolMax: config.poolMax,
    hooks: { beforeStep: () => void (counting && steps++) },
  });
  const callers = config.closedLoopCallers;
  // warm-up (both arms): the same callers until historyWarmUnits calls are done or 5 s passed
  let warm = 0;
  const warmDeadline = performance.now() + 5_000;
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (warm < config.historyWarmUnits && performance.now() < warmDeadline) await loop.call(WARM_BASE + warm++);
    }),
  );
  let history: Measurement = {};
  if (withHistory) history = { ...(await loadHistory(system.id, url)) };

  const quietAt = performance.now();
  const probe = new Probe(url);
  await probe.connect();
  // the worker's sessions stay open: wait for their warm-up statistics to be flushed (its polls go on meanwhile)
  const commitsBefore = await settledCommits(adminUrl, database, quietAt);
  const stats = new StatementStats(probe);
  await stats.begin();
  const probeBefore = probe.statements;
  counting = true;
  const statementsBefore = statementCount();
  const latencies: number[] = [];
  const capAt = performance.now() + config.drainCapSeconds * 1000;
  let next = 0;
  let capped = false;
  const t0 = performance.now();
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next < config.closedLoopCalls) {
        if (performance.now() > capAt) {
          capped = true;
          return;
        }
        const n = next++;
        const t = performance.now();
        await loop.call(n);
        latencies.push(performance.now() - t);
      }
    }),
  );
  const ms = performance.now() - t0;
  const statements = statementCount() - statementsBefore;
  const share = await stats.end();
  const probeStatements = probe.statements - probeBefore;
  await probe.end();
  await loop.stop();
  const commits = (await settledCommits(adminUrl, database)) - commitsBefore - probeStatements;
  const done = latencies.length;
  return {
    workflowsPerSec: perSecond(done, ms),
    p50: percentile(latencies, 50) ?? null,
    p95: percentile(latencies, 95) ?? null,
    statementsPerWorkflow: done > 0 ? statements / done : null,
    commitsPerWorkflow: done > 0 ? commits / done : null,
    stepsPerWorkflow: done > 0 ? steps / done : null,
    capped,
    completed: done,
    warmUnits: warm,
    topSharePct: share.topSharePct,
    top3SharePct: share.top3SharePct,
    top: share.top,
    ...history,
  };
}

const METRICS: MetricDef[] = [
  { key: 'workflowsPerSec', label: 'workflows/s (start → result, 16 callers)', better: 'higher', cappable: true },
  { key: 'p50', label: 'start → result p50 (ms)', better: 'lower', digits: 1 },
  { key: 'p95', label: 'start → result p95 (ms)', better: 'lower', digits: 1 },
  { key: 'statementsPerWorkflow', label: 'round trips per workflow (callers + worker)', better: 'lower', digits: 2 },
  { key: 'commitsPerWorkflow', label: 'commits per workflow', better: 'lower', digits: 2 },
];

// DBOS's two columns differ only in queue polling, which a directly started workflow does not use.
const runsOn = (system: TaskContext['system']) => system.closedLoop !== undefined && system.id !== 'dbos-fastpoll';
const WHAT = `${config.closedLoopCallers} callers in one process with the worker, each in a loop doing start of a three-step workflow then awaiting its result (runledger: engine.start + handle.result() on the worker's engine; DBOS: DBOS.startWorkflow + handle.getResult(), in-process); ${config.closedLoopCalls.toLocaleString('en')} calls after a warm-up of ${config.historyWarmUnits} (or 5 s), stopped at the ${config.drainCapSeconds} s cap; latency from just before start to the result. Round trips are every query of the process (callers and worker). graphile-worker and pg-boss have no result API and are not measured; DBOS (poll 10 ms) is not run, a directly started workflow does not poll its queue`;

export const closedLoop: Workload = {
  name: 'closedloop',
  description: `${WHAT}.`,
  runsOn,
  metrics: [...METRICS, ...STATEMENT_METRICS],
  run: (ctx) => measure(ctx, false),
};

export const closedLoopHistory: Workload = {
  name: 'closedloop_history',
  description: `closedloop on a database with history, loaded after the warm-up while the worker runs (runledger: ${HISTORY_DESCRIPTION.runledger}; DBOS: ${HISTORY_DESCRIPTION.dbos}); otherwise as closedloop.`,
  runsOn,
  freshOf: { workload: 'closedloop', keys: ['workflowsPerSec', 'p50', 'p95'] },
  metrics: [
    ...METRICS,
    { key: 'historyLoadSeconds', label: 'history load (s, not timed in the figures)', better: 'lower', digits: 1, noRatio: true },
    ...STATEMENT_METRICS,
  ],
  run: (ctx) => measure(ctx, true),
};
