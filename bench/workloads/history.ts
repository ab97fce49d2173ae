/**
 * The drain workloads on a database with history (see lib/history.ts for what each
 * system's history is, lib/drain.ts warmLoadThenDrain for the order of events).
 */
import { config } from '../lib/config.js';
import { withAdmin } from '../lib/db.js';
import { warmLoadThenDrain, type HistoryDrainResult } from '../lib/drain.js';
import { HISTORY_DESCRIPTION } from '../lib/history.js';
import { STATEMENT_METRICS } from '../lib/pgss.js';
import { PLANS } from '../lib/plans.js';
import { BUSINESS_TABLE_SQL } from '../systems/types.js';
import type { Measurement, MetricDef, Workload } from './types.js';

const HOW = `the worker starts on the empty database and works a warm-up (batches of ${config.concurrency} units until ${config.historyWarmUnits} are done or 5 s passed), so its sessions cache their plans on empty tables; the history is loaded by set-based SQL while it runs (runledger: ${HISTORY_DESCRIPTION.runledger}; the peers: see "History" below), statistics left as they are (no ANALYZE; autovacuum ${config.historyAutovacuum ? "at the server's defaults, and its runs are counted" : 'turned off on the loaded tables (BENCH_HISTORY_AUTOVACUUM=off)'}); the worker is paused (its sessions kept open), the units are enqueued as in the fresh workload, and the worker is resumed on the same sessions and timed from the resume until every unit is complete`;

const HISTORY_METRICS: MetricDef[] = [
  { key: 'historyLoadSeconds', label: 'history load (s, not timed in the figures)', better: 'lower', digits: 1, noRatio: true },
  { key: 'historyWaitingAfter', label: 'history runs still waiting at the end (must be all)', better: 'higher', noRatio: true },
  { key: 'autovacuumBeforeDrain', label: 'autovacuum/autoanalyze runs between load and drain', better: 'lower', noRatio: true },
  { key: 'autovacuumDuringDrain', label: 'autovacuum/autoanalyze runs ended during the drain', better: 'lower', noRatio: true },
];

function common(r: HistoryDrainResult): Measurement {
  return {
    statementsPerStep: r.statementsPerStep,
    commitsPerStep: r.commitsPerStep,
    capped: r.capped,
    completed: r.completed,
    topSharePct: r.topSharePct,
    top3SharePct: r.top3SharePct,
    top: r.top,
    historyLoadSeconds: r.historyLoadSeconds,
    historyRowsPerSec: r.historyRowsPerSec,
    historyBytes: r.historyBytes,
    historyWaitingAfter: r.historyWaitingAfter,
    autovacuumBeforeDrain: r.autovacuumBeforeDrain,
    autovacuumDuringDrain: r.autovacuumDuringDrain,
    warmUnits: r.warmUnits,
  };
}

export const queueHistory: Workload = {
  name: 'queue_history',
  description: `queue (${config.queueJobs.toLocaleString('en')} one-step jobs) on a database with history: ${HOW}.`,
  runsOn: () => true,
  freshOf: { workload: 'queue', keys: ['enqueuePerSec', 'drainPerSec'] },
  metrics: [
    { key: 'enqueuePerSec', label: 'enqueue (jobs/s)', better: 'higher' },
    { key: 'drainPerSec', label: 'drain (jobs/s)', better: 'higher', cappable: true },
    { key: 'statementsPerStep', label: 'worker round trips per job', better: 'lower', digits: 2 },
    { key: 'commitsPerStep', label: 'commits per job', better: 'lower', digits: 2 },
    ...HISTORY_METRICS,
    ...STATEMENT_METRICS,
  ],
  async run(ctx) {
    const r = await warmLoadThenDrain(ctx, PLANS.one, config.queueJobs);
    return { enqueuePerSec: r.enqueuePerSec, drainPerSec: r.unitsPerSec, ...common(r) };
  },
};

export const workflow3History: Workload = {
  name: 'workflow3_history',
  description: `workflow3 (${config.workflow3Runs.toLocaleString('en')} three-step workflows) on a database with history: ${HOW}.`,
  runsOn: () => true,
  freshOf: { workload: 'workflow3', keys: ['enqueuePerSec', 'workflowsPerSec', 'stepsPerSec'] },
  metrics: [
    { key: 'enqueuePerSec', label: 'enqueue (workflows/s)', better: 'higher' },
    { key: 'workflowsPerSec', label: 'workflows/s', better: 'higher', cappable: true },
    { key: 'stepsPerSec', label: 'steps/s', better: 'higher', cappable: true },
    { key: 'statementsPerStep', label: 'worker round trips per step', better: 'lower', digits: 2 },
    { key: 'commitsPerStep', label: 'commits per step', better: 'lower', digits: 2 },
    ...HISTORY_METRICS,
    ...STATEMENT_METRICS,
  ],
  async run(ctx) {
    const r = await warmLoadThenDrain(ctx, PLANS.three, config.workflow3Runs);
    return { enqueuePerSec: r.enqueuePerSec, workflowsPerSec: r.unitsPerSec, stepsPerSec: r.stepsPerSec, ...common(r) };
  },
};

export const txstepHistory: Workload = {
  name: 'txstep_history',
  description: `txstep (${config.txstepRuns.toLocaleString('en')} one-transaction-step workflows) on a database with history: ${HOW}. Business rows are counted over the measured runs only (the warm-up's are subtracted).`,
  runsOn: (system) => system.supportsTx,
  freshOf: { workload: 'txstep', keys: ['stepsPerSec'] },
  metrics: [
    { key: 'stepsPerSec', label: 'transaction steps/s', better: 'higher', cappable: true },
    { key: 'statementsPerStep', label: 'worker round trips per step', better: 'lower', digits: 2 },
    { key: 'commitsPerStep', label: 'commits per step', better: 'lower', digits: 2 },
    { key: 'rowsPerRun', label: 'business rows per run (must be 1)', better: 'lower', digits: 3 },
    ...HISTORY_METRICS,
    ...STATEMENT_METRICS,
  ],
  async run(ctx) {
    await withAdmin(ctx.url, (c) => c.query(BUSINESS_TABLE_SQL));
    const r = await warmLoadThenDrain(ctx, PLANS.tx, config.txstepRuns);
    const rows = await withAdmin(ctx.url, async (c) =>
      Number((await c.query('select count(*)::int as n from bench_business where unit < 1000000')).rows[0].n),
    );
    return { stepsPerSec: r.stepsPerSec, rowsPerRun: r.completedAfterStop > 0 ? rows / r.completedAfterStop : null, ...common(r) };
  },
};
