/**
 * Shared by queue, workflow3 and txstep: enqueue every unit with `enqueuers`
 * parallel single enqueues, close the producer, then start one worker and time it
 * from start until every unit is durably complete (the system's own tables say so),
 * counting the worker's client round trips and the database's commits meanwhile.
 *
 * Their _history twins (warmLoadThenDrain): the worker starts first on the empty
 * database and works a warm-up, the history is loaded while it runs, then it is paused
 * (its database sessions, and the plans they cached on the empty tables, kept), the
 * units are enqueued the same way, and the worker is resumed on those sessions and
 * timed from the resume exactly as above.
 */
import { config } from './config.js';
import { Probe, settledCommits } from './db.js';
import { AUTOVACUUM_SQL, familyOf, loadHistory, WAITING_SQL, type HistoryLoad } from './history.js';
import { statementCount } from './pg-count.js';
import { StatementStats, type StatementShare } from './pgss.js';
import { perSecond, sleep } from './stats.js';
import type { Hooks, Plan, RunningWorker, System } from '../systems/types.js';

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

export interface DrainResult extends StatementShare {
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

/** Counters the hooks feed; `counting` false during a warm-up. */
class Counters {
  done = 0;
  stepsRun = 0;
  warmDone = 0;
  counting = true;
  readonly hooks: Hooks = {
    beforeStep: () => void (this.counting && this.stepsRun++),
    afterLastStep: () => void (this.counting ? this.done++ : this.warmDone++),
  };
}

/** Waits until `units` are complete (hooks and tables agree) or the drain cap; `pendingBase` is what stays pending (history). */
async function awaitDrain(probe: Probe, pendingSql: string, counters: Counters, units: number, t1: number, pendingBase = 0) {
  const capMs = config.drainCapSeconds * 1000;
  for (;;) {
    if (counters.done >= units && (await probe.scalar(pendingSql)) - pendingBase <= 0) return { end: performance.now(), capped: false };
    if (performance.now() - t1 > capMs) return { end: performance.now(), capped: true };
    await sleep(counters.done >= units ? 10 : 25);
  }
}

async function finish(
  ctx: TaskContext,
  plan: Plan,
  units: number,
  worker: RunningWorker,
  probe: Probe,
  stats: StatementStats,
  counters: Counters,
  timing: {
    enqueueMs: number;
    t1: number;
    end: number;
    capped: boolean;
    commitsBefore: number;
    statementsBefore: number;
    probeBefore: number;
  },
): Promise<DrainResult> {
  const { capped, t1, end } = timing;
  const completedAtEnd = capped ? Math.min(counters.done, units) : units;
  const stepsAtEnd = capped ? counters.stepsRun : units * plan.steps.length;
  const share = await stats.end();
  await worker.stop();
  const statements = statementCount() - timing.statementsBefore;
  const completedAfterStop = Math.max(completedAtEnd, Math.min(counters.done, units));
  await probe.end();
  const commits = (await settledCommits(ctx.adminUrl, ctx.database)) - timing.commitsBefore - (probe.statements - timing.probeBefore);
  const drainMs = end - t1;
  // Steps whose body ran by the time the worker stopped (a graceful stop lets started steps finish).
  const steps = capped ? counters.stepsRun : units * plan.steps.length;
  return {
    enqueuePerSec: perSecond(units, timing.enqueueMs),
    unitsPerSec: perSecond(completedAtEnd, drainMs),
    stepsPerSec: perSecond(stepsAtEnd, drainMs),
    statementsPerStep: steps > 0 ? statements / steps : NaN,
    commitsPerStep: steps > 0 ? commits / steps : NaN,
    capped,
    completed: completedAtEnd,
    completedAfterStop,
    drainMs,
    ...share,
  };
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
  const probeBefore = 0;
  const stats = new StatementStats(probe);
  await stats.begin();
  const counters = new Counters();
  const statementsBefore = statementCount();
  const t1 = performance.now();
  const worker = await system.worker(url, plan, { concurrency: config.concurrency, poolMax: config.poolMax, hooks: counters.hooks });
  const { end, capped } = await awaitDrain(probe, system.pendingSql(plan), counters, units, t1);
  return finish(ctx, plan, units, worker, probe, stats, counters, {
    enqueueMs,
    t1,
    end,
    capped,
    commitsBefore,
    statementsBefore,
    probeBefore,
  });
}

export interface HistoryDrainResult extends DrainResult, HistoryLoad {
  warmUnits: number;
  /** The history's waiting rows still waiting at the end (must equal BENCH_HISTORY_WAITING). */
  historyWaitingAfter: number;
  /** Autovacuum + autoanalyze runs on the database's tables that finished between the load and the resume, and during the drain. */
  autovacuumBeforeDrain: number;
  autovacuumDuringDrain: number;
}

const WARM_BASE = 1_000_000;

/**
 * Warm-up on the running worker: batches of `concurrency` units, each awaited, until
 * `historyWarmUnits` are done or 5 s have passed; returns the units done.
 */
export async function warmUp(
  system: System,
  url: string,
  plan: Plan,
  probe: Probe,
  enqueue: (n: number) => Promise<void>,
  finished: () => number,
): Promise<number> {
  const deadline = performance.now() + 5_000;
  let sent = 0;
  while (sent < config.historyWarmUnits && performance.now() < deadline) {
    const batch = Math.min(config.concurrency, config.historyWarmUnits - sent);
    await inParallel(batch, batch, (k) => enqueue(WARM_BASE + sent + k));
    sent += batch;
    const batchDeadline = performance.now() + 30_000;
    while (finished() < sent || (await probe.scalar(system.pendingSql(plan))) > 0) {
      if (performance.now() > batchDeadline) throw new Error(`warm-up: ${finished()} of ${sent} units done after 30 s`);
      await sleep(10);
    }
  }
  return sent;
}

export async function warmLoadThenDrain(ctx: TaskContext, plan: Plan, units: number): Promise<HistoryDrainResult> {
  const { system, url } = ctx;
  await system.setup(url, plan);
  const probe = new Probe(url);
  await probe.connect();
  const counters = new Counters();
  counters.counting = false;
  const worker = await system.worker(url, plan, {
    concurrency: config.concurrency,
    poolMax: config.poolMax,
    hooks: counters.hooks,
    pausable: true,
  });
  if (!worker.pause || !worker.resume) throw new Error(`${system.id}: worker cannot pause`);
  const warmer = await system.producer(url, plan, config.poolMax);
  const warmUnits = await warmUp(
    system,
    url,
    plan,
    probe,
    (n) => warmer.enqueue(n),
    () => counters.warmDone,
  );
  await warmer.close();

  const autovacuumAtLoad = await probe.scalar(AUTOVACUUM_SQL);
  const load = await loadHistory(system.id, url); // the worker is running meanwhile
  await worker.pause();
  const pausedAt = performance.now();
  const pendingBase = await probe.scalar(system.pendingSql(plan));

  const producer = await system.producer(url, plan, config.poolMax);
  const t0 = performance.now();
  await inParallel(units, config.enqueuers, (n) => producer.enqueue(n));
  const enqueueMs = performance.now() - t0;
  await producer.close();

  const commitsBefore = await settledCommits(ctx.adminUrl, ctx.database, pausedAt);
  const probeBefore = probe.statements;
  const stats = new StatementStats(probe);
  await stats.begin();
  const autovacuumAtResume = await probe.scalar(AUTOVACUUM_SQL);
  counters.counting = true;
  const statementsBefore = statementCount();
  const t1 = performance.now();
  await worker.resume();
  const { end, capped } = await awaitDrain(probe, system.pendingSql(plan), counters, units, t1, pendingBase);
  const historyWaitingAfter = await probe.scalar(WAITING_SQL[familyOf(system.id)]);
  const autovacuumAtEnd = await probe.scalar(AUTOVACUUM_SQL);
  const r = await finish(ctx, plan, units, worker, probe, stats, counters, {
    enqueueMs,
    t1,
    end,
    capped,
    commitsBefore,
    statementsBefore,
    probeBefore,
  });
  return {
    ...r,
    ...load,
    warmUnits,
    historyWaitingAfter,
    autovacuumBeforeDrain: autovacuumAtResume - autovacuumAtLoad,
    autovacuumDuringDrain: autovacuumAtEnd - autovacuumAtResume,
  };
}
