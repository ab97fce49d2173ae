/** What a workload asks of a system; one adapter per system implements it. */

export type StepSpec = { name: string; kind: 'noop' } | { name: string; kind: 'sleep'; ms: number } | { name: string; kind: 'tx' };

/** The same work for every system: a run ("unit") is a sequence of checkpointed steps. */
export interface Plan {
  name: string;
  steps: StepSpec[];
}

export interface Hooks {
  /** Runs inside a step's body before its work (a replayed, already checkpointed step does not run it). */
  beforeStep?(unit: number, step: number): void | Promise<void>;
  /** The last step's body has returned (the system may still be recording completion). */
  afterLastStep?(unit: number): void;
}

export interface WorkerSettings {
  concurrency: number;
  poolMax: number;
  /** runledger only: the worker's lease; other systems have their own fixed mechanisms. */
  leaseMs?: number;
  hooks: Hooks;
  /**
   * History workloads: the worker must support pause() and resume() on the SAME
   * database sessions (an own pool that never closes idle connections), so that the
   * plans its sessions cached on an empty table are the ones the measured drain uses.
   */
  pausable?: boolean;
}

export interface Producer {
  enqueue(unit: number): Promise<void>;
  close(): Promise<void>;
}

export interface RunningWorker {
  stop(): Promise<void>;
  /** Stops claiming (nothing must be in flight), keeping the worker's database sessions open. Only with `pausable`. */
  pause?(): Promise<void>;
  /** Claims again, on the sessions kept by pause(). */
  resume?(): Promise<void>;
}

/** A caller that starts a workflow and awaits its result, with a worker in the same process (closedloop). */
export interface ClosedLoop {
  call(unit: number): Promise<void>;
  stop(): Promise<void>;
}

/** Enqueue paths of one system for bulk_enqueue; each returns how many jobs it enqueued. */
export interface BulkPaths {
  /** The client library's batch call (runledger startMany, graphile-worker addJobs, pg-boss insert). */
  api?: (inputs: number[]) => Promise<number>;
  /** A batch from SQL, one statement per batch (runledger start_runs, graphile_worker.add_jobs). */
  sqlBatch?: (inputs: number[]) => Promise<number>;
  /** One SQL statement calling the single-job function once per row over generate_series (runledger start_run, graphile_worker.add_job). */
  sqlSeries?: (count: number) => Promise<number>;
  /** Set when a path the workload asks for is missing from this build (e.g. startMany not merged yet). */
  missing?: string[];
  /** After the timed part: checks that ids came back in input order (first batch of each path); returns problems. */
  verify?(): Promise<string[]>;
  close(): Promise<void>;
}

export interface System {
  /** Column id, e.g. 'graphile-worker-batched'. */
  readonly id: string;
  readonly label: string;
  /** How this system (variant) is configured, for the report. */
  readonly settings: string;
  /** Has a transaction step that commits business writes with its checkpoint. */
  readonly supportsTx: boolean;
  /** Installs the system's schema and queue in a fresh database. */
  setup(url: string, plan: Plan): Promise<void>;
  producer(url: string, plan: Plan, poolMax: number): Promise<Producer>;
  worker(url: string, plan: Plan, settings: WorkerSettings): Promise<RunningWorker>;
  /** SQL returning one number: units not yet durably complete (all units must have been enqueued). */
  pendingSql(plan: Plan): string;
  /** closedloop: start + await the result in-process; absent when the system has no result API. */
  closedLoop?(url: string, plan: Plan, settings: WorkerSettings): Promise<ClosedLoop>;
  /** bulk_enqueue: absent when the system has no batch enqueue. */
  bulk?(url: string, plan: Plan, poolMax: number): Promise<BulkPaths>;
}

export const BUSINESS_TABLE_SQL =
  'create table if not exists bench_business (id bigserial primary key, unit int not null, at timestamptz not null default now())';

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The body of a non-transaction step, identical for every system. */
export async function stepBody(spec: StepSpec, unit: number, index: number, hooks: Hooks): Promise<void> {
  await hooks.beforeStep?.(unit, index);
  if (spec.kind === 'sleep') await sleep(spec.ms);
}
