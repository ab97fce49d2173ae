import { config } from '../lib/config.js';
import { Probe } from '../lib/db.js';
import { warmUp, type TaskContext } from '../lib/drain.js';
import { HISTORY_DESCRIPTION, loadHistory } from '../lib/history.js';
import { STATEMENT_METRICS, StatementStats } from '../lib/pgss.js';
import { percentile, sleep } from '../lib/stats.js';
import type { Plan } from '../systems/types.js';
import type { Measurement, Workload } from './types.js';

const plan: Plan = { name: 'latency', steps: [{ name: 'a', kind: 'noop' }] };
const WARMUP = 3;

/** One job at a time on an idle worker; with history, the worker first works a warm-up, then the history is loaded while it runs. */
async function measure({ system, url }: TaskContext, withHistory: boolean): Promise<Measurement> {
  await system.setup(url, plan);
  const started = new Map<number, (at: number) => void>();
  const finished = new Map<number, () => void>();
  let warmDone = 0;
  const producer = await system.producer(url, plan, config.poolMax);
  const worker = await system.worker(url, plan, {
    concurrency: config.concurrency,
    poolMax: config.poolMax,
    hooks: {
      beforeStep: (unit, step) => void (step === 0 && started.get(unit)?.(performance.now())),
      afterLastStep: (unit) => (finished.has(unit) ? finished.get(unit)!() : void warmDone++),
    },
  });
  const probe = new Probe(url);
  await probe.connect();
  let history: Measurement = {};
  if (withHistory) {
    const warmUnits = await warmUp(
      system,
      url,
      plan,
      probe,
      (n) => producer.enqueue(n),
      () => warmDone,
    );
    history = { ...(await loadHistory(system.id, url)), warmUnits };
  }
  const stats = new StatementStats(probe);
  await stats.begin();
  const samples: number[] = [];
  const deadline = performance.now() + config.latencyMaxSeconds * 1000;
  for (let unit = 0; unit < WARMUP + config.latencySamples && performance.now() < deadline; unit++) {
    const start = new Promise<number>((resolve) => started.set(unit, resolve));
    const finish = new Promise<void>((resolve) => finished.set(unit, resolve));
    const t0 = performance.now();
    await producer.enqueue(unit);
    // A job that never starts ends the sampling (the deadline plus 10 s at most).
    const timeout = sleep(Math.max(0, deadline - performance.now()) + 10_000).then(() => undefined);
    const at = await Promise.race([start, timeout]);
    if (at === undefined || (await Promise.race([finish.then(() => true), timeout])) === undefined) break;
    if (unit >= WARMUP) samples.push(at - t0);
    await sleep(5);
  }
  const share = await stats.end();
  await probe.end();
  await worker.stop();
  await producer.close();
  return {
    p50: percentile(samples, 50) ?? null,
    p95: percentile(samples, 95) ?? null,
    p99: percentile(samples, 99) ?? null,
    samples: samples.length,
    topSharePct: share.topSharePct,
    top3SharePct: share.top3SharePct,
    top: share.top,
    ...history,
  };
}

const METRICS: Workload['metrics'] = [
  { key: 'p50', label: 'enqueue → start p50 (ms)', better: 'lower', digits: 1 },
  { key: 'p95', label: 'enqueue → start p95 (ms)', better: 'lower', digits: 1 },
  { key: 'p99', label: 'enqueue → start p99 (ms)', better: 'lower', digits: 1 },
  { key: 'samples', label: 'samples', better: 'higher', noRatio: true },
];

export const latency: Workload = {
  name: 'latency',
  description: `One job at a time on an idle worker: time from just before the enqueue call to the start of the job's (first step's) body, ${config.latencySamples} samples after ${WARMUP} warm-up jobs, stopping early after ${config.latencyMaxSeconds} s (the sample count is reported).`,
  runsOn: () => true,
  metrics: [...METRICS, ...STATEMENT_METRICS],
  run: (ctx) => measure(ctx, false),
};

export const latencyHistory: Workload = {
  name: 'latency_history',
  description: `latency on a database with history: the worker starts on the empty database and works a warm-up (batches of ${config.concurrency} jobs until ${config.historyWarmUnits} are done or 5 s passed), then the history is loaded while it runs (runledger: ${HISTORY_DESCRIPTION.runledger}; the peers: see "History" below), statistics left as they are; then sampled as latency.`,
  runsOn: () => true,
  freshOf: { workload: 'latency', keys: ['p50', 'p95', 'p99'] },
  metrics: [
    ...METRICS,
    { key: 'historyLoadSeconds', label: 'history load (s, not timed in the figures)', better: 'lower', digits: 1, noRatio: true },
    ...STATEMENT_METRICS,
  ],
  run: (ctx) => measure(ctx, true),
};
