import { config } from '../lib/config.js';
import { withAdmin } from '../lib/db.js';
import { enqueueThenDrain } from '../lib/drain.js';
import { PLANS } from '../lib/plans.js';
import { BUSINESS_TABLE_SQL } from '../systems/types.js';
import { STATEMENT_METRICS } from '../lib/pgss.js';
import type { Workload } from './types.js';

export const txstep: Workload = {
  name: 'txstep',
  description: `${config.txstepRuns.toLocaleString('en')} workflows of one transaction step that inserts one business row and commits it with the step's checkpoint (runledger ctx.transaction; DBOS data source transaction, see systems/dbos-datasource.ts). graphile-worker and pg-boss have no such step.`,
  runsOn: (system) => system.supportsTx,
  metrics: [
    { key: 'stepsPerSec', label: 'transaction steps/s', better: 'higher', cappable: true },
    { key: 'statementsPerStep', label: 'worker round trips per step', better: 'lower', digits: 2 },
    { key: 'commitsPerStep', label: 'commits per step', better: 'lower', digits: 2 },
    { key: 'rowsPerRun', label: 'business rows per run (must be 1)', better: 'lower', digits: 3 },
    ...STATEMENT_METRICS,
  ],
  async run(ctx) {
    await withAdmin(ctx.url, (c) => c.query(BUSINESS_TABLE_SQL));
    const r = await enqueueThenDrain(ctx, PLANS.tx, config.txstepRuns);
    const rows = await withAdmin(ctx.url, async (c) => Number((await c.query('select count(*)::int as n from bench_business')).rows[0].n));
    return {
      stepsPerSec: r.stepsPerSec,
      statementsPerStep: r.statementsPerStep,
      commitsPerStep: r.commitsPerStep,
      rowsPerRun: r.completedAfterStop > 0 ? rows / r.completedAfterStop : null,
      capped: r.capped,
      completed: r.completed,
      topSharePct: r.topSharePct,
      top3SharePct: r.top3SharePct,
      top: r.top,
    };
  },
};
