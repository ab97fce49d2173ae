import { hostname } from 'node:os';
import pg from 'pg';
import { newId } from '../core/ids.js';
import { ConfigError, serializeError } from '../core/errors.js';
import { guardPool } from '../db/pools.js';
import { executeClaimed, type ExecutionEnd } from './execute.js';
import { CANCEL_CHANNEL, listen, MIGRATE_CHANNEL, RUNNABLE_CHANNEL } from '../db/listen.js';
import { createMigrator, migrationsOf } from './migrator.js';
import { Dispatcher, type ClaimedRun } from './dispatcher.js';
import { GroupCommit } from './group-commit.js';
import { createHeartbeat } from './heartbeat.js';
import { createSweeper } from './sweeper.js';
import { createReclaimer } from './reclaimer.js';
import { createRetention, RETENTION_INTERVAL_MS_DEFAULT } from './retention.js';
import { cronTaskIdentifier, crontabFor, fireSchedule, type Schedule, type StartScheduled } from '../client/schedules.js';
import type { EngineDeps, Execution } from '../run/execution.js';
import type { CrashPoints } from '../core/crash-points.js';
import { deadAfterCrash } from './dead-pool.js';
import { FinishedLookup } from '../observe/finished.js';
import { observeGauges } from '../observe/gauges.js';
import { retryIdempotentStatements, startCronRunner, type CronRunner } from '../db/graphile.js';
import { QUEUE_PATTERN, workflowKey, type Workflow } from '../core/workflow.js';

export const LEASE_MS_DEFAULT = 30_000;
export const LEASE_MS_MIN = 500;
export const CONCURRENCY_DEFAULT = 16;
export const SHUTDOWN_TIMEOUT_MS_DEFAULT = 10_000;
/** On stop(), after the grace period: how long aborted runs may take to give themselves back before stop() goes on without them. */
export const STOP_RELEASE_MS = 2_000;
/** On stop(), the most each closing query (the release of what is still held, the listener) may take. */
export const STOP_QUERY_MS = 2_000;
export const POLL_INTERVAL_MS_DEFAULT = 2_000;
/** Shortest poll or sweep interval accepted. */
export const INTERVAL_MS_MIN = 10;

export interface WorkerOptions {
  /** Runs executed at once by this process; default 16. */
  concurrency?: number;
  /** Queues served (every workflow defined on the engine, on each of them); default: the workflows' own queues. */
  queues?: string[];
  /** How long a silent worker keeps its runs before another worker recovers them; default 30 s, at least 500 ms. */
  leaseMs?: number;
  /** How often the sweeper looks for expired leases; default leaseMs / 2. */
  sweepIntervalMs?: number;
  /**
   * How often the cluster applies runledger.retention (docs/retention.md): one worker at a
   * time, once per interval across every worker, runs runledger.prune_due in batches until
   * nothing is due. Default 10 minutes; 0 or false: this worker never does it.
   */
  retentionIntervalMs?: number | false;
  /** Look for runnable runs at least this often, in case a notification was missed; default 2 s. */
  pollIntervalMs?: number;
  /**
   * Most runs claimed per query; default: the concurrency. A claim never takes more
   * runs than there are free slots; 1 claims one run at a time.
   */
  fetchBatchSize?: number;
  /** On stop(), how long in-flight runs may take to finish before they are released; default 10 s. */
  shutdownTimeoutMs?: number;
  workerId?: string;
  /**
   * The host this worker reports (runledger.workers.host, the worker id's prefix, `runledger
   * workers`, the console): default RUNLEDGER_HOST from the environment, else the machine's
   * hostname. Give each pod or VM its own when several share a hostname (containers, a host
   * that runs several workers standing for separate machines).
   */
  host?: string;
  /**
   * A manual worker claims only when told, through runOnce() and drain(), and runs no
   * timers of its own (no poll, no sweep): a deterministic driver for tests (see runledger/testing).
   */
  manual?: boolean;
}

export interface Worker {
  readonly workerId: string;
  /** Runs executing right now. */
  readonly inFlight: number;
  /**
   * Graceful: stops taking runs, lets in-flight ones finish (up to shutdownTimeoutMs), then
   * aborts and releases the rest and marks the worker stopped. Ends within about
   * shutdownTimeoutMs + 4 s, even when the database is unreachable (the leases then expire).
   */
  stop(): Promise<void>;
  /**
   * Now (a second signal): abandons the runs in flight and releases every run still held
   * (runledger._stop_worker), waiting at most timeoutMs (default 2 s). Resolves with how
   * many runs it released, undefined if it could not (their leases expire).
   */
  forceStop(timeoutMs?: number): Promise<number | undefined>;
  /**
   * Manual workers only: one round of what the worker's timers would do (recover expired
   * leases, enforce deadlines, admit, wake due timers), then one claim, and waits until
   * every run it took has completed, failed or suspended. Returns how many runs it took.
   */
  runOnce(): Promise<number>;
  /** Manual workers only: runOnce() until a round takes nothing; returns how many runs it took in all. */
  drain(options?: { maxRounds?: number }): Promise<number>;
  /** True once a crash point (engine option crashAt) killed this worker. */
  readonly crashed: boolean;
}

/** What the engine that started a worker may ask of it beyond the public Worker. */
export interface LocalWorker extends Worker {
  readonly leaseMs: number;
  /**
   * A start in this process offers the worker its run (a workflow it serves, on a queue it
   * serves), under the run id the start asks for: true when the worker takes it. The start
   * then claims the run for this worker in its own transaction and hands it over with
   * executeClaimed(), or calls wake(runId) when it claimed nothing.
   */
  takeLocal(workflowKey: string, queue: string, runId: string): boolean;
  /**
   * A run claimed for this worker at its start (runledger._start_claimed). Resolves when
   * its execution here ends: with the committed output if it completed the run, else
   * undefined (it waits, was released, lost its lease... or was never executed).
   */
  executeClaimed(run: ClaimedRun): Promise<ExecutionEnd>;
  /** The start that asked under runId claimed nothing here (or failed): the slot is free again and the worker claims as usual. */
  wake(runId: string): void;
}

/** The worker's host identity: the option, else RUNLEDGER_HOST, else the hostname; a usable name or CONFIG. */
export function workerHost(option: string | undefined, env: NodeJS.ProcessEnv = process.env): string {
  const chosen = option ?? (env.RUNLEDGER_HOST?.trim() || hostname());
  if (typeof chosen !== 'string' || !/^[\w.:@-]{1,200}$/.test(chosen)) {
    throw new ConfigError(
      `runWorker: host must be 1-200 letters, digits or . _ : @ - (from the option or RUNLEDGER_HOST), not ${JSON.stringify(chosen)}`,
    );
  }
  return chosen;
}

/** Rounds after which drain() gives up: a run that keeps coming back at once would loop forever. */
export const DRAIN_ROUNDS_MAX = 1_000;

export interface WorkerHost {
  deps: EngineDeps;
  crashPoints: CrashPoints;
  poolConfig: pg.PoolConfig;
  workflows: ReadonlyArray<Workflow<any, any>>;
  registerWorkflow: (workflow: Workflow<any, any>) => Promise<void>;
  schedules: ReadonlyArray<Schedule>;
  startScheduled: StartScheduled;
}

export async function startWorker(host: WorkerHost, options: WorkerOptions = {}): Promise<LocalWorker> {
  const concurrency = options.concurrency ?? CONCURRENCY_DEFAULT;
  const leaseMs = options.leaseMs ?? LEASE_MS_DEFAULT;
  if (!Number.isInteger(concurrency) || concurrency < 1) throw new ConfigError('runWorker: concurrency must be a whole number >= 1');
  // At most what an int (runledger.workers.lease_ms) and setTimeout hold: 2^31 - 1 ms, 24.8 days.
  if (!Number.isInteger(leaseMs) || leaseMs < LEASE_MS_MIN || leaseMs > 2 ** 31 - 1)
    throw new ConfigError(`runWorker: leaseMs must be a whole number from ${LEASE_MS_MIN} to ${2 ** 31 - 1}`);
  const fetchBatchSize = options.fetchBatchSize ?? concurrency;
  if (!Number.isInteger(fetchBatchSize) || fetchBatchSize < 1)
    throw new ConfigError('runWorker: fetchBatchSize must be a whole number >= 1');
  // A poll or sweep of 0 ms would run a query in a loop.
  for (const name of ['pollIntervalMs', 'sweepIntervalMs'] as const) {
    const value = options[name];
    if (value !== undefined && (!Number.isInteger(value) || value < INTERVAL_MS_MIN)) {
      throw new ConfigError(`runWorker: ${name} must be a whole number >= ${INTERVAL_MS_MIN}`);
    }
  }
  const retentionEvery = options.retentionIntervalMs ?? RETENTION_INTERVAL_MS_DEFAULT;
  if (
    retentionEvery !== false &&
    !(Number.isInteger(retentionEvery) && (retentionEvery === 0 || (retentionEvery as number) >= INTERVAL_MS_MIN))
  ) {
    throw new ConfigError(`runWorker: retentionIntervalMs must be 0, false or a whole number >= ${INTERVAL_MS_MIN}`);
  }
  const queues = options.queues ?? [...new Set(host.workflows.map((w) => w.queue))];
  for (const queue of queues) {
    if (!QUEUE_PATTERN.test(queue)) throw new ConfigError(`runWorker: queue ${JSON.stringify(queue)} is invalid`);
  }
  if (queues.length === 0 || host.workflows.length === 0) {
    throw new ConfigError('runWorker: no workflow is defined on this engine; define workflows before starting a worker');
  }
  // A run's queue is chosen at start (default: its workflow's queue), so the worker serves
  // every workflow it knows on every queue it was given.
  const served = host.workflows;
  const byKey = new Map(served.map((w) => [workflowKey(w.name, w.version), w]));
  const hostName = workerHost(options.host);
  const workerId = options.workerId ?? `${hostName}-${process.pid}-${newId()}`;
  const executions = new Set<Execution>();
  const manual = options.manual ?? false;
  if (typeof manual !== 'boolean') throw new ConfigError('runWorker: manual must be true or false');
  // After a crash point fired, this worker's queries never settle: like a killed process,
  // it writes nothing more, and its leases run out for another worker to recover.
  let crashed = false;
  const pool = deadAfterCrash(host.deps.pool, () => crashed);
  const crash = host.crashPoints.forWorker((point, name) => {
    crashed = true;
    deps.log('warn', `crash point ${point.when}${point.step ? `:${point.step}` : ''} reached at ${name}: the worker stops as if killed`);
    die();
  });
  // Environments (WorkflowOptions.environment) this process has, and its reclaimer, bound below.
  const localEnvironments = new Set<string>();
  let reclaimer: ReturnType<typeof createReclaimer> | undefined;
  const deps: EngineDeps = {
    ...host.deps,
    pool,
    localEnvironments,
    // A run that finished here has its environments reclaimed at once, by this worker.
    finished: (runId) => {
      host.deps.finished?.(runId);
      void reclaimer?.run(runId);
    },
    ...(crash ? { crash } : {}),
  };
  const { metrics } = deps;
  if (metrics) deps.finishedRuns = new FinishedLookup(deps.pool, metrics);

  const migrations = migrationsOf(served);
  for (const workflow of served) await host.registerWorkflow(workflow);
  await deps.pool.query(
    'select runledger._register_worker(p_worker_id => $1, p_host => $2, p_pid => $3, p_workflows => $4, p_queues => $5, p_concurrency => $6, p_lease_ms => $7, p_migrations => $8)',
    [workerId, hostName, process.pid, [...byKey.keys()], queues, concurrency, leaseMs, [...migrations.keys()]],
  );

  const done = new Set<Promise<unknown>>();
  // Checkpoints and completions of this worker's concurrent runs share commits.
  const commits = new GroupCommit(deps.pool, 1, 64, crash, deps.metrics);
  commits.tracing = deps.tracing;
  const execOptions = {
    deps: { ...deps, commits },
    workerId,
    leaseMs,
    resolveWorkflow: (name: string, version: string) => byKey.get(workflowKey(name, version)),
    track: (exec: Execution) => void executions.add(exec),
    untrack: (exec: Execution) => void executions.delete(exec),
  };
  // graphile-worker fires cron ticks (once across workers); it gets its own small pool.
  let cronPool: pg.Pool | undefined;
  let cronRunner: CronRunner | undefined;
  if (host.schedules.length > 0 && !manual) {
    cronPool = new pg.Pool({ ...host.poolConfig, max: 3 });
    guardPool(cronPool, 'cron pool', deps.log);
    retryIdempotentStatements(cronPool);
    const tasks = new Map<string, (payload: Record<string, unknown>) => Promise<void>>();
    for (const schedule of host.schedules) {
      tasks.set(cronTaskIdentifier(schedule.name), (payload) => fireSchedule(schedule, payload, host.startScheduled));
    }
    cronRunner = await startCronRunner({
      pool: cronPool,
      concurrency: 1,
      pollIntervalMs: options.pollIntervalMs ?? POLL_INTERVAL_MS_DEFAULT,
      fetchBatchSize: 1,
      tasks,
      crontab: crontabFor(host.schedules),
      onError: (message) => deps.log('warn', `cron: ${message}`),
    });
  }

  let dispatcher: Dispatcher | undefined;
  const heartbeats = createHeartbeat({
    pool: deps.pool,
    workerId,
    leaseMs,
    executions,
    log: deps.log,
    reclaimUnexecuted: () => dispatcher?.reclaimUnexecuted(),
    isStarting: (runId) => dispatcher?.isStarting(runId) ?? false,
  });
  const heartbeat = oneAtATime(heartbeats.beat);
  const sweeper = createSweeper(deps.pool, deps.log, metrics);
  // The database's gauges, read when the provider collects, while this worker runs.
  const gauges = metrics
    ? observeGauges(deps.pool, metrics, queues, (error) =>
        deps.log('warn', 'metrics: could not read the gauges', { error: serializeError(error) }),
      )
    : undefined;
  let stopRequested = false;
  // Runs an operator marked with migrate_run are migrated by the sweep (and at once on its notification).
  const migrator = createMigrator({
    pool: deps.pool,
    workerId,
    migrations,
    maxPayloadBytes: deps.maxPayloadBytes,
    log: deps.log,
    ...(deps.payloads ? { payloads: deps.payloads } : {}),
    ...(crash ? { crash } : {}),
  });
  reclaimer = createReclaimer({ pool: deps.pool, workerId, served, log: deps.log, local: localEnvironments, leaseMs });
  const sweep = oneAtATime(async () => {
    await sweeper();
    // Environments of runs that finished without their worker (a cancel while waiting, a dead letter, a crash).
    if (manual) await reclaimer?.run();
    else void reclaimer?.run();
    // A manual worker's runOnce() includes the migrations; a running worker's sweep only
    // starts them, so a long batch of migrations never delays lease recovery.
    if (manual) await migrator.run();
    else void migrator.run();
  });
  const listener = await listen(
    host.poolConfig,
    deps.log,
    {
      [CANCEL_CHANNEL]: (runId) => {
        for (const exec of executions) if (exec.runId === runId) exec.requestCancel();
      },
      [RUNNABLE_CHANNEL]: (payload) => dispatcher?.notified(payload),
      [MIGRATE_CHANNEL]: (pair) => {
        if (migrations.has(pair) && !manual && !stopRequested) void migrator.run();
      },
    },
    () => dispatcher?.hint(),
  );
  // Each tick checks the lapse first: a heartbeat still waiting for its answer makes run() a no-op.
  const heartbeatTimer = setInterval(
    () => {
      heartbeats.checkLapse();
      void heartbeat.run();
    },
    Math.max(100, Math.floor(leaseMs / 3)),
  );
  const sweepEvery = options.sweepIntervalMs ?? Math.max(250, Math.floor(leaseMs / 2));
  const sweepTimer = manual ? undefined : setInterval(() => void sweep.run(), sweepEvery);
  if (!manual) void sweep.run();
  // Retention: every worker asks, at twice the interval's rate; the database lets one of
  // them run each pass (runledger._maintenance_begin).
  const retentionOn = !manual && typeof retentionEvery === 'number' && retentionEvery > 0;
  const retention = oneAtATime(async () => {
    if (!retentionOn) return;
    await createRetention({ pool: deps.pool, workerId, intervalMs: retentionEvery, log: deps.log, stopping: () => stopRequested })();
  });
  const retentionTimer = retentionOn
    ? setInterval(() => void retention.run(), Math.max(INTERVAL_MS_MIN, Math.floor(retentionEvery / 2)))
    : undefined;
  if (retentionOn) void retention.run();

  // Last: from here on runs are claimed.
  const claimer: Dispatcher = new Dispatcher({
    pool: deps.pool,
    workerId,
    queues,
    workflows: [...byKey.keys()],
    leaseMs,
    concurrency,
    batchSize: fetchBatchSize,
    pollIntervalMs: options.pollIntervalMs ?? POLL_INTERVAL_MS_DEFAULT,
    executing: () => [...executions].map((exec) => exec.runId),
    commitBusy: () => commits.busy,
    execute: (run: ClaimedRun) => execute(run),
    log: deps.log,
    manual,
  });
  dispatcher = claimer;
  commits.claimer = claimer;

  function execute(run: ClaimedRun): Promise<ExecutionEnd> {
    const running = executeClaimed(run, execOptions).finally(() => {
      done.delete(running);
      claimer.slotFreed();
    });
    done.add(running);
    return running;
  }

  /** A run claimed for this worker in its start's transaction; resolves as executeClaimed does (at once when not executed). */
  async function executeStarted(run: ClaimedRun): Promise<ExecutionEnd> {
    claimer.settlePromise(run.run_id);
    // Killed: its lease runs out for another worker, as with any run a dead process held.
    if (crashed || crash?.hit('after-start-claimed', run.workflow_name)) return undefined;
    if (stopping !== undefined) {
      // Stopping: given back at once, as a graceful stop gives back what it does not finish.
      // The stop waits for it (done) before it closes anything.
      const releasing = deps.pool
        .query('select runledger._release_run(p_run_id => $1, p_token => $2, p_delay_ms => 0, p_reason => $3)', [
          run.run_id,
          run.fencing_token,
          'worker_stopping',
        ])
        .then(
          () => undefined,
          (error) =>
            deps.log('warn', 'could not release a run started while stopping; its lease will expire', { error: serializeError(error) }),
        )
        .finally(() => done.delete(releasing));
      done.add(releasing);
      return undefined;
    }
    return execute(run);
  }

  /** A crash point fired: everything stops at once, nothing is released or deregistered. */
  function die(): void {
    markCrashed();
    gauges?.remove();
    clearInterval(sweepTimer);
    clearInterval(retentionTimer);
    clearInterval(heartbeatTimer);
    void claimer.stop();
    for (const exec of executions) exec.halt({ kind: 'crashed' });
    void listener.close();
    void cronRunner?.stop().catch(() => undefined);
  }

  const runOnce = async (): Promise<number> => {
    if (!manual) throw new ConfigError('runOnce() and drain() need a manual worker: runWorker({ manual: true })');
    if (crashed) return 0;
    await sweep.run();
    const claimed = await claimer.claimOnce();
    while (done.size > 0 && !crashed) await Promise.race([Promise.allSettled([...done]), crashedSignal]);
    return claimed;
  };
  let markCrashed!: () => void;
  const crashedSignal = new Promise<void>((resolve) => (markCrashed = resolve));

  let stopping: Promise<void> | undefined;
  /**
   * The stop sequence: claim nothing more, let the runs in flight finish for up to the
   * grace period (shutdownTimeoutMs; heartbeats go on meanwhile), then abort them and give
   * each back (released), then _stop_worker gives back whatever is still held (a step deaf
   * to its abort signal, a run held CANCELLING) and marks the worker stopped. Every wait
   * after the grace period is bounded, so a stop ends by about grace + STOP_RELEASE_MS +
   * STOP_QUERY_MS even with the database unreachable (the leases then expire on their own).
   * An execution still stuck in user code is abandoned: its writes are fenced.
   */
  const stop = () =>
    (stopping ??= (async () => {
      if (crashed) return;
      stopRequested = true;
      gauges?.remove();
      clearInterval(sweepTimer);
      clearInterval(retentionTimer);
      const shutdownTimeoutMs = options.shutdownTimeoutMs ?? SHUTDOWN_TIMEOUT_MS_DEFAULT;
      let graceEnded!: () => void;
      const graceOver = new Promise<void>((resolve) => (graceEnded = resolve));
      const haltAll = () => {
        for (const exec of executions) exec.halt({ kind: 'shutdown' });
        graceEnded();
      };
      const releaseTimer = setTimeout(haltAll, shutdownTimeoutMs);
      try {
        await Promise.race([claimer.stop(), graceOver]);
        await Promise.race([cronRunner?.stop(), graceOver]);
        const drained = (async () => {
          while (done.size > 0) await Promise.allSettled([...done]);
        })();
        await Promise.race([drained, graceOver]);
        clearTimeout(releaseTimer);
        if (done.size > 0) {
          const left = done.size;
          if ((await within(drained, STOP_RELEASE_MS)) === false) {
            deps.log(
              'warn',
              `stop: ${done.size} of ${left} run(s) still in user code ${STOP_RELEASE_MS} ms after the abort; releasing them`,
            );
          }
        }
      } finally {
        clearTimeout(releaseTimer);
        clearInterval(heartbeatTimer);
        // A sweep or heartbeat still on its way finishes first: none may query the pool after
        // stop() returned (engine.close() ends the pool next).
        await within(
          Promise.all([
            sweep.settled(),
            retention.settled(),
            heartbeat.settled(),
            migrator.stop(),
            reclaimer?.settled(),
            deps.finishedRuns?.settled(),
          ]),
          STOP_QUERY_MS,
        );
        await releaseHeld(STOP_QUERY_MS);
        await within(listener.close(), STOP_QUERY_MS);
        await cronPool?.end().catch(() => undefined);
      }
    })());

  /** runledger._stop_worker: every run still held goes back (RUNNING to PENDING, CANCELLING unowned), the worker is marked stopped. */
  const releaseHeld = async (timeoutMs: number): Promise<number | undefined> => {
    const released = deps.pool.query('select runledger._stop_worker(p_worker_id => $1) as n', [workerId]).then(
      (result) => Number(result.rows[0].n),
      (error) => {
        deps.log('warn', 'could not release runs on stop; their leases will expire', { error: serializeError(error) });
        return undefined;
      },
    );
    const n = await within(released, timeoutMs);
    if (n === false) deps.log('warn', `could not release runs on stop within ${timeoutMs} ms; their leases will expire`);
    return n === false ? undefined : n;
  };

  /**
   * A second signal: everything still held is given back now (the executions are
   * abandoned: their writes are fenced), bounded by timeoutMs. Resolves with how many runs
   * it released, or undefined when it could not.
   */
  const forceStop = async (timeoutMs = STOP_QUERY_MS): Promise<number | undefined> => {
    if (crashed) return undefined;
    stopRequested = true;
    void claimer.stop();
    clearInterval(sweepTimer);
    clearInterval(heartbeatTimer);
    for (const exec of executions) exec.halt({ kind: 'shutdown' });
    return releaseHeld(timeoutMs);
  };

  return {
    workerId,
    get inFlight() {
      return executions.size;
    },
    get crashed() {
      return crashed;
    },
    stop,
    forceStop,
    runOnce,
    leaseMs,
    takeLocal: (key, queue, runId) => !crashed && stopping === undefined && byKey.has(key) && claimer.takeLocal(queue, runId),
    executeClaimed: (run) => executeStarted(run),
    wake: (runId) => {
      claimer.settlePromise(runId);
      claimer.hint();
    },
    async drain({ maxRounds = DRAIN_ROUNDS_MAX } = {}) {
      if (!Number.isInteger(maxRounds) || maxRounds < 1) throw new ConfigError('drain(): maxRounds must be a whole number >= 1');
      let total = 0;
      for (let round = 0; round < maxRounds; round++) {
        const claimed = await runOnce();
        if (claimed === 0 || crashed) return total + claimed;
        total += claimed;
      }
      throw new ConfigError(`drain(): runs were still runnable after ${maxRounds} rounds (a run that keeps coming back at once?)`);
    },
  };
}

/** Waits for `promise` at most `ms`: its value, or false when the time ran out first (a rejection counts as settled). */
async function within<T>(promise: Promise<T> | undefined, ms: number): Promise<T | false | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([(promise ?? Promise.resolve(undefined)).catch(() => undefined), timeout]);
  } finally {
    clearTimeout(timer);
  }
}

/**
 * A timer's task run at most once at a time: a tick that finds the previous run still on
 * its way joins it instead of starting another; settled() waits for the one in flight.
 */
function oneAtATime(task: () => Promise<void>): { run: () => Promise<void>; settled: () => Promise<void> } {
  let current: Promise<void> | undefined;
  return {
    run: () =>
      (current ??= task().finally(() => {
        current = undefined;
      })),
    settled: async () => {
      await current;
    },
  };
}
