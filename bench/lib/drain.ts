/**
 * Shared by queue, workflow3 and txstep: enqueue every unit with `enqueuers`
 * parallel single enqueues, close the producer, then start one worker and time it
 * from start until every unit is durably complete (the system's own tables say so),
 * counting the worker's client round trips and the database's commits meanwhile.
 */
import { config } from './config.js';
import { Probe, settledCommits } from './db.js';
import { statementCount } from './pg-count.js';
import { perSecond, sleep } from './stats.js';
import type { Plan, System } from '../systems/types.js';

export interface TaskContext {
  system: System;
  url: string;
  adminUrl: string;
  database: string;
}

export async function inParallel(count: number, lanes: number, fn: (i: number) => Promise<void>): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: Math.min(lanes, count) }, async () => {
      while (next < count) await fn(next++);
    }),
  );
}

export interface DrainResult {
  enqueuePerSec: number;
  unitsPerSec: number;
  stepsPerSec: number;
  statementsPerStep: number;
  commitsPerStep: number;
  /** Set when the drain hit BENCH_DRAIN_CAP_S: the rates are over the capped time. */
  capped: boolean;
  completed: number;
  /** Units whose last step ran by the time the worker had stopped. */
  completedAfterStop: number;
  drainMs: number;
}

export async function enqueueThenDrain(ctx: TaskContext, plan: Plan, units: number): Promise<DrainResult> {
  const { system, url } = ctx;
  await system.setup(url, plan);
  const producer = await system.producer(url, plan, config.poolMax);
  const t0 = performance.now();
  await inParallel(units, config.enqueuers, (n) => producer.enqueue(n));
  const enqueueMs = performance.now() - t0;
  await producer.close();

  const commitsBefore = await settledCommits(ctx.adminUrl, ctx.database);
  const probe = new Probe(url);
  await probe.connect();
  let done = 0;
  let stepsRun = 0;
  const statementsBefore = statementCount();
  const t1 = performance.now();
  const worker = await system.worker(url, plan, {
    concurrency: config.concurrency,
    poolMax: config.poolMax,
    hooks: { beforeStep: () => void stepsRun++, afterLastStep: () => void done++ },
  });
  const capMs = config.drainCapSeconds * 1000;
  let capped = false;
  let end: number;
  for (;;) {
    if (done >= units && (await probe.scalar(system.pendingSql(plan))) === 0) {
      end = performance.now();
      break;
    }
    if (performance.now() - t1 > capMs) {
      end = performance.now();
      capped = true;
      break;
    }
    await sleep(done >= units ? 10 : 25);
  }
  const completedAtEnd = capped ? Math.min(done, units) : units;
  const stepsAtEnd = capped ? stepsRun : units * plan.steps.length;
  await worker.stop();
  const statements = statementCount() - statementsBefore;
  const completedAfterStop = Math.max(completedAtEnd, Math.min(done, units));
  await probe.end();
  const commits = (await settledCommits(ctx.adminUrl, ctx.database)) - commitsBefore - probe.statements;
  const drainMs = end - t1;
  // Steps whose body ran by the time the worker stopped (a graceful stop lets started steps finish).
  const steps = capped ? stepsRun : units * plan.steps.length;
  return {
    enqueuePerSec: perSecond(units, enqueueMs),
    unitsPerSec: perSecond(completedAtEnd, drainMs),
    stepsPerSec: perSecond(stepsAtEnd, drainMs),
    statementsPerStep: steps > 0 ? statements / steps : NaN,
    commitsPerStep: steps > 0 ? commits / steps : NaN,
    capped,
    completed: completedAtEnd,
    completedAfterStop,
    drainMs,
  };
}
