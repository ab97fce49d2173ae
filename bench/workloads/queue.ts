import { config } from '../lib/config.js';
import { enqueueThenDrain } from '../lib/drain.js';
import { PLANS } from '../lib/plans.js';
import { STATEMENT_METRICS } from '../lib/pgss.js';
import type { Workload } from './types.js';

export const queue: Workload = {
  name: 'queue',
  description: `${config.queueJobs.toLocaleString('en')} one-step no-op jobs (workflows): enqueued by ${config.enqueuers} parallel enqueuers, one enqueue call each at a time (no batch API), then drained by one worker at concurrency ${config.concurrency}, timed from worker start until the system's tables show every job complete.`,
  runsOn: () => true,
  metrics: [
    { key: 'enqueuePerSec', label: 'enqueue (jobs/s)', better: 'higher' },
    { key: 'drainPerSec', label: 'drain (jobs/s)', better: 'higher', cappable: true },
    { key: 'statementsPerStep', label: 'worker round trips per job', better: 'lower', digits: 2 },
    { key: 'commitsPerStep', label: 'commits per job', better: 'lower', digits: 2 },
    ...STATEMENT_METRICS,
  ],
  async run(ctx) {
    const r = await enqueueThenDrain(ctx, PLANS.one, config.queueJobs);
    return {
      enqueuePerSec: r.enqueuePerSec,
      drainPerSec: r.unitsPerSec,
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
