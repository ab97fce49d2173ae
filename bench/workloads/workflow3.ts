import { config } from '../lib/config.js';
import { enqueueThenDrain } from '../lib/drain.js';
import { PLANS } from '../lib/plans.js';
import { STATEMENT_METRICS } from '../lib/pgss.js';
import type { Workload } from './types.js';

export const workflow3: Workload = {
  name: 'workflow3',
  description: `${config.workflow3Runs.toLocaleString('en')} three-step workflows, every step checkpointed (graphile-worker and pg-boss: three chained jobs, each enqueuing the next); enqueued like queue, drained by one worker at concurrency ${config.concurrency}.`,
  runsOn: () => true,
  metrics: [
    { key: 'enqueuePerSec', label: 'enqueue (workflows/s)', better: 'higher' },
    { key: 'workflowsPerSec', label: 'workflows/s', better: 'higher', cappable: true },
    { key: 'stepsPerSec', label: 'steps/s', better: 'higher', cappable: true },
    { key: 'statementsPerStep', label: 'worker round trips per step', better: 'lower', digits: 2 },
    { key: 'commitsPerStep', label: 'commits per step', better: 'lower', digits: 2 },
    ...STATEMENT_METRICS,
  ],
  async run(ctx) {
    const r = await enqueueThenDrain(ctx, PLANS.three, config.workflow3Runs);
    return {
      enqueuePerSec: r.enqueuePerSec,
      workflowsPerSec: r.unitsPerSec,
      stepsPerSec: r.stepsPerSec,
      statementsPerStep: r.statementsPerStep,
      commitsPerStep: r.commitsPerStep,
      capped: r.capped,
      completed: r.completed,
      topSharePct: r.topSharePct,
      top3SharePct: r.top3SharePct,
      top: r.top,
    };
  },
};
