import { Kysely, PostgresDialect } from 'kysely';
import pg from 'pg';
import { z } from 'zod';
import { ConfigError } from './core/errors.js';
import { resultSchemaKey, type EngineDeps } from './run/execution.js';
import { checkResolvedResult } from '../steps/operation.js';
import { connectionTimeouts, guardPool, QUERY_TIMEOUT_MS_DEFAULT } from './db/pools.js';
import { CrashPoints, validateCrashPoints, type CrashPoint } from './core/crash-points.js';
import { migrate } from './db/migrate.js';
import { multiHostClient, parseMultiHost } from './db/multi-host.js';
import { setQueue, type QueueOptions, type QueueRecord } from './client/queues.js';
import { pauseRateLimit, setRateLimit, type RateLimitOptions, type RateLimitRecord } from './client/rate-limits.js';
import { defineSchedule, type Schedule, type ScheduleOptions, type StartScheduled } from './client/schedules.js';
import {
  cancelRun,
  compensateRun,
  decideApproval,
  forkRun,
  resolveOperation,
  sendSignal,
  type DecisionInput,
  type DecisionRecord,
} from './client/operator.js';
import { forkKeyWarnings, forkKeyWarningText } from './client/fork-keys.js';
import { migrateRun, migrateRuns, type MigrateRunOptions, type MigrateRunsResult, type MigrationOutcome } from './client/migrations.js';
import { getRun, listRuns, retryRun, type ListRunsOptions, type RunRecord } from './client/runs.js';
import {
  handleFor,
  startMany,
  startRun,
  type LocalTaker,
  type RunHandle,
  type StartHost,
  type StartManyOptions,
  type StartOptions,
} from './client/start.js';
import { StartBatcher } from './client/start-batch.js';
import { ResultWatch } from './client/results.js';
import { readStream, StreamWatch, type ReadStreamOptions, type StreamChunk } from './client/streams.js';
import type { RunStatus } from './core/states.js';
import type { Duration } from './core/duration.js';
import type { Jsonify } from './core/jsonify.js';
import type { RunledgerDatabase } from './db/schema.js';
import { startWorker, type LocalWorker, type Worker, type WorkerOptions } from './worker/worker.js';
import { readArtifact, type ArtifactContentRead } from '../agents/artifact.js';
import { defineWorkflow, limitsToSql, workflowKey, type Workflow, type WorkflowFunction, type WorkflowOptions } from './core/workflow.js';

export const MAX_PAYLOAD_BYTES_DEFAULT = 4 * 1024 * 1024;
export const POOL_MAX_DEFAULT = 20;

import { engineLog, isLogger, type LogFunction, type LogOption } from './core/log.js';
import type { SecretResolver } from './core/secrets.js';
import type { PayloadCodec } from './core/codec.js';
import { NO_CODEC, Payloads } from './core/payloads.js';
import { Tracing, type TracerProviderLike } from './observe/tracing.js';
export type { LogFunction, LogLevel, LogOption, Logger, RunLogFields } from './core/log.js';
import { createMetrics, type MeterProviderLike } from './observe/metrics.js';
import { RUNTIME_VERSION } from './core/version.js';
export type { MeterProviderLike } from './observe/metrics.js';
export type { SecretResolver } from './core/secrets.js';
export type { TracerProviderLike } from './observe/tracing.js';
// ctx's members are merged into core's WorkflowContext by agents/context.ts: whoever sees the Engine type sees them.
export type { WorkflowContext } from '../agents/context.js';

export interface EngineOptions {
  /** PostgreSQL URL; default process.env.DATABASE_URL. */
  connectionString?: string;
  /** Bring your own pool instead of a connection string. */
  pool?: pg.Pool;
  /** Only 'runledger' for now: the SQL files name their schema explicitly so they run as-is in psql. */
  schema?: string;
  /** Largest input or step output stored, in bytes; default 4 MiB. */
  maxPayloadBytes?: number;
  /** Connections in the engine's own pool; default 20 (size it to worker concurrency + a few). */
  poolMax?: number;
  /**
   * Longest wait for the answer of any query on the engine's own connections (pg's
   * query_timeout), and for a connection; default 60 s. A query without an answer by then
   * fails and its connection is discarded: a half-open connection never hangs a worker.
   * Keep it above your longest statement in ctx.transaction. Not applied to a pool you pass.
   */
  queryTimeoutMs?: number;
  /**
   * Where the engine's log lines go: a function `(level, message, meta)`, or a pino-compatible
   * logger (`info`/`warn`/`error` taking `(fields, message)`, and `child`), which gets a child
   * `{ component: 'runledger' }` and, per run, a child of that with `runId`, `workflow` and
   * `version`. Every line about a run carries those fields (in `meta` for a function).
   * Default: console.warn/error for 'warn'/'error', silent for 'info'.
   */
  log?: LogOption;
  /**
   * Resolves ctx.secret(name) at run time: `(name, { runId, workflow, version, signal }) => value`
   * (undefined or null: no such secret). Called at most once per name and execution; the value
   * is never stored, logged or put in an error, and a payload holding it is refused
   * (docs/security.md#secret-references).
   */
  secrets?: SecretResolver;
  /**
   * Encodes every user payload before it is stored and decodes it when read (run input and
   * output, step results, operation results, signal payloads, approval evidence and notes,
   * stream chunks, session entries, artifacts), e.g. `aesGcmCodec({ keys: { k1: key }, activeKey: 'k1' })`.
   * Every worker and client of one database needs the same keys. Default: none, stored in
   * clear. See docs/security.md.
   */
  codec?: PayloadCodec;
  /**
   * Where the engine's metrics go (docs/observability.md#metrics): an OpenTelemetry
   * MeterProvider, e.g. @opentelemetry/sdk-metrics' `new MeterProvider({ readers: [...] })`.
   * Default: the MeterProvider registered globally (`metrics.setGlobalMeterProvider`), read
   * once, here; with none registered (or @opentelemetry/api not installed) nothing is recorded.
   */
  meterProvider?: MeterProviderLike;
  /**
   * Tests only: a worker of this engine dies at these points (see core/crash-points.ts
   * and docs/testing.md), e.g. `{ step: 'charge', when: 'after-call' }`.
   */
  crashAt?: CrashPoint | CrashPoint[];
  /**
   * The OpenTelemetry TracerProvider the engine's spans go to (docs/observability.md#traces);
   * default: the one the application registered globally, if any. Needs `@opentelemetry/api`
   * installed (an optional peer dependency); runledger never registers anything itself.
   */
  tracerProvider?: TracerProviderLike;
}

const optionsSchema = z.object({
  connectionString: z.string().min(1).optional(),
  pool: z.instanceof(pg.Pool).optional(),
  schema: z.literal('runledger', { message: "schema: only 'runledger' is supported" }).optional(),
  maxPayloadBytes: z.number().int().positive().optional(),
  poolMax: z.number().int().min(2).optional(),
  queryTimeoutMs: z.number().int().min(100).optional(),
  log: z
    .custom<LogOption>((value) => typeof value === 'function' || isLogger(value), {
      message: 'log must be a function (level, message, meta) or a pino-compatible logger with info, warn and error',
    })
    .optional(),
  secrets: z.function().optional(),
  codec: z
    .custom<PayloadCodec>(
      (value) =>
        typeof value === 'object' &&
        value !== null &&
        typeof (value as PayloadCodec).encode === 'function' &&
        typeof (value as PayloadCodec).decode === 'function',
      { message: 'codec must be an object with encode(value) and decode(stored), e.g. aesGcmCodec(...)' },
    )
    .optional(),
  meterProvider: z
    .custom<MeterProviderLike>(
      (value) => typeof value === 'object' && value !== null && typeof (value as MeterProviderLike).getMeter === 'function',
      {
        message: 'meterProvider must be an OpenTelemetry MeterProvider (an object with getMeter(name))',
      },
    )
    .optional(),
  crashAt: z.union([z.object({}).passthrough(), z.array(z.object({}).passthrough())]).optional(),
  tracerProvider: z
    .custom<TracerProviderLike>(
      (value) => typeof value === 'object' && value !== null && typeof (value as TracerProviderLike).getTracer === 'function',
      { message: 'tracerProvider must be an OpenTelemetry TracerProvider (an object with getTracer(name, version))' },
    )
    .optional(),
});

const defaultLog: LogFunction = (level, message, meta) => {
  if (level === 'info') return;
  (level === 'error' ? console.error : console.warn)(`[runledger] ${message}`, meta ?? '');
};

/**
 * `DB` is the Kysely database interface of your tables (`createEngine<DB>()`): it types
 * `engine.db` and `trx` in `ctx.transaction`. Default `any`: untyped, as before. Add
 * `RunledgerDatabase` to read runledger's own tables typed too.
 */
export interface Engine<DB = any> {
  /**
   * Defines a workflow. With an `input` schema the function receives its output type
   * (`z.output`) and `start` takes its input type (`z.input`: fields with `.default()` optional).
   */
  workflow<I = unknown, O = unknown, In = I>(options: WorkflowOptions<I, In>, fn: WorkflowFunction<I, O, DB>): Workflow<I, O, In>;
  /** A workflow started on a cron schedule by the workers, once per tick. Define it before runWorker. */
  schedule<In>(options: ScheduleOptions<In>): Schedule;
  /** Creates or changes a queue's limits (enforced by admission in SQL across all workers). */
  setQueue(name: string, options: QueueOptions): Promise<QueueRecord>;
  /**
   * A limit shared by every run and worker on the calls that name `key` (`rateLimit: key` on a
   * step, operation, tool or model call): at most `max` in any window of `per`; `null` takes the
   * limit off (pauses still apply). Runs waiting on the key ask again at once.
   */
  setRateLimit(key: string, options: RateLimitOptions | null): Promise<RateLimitRecord>;
  /** No call on `key` before `until` (a Date, or a duration from now), for every run: the circuit opened by hand. */
  pauseRateLimit(key: string, until: Date | Duration, note?: string): Promise<RateLimitRecord>;
  migrate(): Promise<{ applied: string[] }>;
  /** Starts a run; `input` is the schema's input type. `handle.result()` gives the output in its stored JSON form. */
  start<I, O, In>(workflow: Workflow<I, O, In>, input: In, options?: StartOptions): Promise<RunHandle<Jsonify<O>>>;
  /**
   * Starts one run per input in one statement (runledger.start_runs): all inputs are
   * checked first and none starts unless all pass; returns the handles in input order.
   * Per-run ids, idempotency keys and concurrency keys go in `runIds`, `idempotencyKeys`
   * and `concurrencyKeys`, one entry per input.
   */
  startMany<I, O, In>(
    workflow: Workflow<I, O, In>,
    inputs: readonly In[],
    options?: StartManyOptions,
  ): Promise<Array<RunHandle<Jsonify<O>>>>;
  /**
   * Re-attaches to a run started elsewhere (another process, SQL): `result()` waits for it
   * as `start`'s handle does, woken by LISTEN, without polling. Pass the workflow to type
   * the output: `engine.handle(workflow, runId)`.
   */
  handle<O>(workflow: Workflow<any, O, any>, runId: string): RunHandle<Jsonify<O>>;
  handle(runId: string): RunHandle<unknown>;
  getRun(runId: string): Promise<RunRecord | undefined>;
  listRuns(options?: ListRunsOptions): Promise<RunRecord[]>;
  retry(runId: string): Promise<RunStatus>;
  /** Cancels a run: PENDING/WAITING at once, RUNNING through its worker; returns the run's new status (a finished run is left as it is). */
  cancel(runId: string, options?: { reason?: string }): Promise<RunStatus>;
  /**
   * Undoes a finished run's effects: the compensations of a FAILED, CANCELLED, TERMINATED
   * or DEAD_LETTER run that are not DONE run (a FAILED one again) on a worker serving its
   * version, and the run keeps its status. Returns CANCELLING while they run, or the run's
   * status when none is left.
   */
  compensate(runId: string, options?: { reason?: string }): Promise<RunStatus>;
  /**
   * A new run reusing the source run's checkpoints before step `fromStep` (0 = start over); returns its handle.
   * Pass the source run's `workflow` to type `result()` from it (it is checked against the run's workflow
   * name, CONFIG when it differs), or name the output type: `fork<Output>(runId, ...)`; else `unknown`.
   * The fork keeps the source's ctx.lineageId. Operations it runs again whose key holds the source's run
   * id (made from ctx.runId: a second effect) are logged as a warning, as fork_run's NOTICE lists them.
   * INVALID_STATE when it would copy the checkpoint of an operation a compensation undid.
   */
  fork<O = unknown>(
    runId: string,
    options: { fromStep: number; workflow?: Workflow<any, O, any>; version?: string },
  ): Promise<RunHandle<Jsonify<O>>>;
  /**
   * Moves a PENDING, WAITING or DEAD_LETTER run to another version of its workflow: a live
   * worker of that version with a migration from the run's version applies it (the
   * workflow's `migrations`). Waits for that worker by default; MIGRATION_FAILED when its
   * migrate failed (the run is left as it was).
   */
  migrateRun(runId: string, toVersion: string, options?: MigrateRunOptions): Promise<MigrationOutcome>;
  /**
   * migrateRun for up to `limit` runs of workflow@fromVersion, oldest first (a canary), or all; returns the run ids
   * marked, and the runs of the selection it left on their version with why (locked by another transaction at
   * that moment: call again; compensated: fork them instead).
   */
  migrateRuns(selection: { workflow: string; fromVersion: string; toVersion: string; limit?: number }): Promise<MigrateRunsResult>;
  /** Settles an UNKNOWN operation (an operator's decision) and wakes the run waiting on it. */
  resolveOperation(
    operationId: string,
    resolution: { status: 'SUCCEEDED' | 'FAILED'; result?: unknown; resolvedBy?: string },
  ): Promise<'SUCCEEDED' | 'FAILED'>;
  /** Delivers a signal; true if newly accepted, false if this signalId was accepted before. */
  signal(runId: string, topic: string, payload?: unknown, options?: { signalId?: string }): Promise<boolean>;
  /** Decides an approval request; the first decision wins (later calls return it with recorded: false). */
  decideApproval(requestId: string, decision: DecisionInput): Promise<DecisionRecord>;
  /**
   * A run's durable stream on `topic` (ctx.stream(topic)), live: each chunk from `fromOffset`
   * exactly once and in order, across worker crashes and lost connections; it ends once the
   * stream is closed or the run has ended (docs/streams.md).
   */
  readStream<T = unknown>(runId: string, topic: string, options?: ReadStreamOptions): AsyncIterable<StreamChunk<T>>;
  runWorker(options?: WorkerOptions): Promise<Worker>;
  /** An artifact's record and content (null when it was recorded by reference); undefined for an unknown id. */
  readArtifact(artifactId: string): Promise<ArtifactContentRead | undefined>;
  /** Stops this engine's workers and closes its pool (not a pool you passed in). */
  close(): Promise<void>;
  /** The Kysely instance over the engine's pool, typed by `DB`, for your tables (and runledger's, with `RunledgerDatabase`). */
  readonly db: Kysely<DB>;
  readonly pool: pg.Pool;
}

/** One host: node-postgres reads the string. Several (or target_session_attrs): a client class that picks the host (db/multi-host.ts). */
function connectionConfig(connectionString: string): pg.PoolConfig {
  const target = parseMultiHost(connectionString);
  if (!target) return { connectionString };
  return { ...target.config, Client: multiHostClient(target) as unknown as pg.PoolConfig['Client'] };
}

export function createEngine<DB = any>(options: EngineOptions = {}): Engine<DB> {
  const parsed = optionsSchema.safeParse(options);
  if (!parsed.success)
    throw new ConfigError(`createEngine: ${parsed.error.issues.map((i) => `${i.path.join('.')}: ${i.message}`).join('; ')}`);
  const logs = engineLog(options.log ?? defaultLog);
  const log: LogFunction = logs.log;
  const connectionString = options.connectionString ?? (options.pool ? undefined : process.env.DATABASE_URL);
  if (!options.pool && !connectionString) {
    throw new ConfigError('createEngine: pass connectionString or pool, or set DATABASE_URL');
  }
  const crashPoints = new CrashPoints(validateCrashPoints(options.crashAt));
  const ownsPool = !options.pool;
  const poolConfig: pg.PoolConfig = options.pool
    ? { ...(options.pool as unknown as { options: pg.PoolConfig }).options }
    : {
        ...connectionConfig(connectionString!),
        max: options.poolMax ?? POOL_MAX_DEFAULT,
        ...connectionTimeouts(options.queryTimeoutMs ?? QUERY_TIMEOUT_MS_DEFAULT),
      };
  const pool = options.pool ?? new pg.Pool(poolConfig);
  guardPool(pool, 'pool', log);
  const db = new Kysely<RunledgerDatabase>({ dialect: new PostgresDialect({ pool }) });

  const workflows = new Map<string, Workflow<any, any>>();
  const registered = new Map<string, Promise<void>>();
  const workers = new Set<LocalWorker>();
  const schedules = new Map<string, Schedule>();

  const registerWorkflow = (workflow: Workflow<any, any>): Promise<void> => {
    const key = workflowKey(workflow.name, workflow.version);
    let done = registered.get(key);
    if (!done) {
      done = pool
        .query(
          'select runledger._register_workflow(p_name => $1, p_version => $2, p_queue => $3, p_max_recovery_attempts => $4, p_limits => $5::jsonb, p_manifest => $6::jsonb)',
          [
            workflow.name,
            workflow.version,
            workflow.queue,
            workflow.maxRecoveryAttempts,
            JSON.stringify(limitsToSql(workflow.limits, `workflow ${workflow.name}`)),
            JSON.stringify(workflow.versionManifest),
          ],
        )
        .then(() => undefined);
      done.catch(() => registered.delete(key)); // a failed registration is tried again next time
      registered.set(key, done);
    }
    return done;
  };
  const resultSchemas = new Map<string, z.ZodType<unknown>>();
  const payloads = options.codec ? new Payloads(options.codec) : NO_CODEC;
  const deps: EngineDeps = {
    pool,
    db,
    maxPayloadBytes: options.maxPayloadBytes ?? MAX_PAYLOAD_BYTES_DEFAULT,
    log,
    logFor: logs.forRun,
    ...(options.secrets ? { secrets: options.secrets } : {}),
    registerWorkflow,
    resultSchemas,
    payloads,
  };
  const tracing = Tracing.create(options.tracerProvider);
  if (tracing) deps.tracing = tracing;
  const metrics = createMetrics(options.meterProvider, RUNTIME_VERSION);
  if (metrics) deps.metrics = metrics;
  const fetchRun = (runId: string, opts?: { withSteps?: boolean }) => getRun(db, runId, opts, payloads);
  // Callers awaiting results hear of completions by LISTEN, or from this engine's workers directly.
  const results = new ResultWatch(poolConfig, log);
  deps.finished = (runId) => results.wake(runId);
  const takeLocally = (workflow: Workflow<any, any>, queue: string, runId: string): LocalTaker | undefined => {
    const key = workflowKey(workflow.name, workflow.version);
    for (const worker of workers) {
      if (!worker.takeLocal(key, queue, runId)) continue;
      return {
        workerId: worker.workerId,
        leaseMs: worker.leaseMs,
        // A run claimed at its start has no checkpoints and no step progress yet.
        execute: (run) => worker.executeClaimed({ ...run, cancel_requested: false, checkpoints: [], progress: null }),
        wake: () => worker.wake(runId),
      };
    }
    return undefined;
  };
  const starts = new StartBatcher(pool);
  const startHost: StartHost = {
    deps,
    registerWorkflow,
    getRun: fetchRun,
    results,
    takeLocally,
    startBatched: (start) => starts.submit(start),
  };
  // Durable streams: readers hear of new chunks by LISTEN (one connection, opened by the first reader).
  const streams = new StreamWatch(poolConfig, log);

  return {
    db: db as unknown as Kysely<DB>,
    pool,
    workflow(workflowOptions, fn) {
      const workflow = defineWorkflow(workflowOptions, fn);
      const key = workflowKey(workflow.name, workflow.version);
      if (workflows.has(key)) throw new ConfigError(`workflow ${key} is already defined on this engine`);
      workflows.set(key, workflow);
      if (workers.size > 0) {
        // A worker serves the workflows defined when it started: its claims and runledger.workers say so.
        log(
          'warn',
          `workflow ${key} was defined after runWorker: the running workers of this engine (${workers.size}) do not serve it; ` +
            'define workflows before runWorker, or start a new worker to serve it',
          { workflow: key },
        );
      }
      return workflow;
    },
    schedule(scheduleOptions) {
      const schedule = defineSchedule(scheduleOptions);
      if (schedules.has(schedule.name)) throw new ConfigError(`schedule ${schedule.name} is already defined on this engine`);
      schedules.set(schedule.name, schedule);
      return schedule;
    },
    setQueue: (name, queueOptions) => setQueue(pool, name, queueOptions),
    setRateLimit: (key, limit) => setRateLimit(pool, key, limit),
    pauseRateLimit: (key, until, note) => pauseRateLimit(pool, key, until, note),
    migrate: () => migrate(pool, (message) => log('info', message)),
    start: (workflow, input, startOptions) => startRun(startHost, workflow, input, startOptions),
    handle: (workflowOrRunId: Workflow<any, any, any> | string, maybeRunId?: string) => {
      const runId = typeof workflowOrRunId === 'string' ? workflowOrRunId : maybeRunId;
      if (typeof runId !== 'string' || runId === '')
        throw new ConfigError('handle: a run id is required: engine.handle(runId) or engine.handle(workflow, runId)');
      return handleFor(startHost, runId);
    },
    startMany: (workflow, inputs, startOptions) => startMany(startHost, workflow, inputs, startOptions),
    getRun: (runId) => fetchRun(runId),
    migrateRun: (runId, toVersion, migrateOptions) => migrateRun(pool, runId, toVersion, migrateOptions),
    migrateRuns: (selection) => migrateRuns(pool, selection),
    listRuns: (listOptions) => listRuns(db, listOptions, payloads),
    retry: (runId) => retryRun(pool, runId),
    fork: async (runId, forkOptions) => {
      if (forkOptions.workflow !== undefined) {
        const source = await db.selectFrom('runledger.runs').select('workflow_name').where('run_id', '=', runId).executeTakeFirst();
        if (source && source.workflow_name !== forkOptions.workflow.name) {
          throw new ConfigError(`fork: run ${runId} is a run of workflow ${source.workflow_name}, not ${forkOptions.workflow.name}`);
        }
      }
      const forked = await forkRun(pool, runId, forkOptions.fromStep, forkOptions.version);
      // The operations it runs again with a key made from the source's run id pay twice: said in the log.
      const warning = forkKeyWarningText(forked, runId, await forkKeyWarnings(pool, runId, forkOptions.fromStep));
      if (warning) log('warn', `fork: ${warning}`, { runId: forked, forkedFrom: runId });
      return handleFor(startHost, forked);
    },
    async resolveOperation(operationId, resolution) {
      // A result schema this engine's runs used for the operation checks the result before
      // it is written (the run's replay checks it again: a resolution from psql meets only that).
      if (resolution.status === 'SUCCEEDED' && resultSchemas.size > 0) {
        const operation = await db
          .selectFrom('runledger.operations as o')
          .innerJoin('runledger.runs as r', 'r.run_id', 'o.run_id')
          .select(['o.name', 'r.workflow_name', 'r.workflow_version'])
          .where('o.operation_id', '=', operationId)
          .executeTakeFirst();
        const schema =
          operation && resultSchemas.get(resultSchemaKey(workflowKey(operation.workflow_name, operation.workflow_version), operation.name));
        if (operation && schema) checkResolvedResult(operation.name, operationId, schema, resolution.result ?? null);
      }
      return resolveOperation(pool, operationId, resolution, payloads);
    },
    cancel: (runId, cancelOptions) => cancelRun(pool, runId, cancelOptions?.reason),
    compensate: (runId, compensateOptions) => compensateRun(pool, runId, compensateOptions?.reason),
    signal: (runId, topic, payload, signalOptions) => sendSignal(pool, runId, topic, payload, signalOptions?.signalId, payloads),
    decideApproval: (requestId, decision) => decideApproval(pool, requestId, decision, payloads),
    readArtifact: (artifactId) => readArtifact(pool, artifactId, payloads),
    readStream: (runId, topic, readOptions) => readStream(pool, streams, runId, topic, readOptions, payloads),
    async runWorker(workerOptions) {
      const startScheduled: StartScheduled = async (workflow, input, idempotencyKey) => {
        await startRun(startHost, workflow, input, { idempotencyKey });
      };
      const worker = await startWorker(
        {
          deps,
          crashPoints,
          poolConfig,
          workflows: [...workflows.values()],
          registerWorkflow,
          schedules: [...schedules.values()],
          startScheduled,
        },
        workerOptions,
      );
      workers.add(worker);
      return {
        workerId: worker.workerId,
        get inFlight() {
          return worker.inFlight;
        },
        get crashed() {
          return worker.crashed;
        },
        runOnce: () => worker.runOnce(),
        drain: (drainOptions) => worker.drain(drainOptions),
        stop: async () => {
          await worker.stop();
          workers.delete(worker);
        },
        forceStop: (timeoutMs) => worker.forceStop(timeoutMs),
      };
    },
    async close() {
      await Promise.all([...workers].map((worker) => worker.stop()));
      workers.clear();
      await results.close();
      await streams.close();
      if (ownsPool) await pool.end();
    },
  };
}
