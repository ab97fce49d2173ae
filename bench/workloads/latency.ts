import { config } from '../lib/config.js';
import { percentile, sleep } from '../lib/stats.js';
import type { Plan } from '../systems/types.js';
import type { Workload } from './types.js';

const plan: Plan = { name: 'latency', steps: [{ name: 'a', kind: 'noop' }] };
const WARMUP = 3;

export const latency: Workload = {
  name: 'latency',
  description: `One job at a time on an idle worker: time from just before the enqueue call to the start of the job's (first step's) body, ${config.latencySamples} samples after ${WARMUP} warm-up jobs, stopping early after ${config.latencyMaxSeconds} s (the sample count is reported).`,
  runsOn: () => true,
  metrics: [
    { key: 'p50', label: 'enqueue → start p50 (ms)', better: 'lower', digits: 1 },
    { key: 'p95', label: 'enqueue → start p95 (ms)', better: 'lower', digits: 1 },
    { key: 'p99', label: 'enqueue → start p99 (ms)', better: 'lower', digits: 1 },
    { key: 'samples', label: 'samples', better: 'higher', noRatio: true },
  ],
  async run({ system, url }) {
    await system.setup(url, plan);
    const started = new Map<number, (at: number) => void>();
    const finished = new Map<number, () => void>();
    const producer = await system.producer(url, plan, config.poolMax);
    const worker = await system.worker(url, plan, {
      concurrency: config.concurrency,
      poolMax: config.poolMax,
      hooks: {
        beforeStep: (unit, step) => void (step === 0 && started.get(unit)?.(performance.now())),
        afterLastStep: (unit) => finished.get(unit)?.(),
      },
    });
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
    await worker.stop();
    await producer.close();
    return {
      p50: percentile(samples, 50) ?? null,
      p95: percentile(samples, 95) ?? null,
      p99: percentile(samples, 99) ?? null,
      samples: samples.length,
    };
  },
};
