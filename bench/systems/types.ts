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
}

export interface Producer {
  enqueue(unit: number): Promise<void>;
  close(): Promise<void>;
}

export interface RunningWorker {
  stop(): Promise<void>;
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
}

export const BUSINESS_TABLE_SQL =
  'create table if not exists bench_business (id bigserial primary key, unit int not null, at timestamptz not null default now())';

export const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/** The body of a non-transaction step, identical for every system. */
export async function stepBody(spec: StepSpec, unit: number, index: number, hooks: Hooks): Promise<void> {
  await hooks.beforeStep?.(unit, index);
  if (spec.kind === 'sleep') await sleep(spec.ms);
}
