/**
 * Every knob of the benchmark, read from the environment. BENCH_QUICK=1 shrinks
 * sizes and repetitions for a smoke run; any single value can still be overridden.
 * The full-run defaults are sized to finish in about 20 minutes on a 2-core machine
 * (the benchmark issue's sizes: BENCH_QUEUE_JOBS=20000 BENCH_WORKFLOW3_RUNS=5000
 * BENCH_RECOVERY_RUNS=1000 BENCH_RECOVERY_TIMEOUT_S=60, about 45 minutes there).
 */
const quick = process.env.BENCH_QUICK === '1';

function num(name: string, full: number, quickValue: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return quick ? quickValue : full;
  const value = Number(raw);
  if (!Number.isFinite(value) || value < 0) throw new Error(`${name} must be a non-negative number, got ${JSON.stringify(raw)}`);
  return value;
}

function list(name: string): string[] | undefined {
  const raw = process.env[name];
  return raw
    ? raw
        .split(',')
        .map((s) => s.trim())
        .filter(Boolean)
    : undefined;
}

export const config = {
  quick,
  /** Repetitions per (workload, system); each reported figure is their median. */
  reps: num('BENCH_REPS', 3, 1),
  /** Jobs or workflows executing at once in the one worker process. */
  concurrency: num('BENCH_CONCURRENCY', 16, 16),
  /** Parallel enqueuers (each sends one enqueue at a time: no batch API is used by any system). */
  enqueuers: num('BENCH_ENQUEUERS', 16, 16),
  /** Connections per pool, the same for every system. */
  poolMax: num('BENCH_POOL_MAX', 20, 20),
  queueJobs: num('BENCH_QUEUE_JOBS', 10_000, 2_000),
  workflow3Runs: num('BENCH_WORKFLOW3_RUNS', 2_000, 500),
  txstepRuns: num('BENCH_TXSTEP_RUNS', 2_000, 500),
  /** A drain still running after this many seconds is stopped; its rate is completed / elapsed. */
  drainCapSeconds: num('BENCH_DRAIN_CAP_S', 15, 10),
  latencySamples: num('BENCH_LATENCY_SAMPLES', 200, 30),
  /** Latency sampling stops early after this long (pollers with a 1-2 s interval need it). */
  latencyMaxSeconds: num('BENCH_LATENCY_MAX_S', 15, 10),
  recoveryRuns: num('BENCH_RECOVERY_RUNS', 500, 200),
  /** The first worker is SIGKILLed once this fraction of the runs has completed. */
  recoveryKillAt: num('BENCH_RECOVERY_KILL_AT', 0.5, 0.5),
  recoveryTimeoutSeconds: num('BENCH_RECOVERY_TIMEOUT_S', 30, 20),
  /** runledger's lease in the recovery workload (and only there). */
  recoveryLeaseMs: num('BENCH_RECOVERY_LEASE_MS', 2_000, 2_000),
  pgbenchSeconds: num('BENCH_PGBENCH_S', 10, 3),
  /** graphile-worker "batched": preset.worker.localQueue.size and completeJobBatchDelay. */
  gwLocalQueueSize: num('BENCH_GW_LOCAL_QUEUE', 100, 100),
  gwCompleteBatchDelayMs: num('BENCH_GW_COMPLETE_DELAY_MS', 0, 0),
  /** pg-boss "batched": each of the `concurrency` work() loops fetches this many jobs per poll. */
  pgbossBatchSize: num('BENCH_PGBOSS_BATCH', 100, 100),
  pgbossBatchedPollSeconds: num('BENCH_PGBOSS_POLL_S', 0.5, 0.5),
  /**
   * BENCH_DB_LOCALE=en_US.UTF-8: every benchmark database is created with that locale (from
   * template0), as a user's database has it when its server was initialised under it (the
   * official Docker image's default). Unset: the server's default. The locale must exist on
   * the server's machine (locale -a).
   */
  dbLocale: process.env.BENCH_DB_LOCALE || undefined,
  /** DBOS "poll 10 ms": the queue's minPollingIntervalMs (default 1000). */
  dbosFastPollMs: num('BENCH_DBOS_POLL_MS', 10, 10),
  /** History workloads: finished runs (jobs) and runs waiting a day away loaded before the measurement. */
  historyFinished: num('BENCH_HISTORY_FINISHED', 100_000, 20_000),
  historyWaiting: num('BENCH_HISTORY_WAITING', 10_000, 2_000),
  /** Warm-up before the load: batches of `concurrency` units until this many are done (or 5 s passed). */
  /** BENCH_HISTORY_AUTOVACUUM=off turns autovacuum off on the tables the history goes into (default: on, as a user has it). */
  historyAutovacuum: process.env.BENCH_HISTORY_AUTOVACUUM !== 'off',
  historyWarmUnits: num('BENCH_HISTORY_WARM', 200, 100),
  /** closedloop: callers, each doing start then await result, and the calls measured (stops early at the drain cap). */
  closedLoopCallers: num('BENCH_CLOSEDLOOP_CALLERS', 16, 16),
  closedLoopCalls: num('BENCH_CLOSEDLOOP_CALLS', 2_000, 500),
  /** bulk_enqueue: jobs per path and jobs per batch. */
  bulkJobs: num('BENCH_BULK_JOBS', 20_000, 5_000),
  bulkBatch: num('BENCH_BULK_BATCH', 1_000, 1_000),
  systems: list('BENCH_SYSTEMS'),
  workloads: list('BENCH_WORKLOADS'),
  databaseUrl: process.env.DATABASE_URL || undefined,
  /** Names the report results/<date>-<BENCH_NAME>.md, so a run on another server does not overwrite the day's report. */
  name: process.env.BENCH_NAME || undefined,
};

export type BenchConfig = typeof config;
