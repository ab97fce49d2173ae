import { hostname } from 'node:os';
import pg from 'pg';
import { ulid } from 'ulid';
import { ConfigError, serializeError } from '../errors.js';
import { guardPool } from './pools.js';
import { executeRun } from './execute-run.js';
import { listenForCancels } from './cancel-listener.js';
import { cronTaskIdentifier, crontabFor, fireSchedule, type Schedule, type StartScheduled } from './schedules.js';
import type { Execution, ExecutionDeps } from './execution.js';
import { retryIdempotentStatements, startDispatchRunner, taskIdentifier } from './graphile.js';
import { QUEUE_PATTERN, workflowKey, type Workflow } from './workflow.js';

export const LEASE_MS_DEFAULT = 30_000;
export const LEASE_MS_MIN = 500;
export const CONCURRENCY_DEFAULT = 16;
export const SHUTDOWN_TIMEOUT_MS_DEFAULT = 10_000;
export const POLL_INTERVAL_MS_DEFAULT = 2_000;
export const ORPHAN_AFTER_MS_DEFAULT = 30_000;
/** A due timer this late is woken by the sweeper instead of its dispatch job. */
export const WAKE_GRACE_MS = 2_000;

export interface WorkerOptions {
  /** Runs executed at once by this process; default 16. */
  concurrency?: number;
  /** Queues served (every workflow defined on the engine, on each of them); default: the workflows' own queues. */
  queues?: string[];
  /** How long a silent worker keeps its runs before another worker recovers them; default 30 s, at least 500 ms. */
  leaseMs?: number;
  /** How often the sweeper looks for expired leases; default leaseMs / 2. */
  sweepIntervalMs?: number;
  /** A PENDING run with no dispatch job waiting for this long is dispatched again; default 30 s. */
  orphanAfterMs?: number;
  /** Fallback poll for dispatch jobs when LISTEN/NOTIFY is missed; default 2 s. */
  pollIntervalMs?: number;
  /**
   * Dispatch jobs fetched per query (graphile-worker's local queue); default: the
   * concurrency. Fewer queries under load; 1 fetches one job at a time.
   */
  fetchBatchSize?: number;
  /** On stop(), how long in-flight runs may take to finish before they are released; default 10 s. */
  shutdownTimeoutMs?: number;
  workerId?: string;
}

export interface Worker {
  readonly workerId: string;
  /** Runs executing right now. */
  readonly inFlight: number;
  /** Graceful: stops taking runs, lets in-flight ones finish (up to shutdownTimeoutMs), then releases the rest. */
  stop(): Promise<void>;
}

export interface WorkerHost {
  deps: ExecutionDeps;
  poolConfig: pg.PoolConfig;
  workflows: ReadonlyArray<Workflow<any, any>>;
  registerWorkflow: (workflow: Workflow<any, any>) => Promise<void>;
  schedules: ReadonlyArray<Schedule>;
  startScheduled: StartScheduled;
}

export async function startWorker(host: WorkerHost, options: WorkerOptions = {}): Promise<Worker> {
  const concurrency = options.concurrency ?? CONCURRENCY_DEFAULT;
  const leaseMs = options.leaseMs ?? LEASE_MS_DEFAULT;
  if (!Number.isInteger(concurrency) || concurrency < 1) throw new ConfigError('runWorker: concurrency must be a whole number >= 1');
  if (!Number.isInteger(leaseMs) || leaseMs < LEASE_MS_MIN) throw new ConfigError(`runWorker: leaseMs must be a whole number >= ${LEASE_MS_MIN}`);
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
  const workerId = options.workerId ?? `${hostname()}-${process.pid}-${ulid()}`;
  const { deps } = host;
  const executions = new Set<Execution>();

  for (const workflow of served) await host.registerWorkflow(workflow);
  await deps.pool.query('select runledger._register_worker($1, $2, $3, $4, $5, $6, $7)', [
    workerId, hostname(), process.pid, [...byKey.keys()], queues, concurrency, leaseMs,
  ]);

  // graphile-worker gets its own small pool: its LISTEN connection and job fetches
  // must not queue behind long user transactions on the engine pool.
  const dispatchPool = new pg.Pool({ ...host.poolConfig, max: Math.max(4, Math.ceil(concurrency / 4) + 2) });
  guardPool(dispatchPool, 'dispatch pool', deps.log);
  retryIdempotentStatements(dispatchPool);

  const execOptions = {
    deps,
    workerId,
    leaseMs,
    resolveWorkflow: (name: string, version: string) => byKey.get(workflowKey(name, version)),
    isExecuting: (runId: string) => [...executions].some((exec) => exec.runId === runId),
    track: (exec: Execution) => void executions.add(exec),
    untrack: (exec: Execution) => void executions.delete(exec),
  };
  const tasks = new Map<string, (payload: Record<string, unknown>) => Promise<void>>();
  for (const [queue, workflow] of queues.flatMap((q) => served.map((w) => [q, w] as const))) {
    tasks.set(taskIdentifier(queue, workflow.name, workflow.version), async (payload) => {
      const runId = payload.runId;
      if (typeof runId !== 'string') return;
      try {
        await executeRun(runId, execOptions);
      } catch (error) {
        // Only a claim that never reached the database gets here: failing the job makes
        // graphile-worker dispatch it again later.
        deps.log('error', `run ${runId}: claim failed; the dispatch will be retried`, { error: serializeError(error) });
        throw error;
      }
    });
  }

  for (const schedule of host.schedules) {
    tasks.set(cronTaskIdentifier(schedule.name), (payload) => fireSchedule(schedule, payload, host.startScheduled));
  }
  const runner = await startDispatchRunner({
    pool: dispatchPool,
    concurrency,
    pollIntervalMs: options.pollIntervalMs ?? POLL_INTERVAL_MS_DEFAULT,
    fetchBatchSize: options.fetchBatchSize ?? concurrency,
    tasks,
    crontab: crontabFor(host.schedules),
    onError: (message) => deps.log('warn', `dispatch: ${message}`),
  });

  let lastHeartbeatOk = Date.now();
  const heartbeat = async () => {
    const sentAt = Date.now();
    try {
      const selfBeating = [...executions].filter((exec) => exec.selfHeartbeat).map((exec) => exec.runId);
      const result = await deps.pool.query('select runledger._heartbeat($1, $2, $3) as runs', [workerId, leaseMs, selfBeating]);
      lastHeartbeatOk = Date.now();
      const renewed = new Set<string>(result.rows[0].runs);
      for (const exec of executions) {
        // A run claimed after this heartbeat was sent may legitimately be missing from its answer.
        if (exec.claimedAt < sentAt && !renewed.has(exec.runId) && !selfBeating.includes(exec.runId)) {
          exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: lease no longer held by ${workerId}` });
        }
      }
    } catch (error) {
      deps.log('warn', 'heartbeat failed', { error: serializeError(error) });
      if (Date.now() - lastHeartbeatOk > leaseMs) {
        // We cannot prove we still own anything: stop user code early (its writes would be fenced anyway).
        for (const exec of executions) exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: heartbeat failing for longer than the lease` });
      }
    }
  };
  const orphanAfterMs = options.orphanAfterMs ?? ORPHAN_AFTER_MS_DEFAULT;
  let lastOrphanSweep = 0;
  const sweep = async () => {
    try {
      const result = await deps.pool.query('select runledger._recover_expired(1000) as recovered');
      if (result.rows[0].recovered > 0) deps.log('info', `recovered ${result.rows[0].recovered} run(s) with expired leases`);
      await deps.pool.query('select runledger._redispatch_stuck($1, 1000)', [leaseMs]);
      await deps.pool.query('select runledger._enforce_deadlines(1000)');
      await deps.pool.query('select runledger._admit_all(1000)');
      // Timers normally fire as delayed dispatch jobs; this catches any that went missing.
      await deps.pool.query('select runledger._wake_due(1000, $1)', [WAKE_GRACE_MS]);
      if (Date.now() - lastOrphanSweep >= orphanAfterMs / 2) {
        lastOrphanSweep = Date.now();
        const orphans = await deps.pool.query('select runledger._redispatch_orphans($1, 1000) as n', [orphanAfterMs]);
        if (orphans.rows[0].n > 0) deps.log('warn', `dispatched ${orphans.rows[0].n} pending run(s) again that had no dispatch job`);
      }
    } catch (error) {
      deps.log('warn', 'sweep failed', { error: serializeError(error) });
    }
  };
  const cancelListener = await listenForCancels(host.poolConfig, deps.log, (runId) => {
    for (const exec of executions) if (exec.runId === runId) exec.requestCancel();
  });
  const heartbeatTimer = setInterval(() => void heartbeat(), Math.max(100, Math.floor(leaseMs / 3)));
  const sweepEvery = options.sweepIntervalMs ?? Math.max(250, Math.floor(leaseMs / 2));
  const sweepTimer = setInterval(() => void sweep(), sweepEvery);
  void sweep();

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= (async () => {
      clearInterval(sweepTimer);
      const shutdownTimeoutMs = options.shutdownTimeoutMs ?? SHUTDOWN_TIMEOUT_MS_DEFAULT;
      const releaseTimer = setTimeout(() => {
        for (const exec of executions) exec.halt({ kind: 'shutdown' });
      }, shutdownTimeoutMs);
      try {
        await runner.stop();
      } finally {
        clearTimeout(releaseTimer);
        clearInterval(heartbeatTimer);
        await deps.pool.query('select runledger._stop_worker($1)', [workerId]).catch((error) => {
          deps.log('warn', 'could not release runs on stop; their leases will expire', { error: serializeError(error) });
        });
        await cancelListener.close();
        await dispatchPool.end().catch(() => undefined);
      }
    })());

  return {
    workerId,
    get inFlight() {
      return executions.size;
    },
    stop,
  };
}
