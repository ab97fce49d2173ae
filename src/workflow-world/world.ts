/**
 * createWorld(): the Workflow SDK's World on runledger. Storage is the SDK's event log and its
 * entities in runledger's wf_* tables (events.ts, reads.ts), the queue is runledger runs of the
 * workflow 'workflow-world' (queue.ts), streams are rows with NOTIFY (streamer.ts). start()
 * (which the SDK calls in the app's process) migrates the schema and runs a runledger worker
 * for the deliveries; a process that only starts workflows needs no start().
 */
import type { World } from '@workflow/world';
import { ConfigError, createEngine, type Engine, type Worker } from '../index.js';
import { createEventWriter } from './events.js';
import { DELIVERY_WORKFLOW, createEnqueue, createQueueHandler, defineDelivery, type QueueConfig } from './queue.js';
import { createEventReads, createHookReads, createRunReads, createStepReads } from './reads.js';
import { WORLD_SPEC_VERSION } from './spec.js';
import { createStreamer } from './streamer.js';

export interface RunledgerWorldOptions {
  /** PostgreSQL URL; default WORKFLOW_RUNLEDGER_URL, then DATABASE_URL. */
  connectionString?: string;
  /** A runledger engine to use instead of one made here (its pool serves the World). */
  engine?: Engine;
  /** The runledger queue the SDK's messages run on (runledger.set_queue sets its limits); default WORKFLOW_RUNLEDGER_QUEUE or 'workflow-world'. */
  queue?: string;
  /** Deliveries run at once by this process's worker; default WORKFLOW_RUNLEDGER_CONCURRENCY or 20. */
  concurrency?: number;
  /** The app's URL, where /.well-known/workflow/v1/flow listens; default WORKFLOW_RUNLEDGER_BASE_URL, then http://localhost:$PORT. */
  baseUrl?: string;
  /** Attempts of one delivery before its runledger run fails; default 20 (backoff 1 s doubling to 60 s: about 15 minutes). */
  deliveryAttempts?: number;
  /** How long a silent worker keeps a delivery before another takes it over (runWorker's leaseMs); default the engine's. */
  leaseMs?: number;
  /** Apply runledger's migrations on first use; default true (false when a DBA migrates). */
  migrate?: boolean;
  /** The deployment id the SDK records on runs; default 'runledger'. */
  deploymentId?: string;
}

export interface RunledgerWorld extends World {
  /** The runledger engine under the World (its runs, queues and operator actions). */
  readonly engine: Engine;
  start(): Promise<void>;
  close(): Promise<void>;
}

function positiveInteger(value: unknown, what: string): number {
  const parsed = typeof value === 'string' ? Number(value) : value;
  if (typeof parsed !== 'number' || !Number.isInteger(parsed) || parsed < 1)
    throw new ConfigError(`runledger/workflow-world: ${what} must be a whole number >= 1, got ${String(value)}`);
  return parsed;
}

export function createWorld(options: RunledgerWorldOptions = {}): RunledgerWorld {
  const env = process.env;
  const connectionString = options.connectionString ?? env.WORKFLOW_RUNLEDGER_URL ?? env.DATABASE_URL;
  if (!options.engine && !connectionString)
    throw new ConfigError(
      'runledger/workflow-world: no database: set WORKFLOW_RUNLEDGER_URL or DATABASE_URL, or pass createWorld({ connectionString })',
    );
  const engine = options.engine ?? createEngine({ connectionString });
  const ownEngine = !options.engine;
  const queueName = options.queue ?? env.WORKFLOW_RUNLEDGER_QUEUE ?? DELIVERY_WORKFLOW;
  const concurrency = positiveInteger(options.concurrency ?? env.WORKFLOW_RUNLEDGER_CONCURRENCY ?? 20, 'concurrency');
  const config: QueueConfig = {
    queue: queueName,
    baseUrl: () =>
      options.baseUrl ??
      env.WORKFLOW_RUNLEDGER_BASE_URL ??
      env.WORKFLOW_LOCAL_BASE_URL ??
      (env.PORT ? `http://localhost:${env.PORT}` : undefined),
    deliveryAttempts: positiveInteger(options.deliveryAttempts ?? 20, 'deliveryAttempts'),
  };
  const delivery = defineDelivery(engine, config);
  const pool = engine.pool;

  // Migrations, then the delivery workflow's registration (start_run refuses an unknown workflow), once.
  let readying: Promise<void> | undefined;
  const ready = (): Promise<void> => {
    readying ??= (async () => {
      if (options.migrate !== false) await engine.migrate();
      await pool.query(`select runledger._register_workflow(p_name => $1, p_version => $2, p_queue => $3, p_max_recovery_attempts => $4)`, [
        delivery.name,
        delivery.version,
        delivery.queue,
        delivery.maxRecoveryAttempts,
      ]);
    })().catch((error: unknown) => {
      readying = undefined;
      throw error;
    });
    return readying;
  };

  const streamer = createStreamer(pool);
  const writeEvent = createEventWriter(pool);
  const eventReads = createEventReads(pool);
  const withReady =
    <A extends unknown[], R>(fn: (...args: A) => Promise<R>) =>
    async (...args: A): Promise<R> => {
      await ready();
      return fn(...args);
    };
  let worker: Worker | undefined;
  let starting: Promise<void> | undefined;

  const world = {
    specVersion: WORLD_SPEC_VERSION,
    engine,
    getDeploymentId: async () => options.deploymentId ?? 'runledger',
    queue: createEnqueue(pool, config, ready),
    createQueueHandler,
    runs: createRunReads(pool),
    steps: createStepReads(pool),
    hooks: createHookReads(pool),
    events: { ...eventReads, create: withReady(writeEvent) } as World['events'],
    streams: streamer.streams,
    async start() {
      starting ??= (async () => {
        await ready();
        worker = await engine.runWorker({ queues: [queueName], concurrency, ...(options.leaseMs ? { leaseMs: options.leaseMs } : {}) });
      })();
      await starting;
    },
    async close() {
      await worker?.stop();
      worker = undefined;
      starting = undefined;
      await streamer.close();
      if (ownEngine) await engine.close();
    },
  };
  return world as unknown as RunledgerWorld;
}
