import { newId } from '../core/ids.js';
import { ConfigError, InvalidInputError, PayloadTooLargeError, RunFailedError, fromPgError } from '../core/errors.js';
import { toInstant, toMs, type Duration } from '../core/duration.js';
import type pg from 'pg';
import { inputJsonText, toJsonText } from '../core/json.js';
import type { RunRecord } from './runs.js';
import type { Jsonify } from '../core/jsonify.js';
import { TERMINAL_STATES } from '../core/states.js';
import { limitsToSql, type Workflow } from '../core/workflow.js';
import type { BudgetAmounts } from '../core/budget.js';
import { withinMs, type ResultWatch } from './results.js';
import type { Payloads } from '../core/payloads.js';
import { activeTraceparent, isTraceparent } from '../observe/tracing.js';
import type { EngineMetrics } from '../observe/metrics.js';
import type { BatchedStart, StartedRow } from './start-batch.js';

export interface StartOptions {
  /** Explicit run id; starting again with the same id returns the same run. */
  runId?: string;
  /** Starting again with the same key (per workflow) returns the same run. */
  idempotencyKey?: string;
  queue?: string;
  priority?: number;
  concurrencyKey?: string;
  /**
   * The tenant the run belongs to (docs/security.md, tenant isolation); default: the
   * session's `runledger.tenant` setting, if any. A child run always takes its parent's.
   */
  tenantId?: string;
  /** Wall-clock lifetime ('2d', ms) or an absolute Date; overrides the workflow's limit. */
  deadline?: Duration | Date;
  /**
   * Start no earlier than this: after this long ('10m', ms), counted on the database's
   * clock from the start (SQL run_in_ms), or at a Date, a wall-clock instant compared with
   * the database's clock (runledger.now()), not this process's.
   */
  runAt?: Date | Duration;
  /** Override the workflow's limits for this run. */
  maxSteps?: number;
  budget?: number | BudgetAmounts;
  noProgress?: number;
  /**
   * The W3C traceparent the run's executions are traced under (docs/observability.md#traces);
   * default: the caller's active span (OpenTelemetry context), if any. null: none.
   */
  traceparent?: string | null;
  /**
   * Starts with the same `key` (per workflow and tenant) closer together than `delay` collapse
   * into one run: it starts `delay` after the last of them, with the last input, and each
   * start returns its id (docs/queues.md#debounce). With `maxWait` (at least `delay`), it
   * starts no later than that after the first start of the burst, so that starts that never
   * pause for `delay` still get their run. Not with runId, idempotencyKey or runAt.
   */
  debounce?: { key: string; delay: Duration; maxWait?: Duration };
}

/** `O` is the output as stored: `engine.start` gives `RunHandle<Jsonify<O>>` for a workflow returning `O`. */
export interface RunHandle<O> {
  readonly runId: string;
  /** Resolves with the output (its JSON form) when the run succeeds; rejects with RunFailedError when it ends any other way. */
  result(options?: { timeoutMs?: number }): Promise<O>;
}

export interface StartHost {
  deps: { pool: pg.Pool; maxPayloadBytes: number; payloads?: Payloads; metrics?: EngineMetrics };
  registerWorkflow: (workflow: Workflow<any, any>) => Promise<void>;
  getRun: (runId: string, options?: { withSteps?: boolean }) => Promise<RunRecord | undefined>;
  /** How a caller hears that a run ended (LISTEN, or its own worker); without it, result() reads the row on a backoff. */
  results?: ResultWatch;
  /**
   * A worker of this engine that takes a run of this workflow on this queue now, if one has
   * a free slot: the start then claims the run for it in the same transaction.
   */
  takeLocally?: (workflow: Workflow<any, any>, queue: string, runId: string) => LocalTaker | undefined;
  /** Starts a run (claimed for a local taker when given one), together with the starts made meanwhile (StartBatcher). */
  startBatched: (start: BatchedStart) => Promise<StartedRow>;
}

/** A run claimed for this process's worker in its start's transaction (runledger._start_claimed). */
export interface ClaimedAtStart {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  input: unknown;
  /** A bigint, as text. */
  fencing_token: string;
  recovery_attempts: number;
  max_steps: number | null;
  budget: string | null;
  budget_spent: string;
  budget_limits: Record<string, unknown> | null;
  budget_used: Record<string, unknown> | null;
  /** The run's traceparent (runs.traceparent) and its previous execution's span (_claim_batch; none at a start). */
  traceparent?: string | null;
  execution_traceparent?: string | null;
  /** The run a chain of forks started from (runs.lineage_id; _claim_batch): null or absent for a run never forked. */
  lineage_id?: string | null;
}

/** How the run a start handed to this process's worker ended there: committed SUCCEEDED, with this output (JSON text; undefined for none). */
export interface LocalSuccess {
  outputText: string | undefined;
}

/** The worker a start hands its run to. */
export interface LocalTaker {
  workerId: string;
  leaseMs: number;
  /**
   * Executes the run claimed for this worker; resolves when that execution ends, with its
   * output if it completed the run, else undefined (the run waits, was released, went
   * to another worker, or ended otherwise: its row says how).
   */
  execute(run: ClaimedAtStart): Promise<LocalSuccess | undefined>;
  /** The run was not claimed here (an existing run, say): the worker claims as usual, at once. */
  wake(): void;
}

export async function startRun<O, In>(
  host: StartHost,
  workflow: Workflow<any, O, In>,
  input: In,
  options: StartOptions = {},
): Promise<RunHandle<Jsonify<O>>> {
  checkOptionNames(options, START_OPTIONS, 'start');
  const inputText = checkedInput(host, workflow, input, `input for workflow ${workflow.name}`);
  await host.registerWorkflow(workflow);
  const sqlOptions = startOptionsToSql(workflow, options, 'start');
  if (options.debounce !== undefined) return startDebounced(host, workflow, inputText, sqlOptions, options);
  const runIdAsked = options.runId ?? newId();
  sqlOptions.run_id = runIdAsked;
  if (options.idempotencyKey !== undefined) sqlOptions.idempotency_key = options.idempotencyKey;
  if (options.concurrencyKey !== undefined) sqlOptions.concurrency_key = options.concurrencyKey;
  // A run this process's own worker takes is claimed for it in the start's transaction: no
  // NOTIFY (every notifying commit waits for one lock per database, and callers starting
  // runs queued on it behind the worker's commits) and no claim round trip before its first
  // step. A delayed run is announced as always (its notification carries the delay).
  const local = options.runAt === undefined ? host.takeLocally?.(workflow, options.queue ?? workflow.queue, runIdAsked) : undefined;
  let runId: string;
  let ranHere: LocalExecution | undefined;
  try {
    // Starts made together share a statement and a commit (start-batch.ts).
    const row = await host.startBatched({
      runId: runIdAsked,
      workflow: workflow.name,
      inputText,
      optionsText: inputJsonText(sqlOptions, 'engine.start options')!,
      ...(local ? { claimFor: { workerId: local.workerId, leaseMs: local.leaseMs } } : {}),
    });
    runId = row.run_id;
    if (local && row.claimed)
      ranHere = {
        done: local.execute({ ...(row as unknown as ClaimedAtStart), fencing_token: String(row.fencing_token) }),
        leaseMs: local.leaseMs,
      };
    else local?.wake();
    // A start that found its idempotency key's run returns that run: not a new one.
    if (runId === runIdAsked) host.deps.metrics?.runsStarted(workflow.name, workflow.version, 1);
  } catch (error) {
    // Whether the start committed is unknown: the worker claims as usual (and finds the run if it did).
    local?.wake();
    throw fromPgError(error);
  }
  return handleFor<Jsonify<O>>(host, runId, ranHere);
}

/** A debounced start: start_run on its own (no batch, no local claim: the run starts later, and maybe as another start's run). */
async function startDebounced<O>(
  host: StartHost,
  workflow: Workflow<any, O, any>,
  inputText: string | undefined,
  sqlOptions: Record<string, unknown>,
  options: StartOptions,
): Promise<RunHandle<Jsonify<O>>> {
  const debounce = options.debounce!;
  if (
    typeof debounce !== 'object' ||
    debounce === null ||
    typeof debounce.key !== 'string' ||
    debounce.key === '' ||
    debounce.key.length > 200
  )
    throw new InvalidInputError(`start: debounce must be { key, delay } with a key of 1 to 200 characters`);
  for (const excluded of ['runId', 'idempotencyKey', 'runAt'] as const) {
    if (options[excluded] !== undefined)
      throw new InvalidInputError(`start: debounce decides the run's id and start time: it does not go with ${excluded}`);
  }
  const delayMs = Math.round(asInvalidInput(() => toMs(debounce.delay, 'start: debounce.delay')));
  const maxWaitMs =
    debounce.maxWait === undefined ? undefined : Math.round(asInvalidInput(() => toMs(debounce.maxWait!, 'start: debounce.maxWait')));
  if (maxWaitMs !== undefined && maxWaitMs < delayMs)
    throw new InvalidInputError(`start: debounce.maxWait (${maxWaitMs} ms) must be at least debounce.delay (${delayMs} ms)`);
  sqlOptions.debounce = { key: debounce.key, delay_ms: delayMs, ...(maxWaitMs === undefined ? {} : { max_wait_ms: maxWaitMs }) };
  if (options.concurrencyKey !== undefined) sqlOptions.concurrency_key = options.concurrencyKey;
  try {
    const result = await host.deps.pool.query(
      'select runledger.start_run(p_workflow => $1, p_input => $2::jsonb, p_options => $3::jsonb) as run_id',
      [workflow.name, inputText ?? null, inputJsonText(sqlOptions, 'engine.start options')],
    );
    return handleFor<Jsonify<O>>(host, result.rows[0].run_id as string, undefined);
  } catch (error) {
    throw fromPgError(error);
  }
}

/** Options of engine.startMany: those of start for every run, and the per-run ones as arrays in input order. */
export interface StartManyOptions extends Omit<StartOptions, 'runId' | 'idempotencyKey' | 'concurrencyKey' | 'debounce'> {
  /** One per input (undefined: a new ULID). */
  runIds?: Array<string | undefined>;
  /** One per input (undefined: none). An input whose key already has a run gets that run's handle. */
  idempotencyKeys?: Array<string | undefined>;
  /** One per input (undefined: none). */
  concurrencyKeys?: Array<string | undefined>;
}

/**
 * Many runs of one workflow in one statement (runledger.start_runs): every input is
 * checked first (schema, JSON, size; the error names its index) and nothing is started
 * unless all pass; the runs are inserted together and their queue announced once.
 * Returns the handles in input order.
 */
export async function startMany<O, In>(
  host: StartHost,
  workflow: Workflow<any, O, In>,
  inputs: readonly In[],
  options: StartManyOptions = {},
): Promise<Array<RunHandle<Jsonify<O>>>> {
  if (!Array.isArray(inputs)) throw new InvalidInputError(`startMany: inputs must be an array (one input per run), not ${typeof inputs}`);
  checkOptionNames(options, START_MANY_OPTIONS, 'startMany');
  const texts = inputs.map((input, i) => checkedInput(host, workflow, input, `input ${i} for workflow ${workflow.name}`));
  const sqlOptions = startOptionsToSql(workflow, options, 'startMany');
  const perRun = { runIds: 'run_ids', idempotencyKeys: 'idempotency_keys', concurrencyKeys: 'concurrency_keys' } as const;
  for (const [field, key] of Object.entries(perRun) as Array<[keyof typeof perRun, string]>) {
    const values = options[field];
    if (values === undefined) continue;
    if (!Array.isArray(values) || values.length !== inputs.length) {
      throw new InvalidInputError(`startMany: ${field} must be an array of ${inputs.length} entries, one per input (undefined for none)`);
    }
    sqlOptions[key] = values.map((v) => v ?? null);
  }
  // With idempotency keys, ids made here tell the runs this call created from those it found.
  // Without keys or ids every run is new: the database makes the ids, and inserts without
  // looking each row up first (start_runs' plain path).
  const idempotent = options.runIds !== undefined || options.idempotencyKeys !== undefined;
  if (idempotent) sqlOptions.run_ids = inputs.map((_, i) => options.runIds?.[i] ?? newId());
  if (inputs.length === 0) return [];
  await host.registerWorkflow(workflow);
  let runIds: string[];
  try {
    const result = await host.deps.pool.query(
      'select runledger.start_runs(p_workflow => $1, p_inputs => $2::jsonb, p_options => $3::jsonb) as run_ids',
      [workflow.name, `[${texts.map((t) => t ?? 'null').join(',')}]`, inputJsonText(sqlOptions, 'engine.startMany options')],
    );
    runIds = result.rows[0].run_ids;
  } catch (error) {
    throw fromPgError(error);
  }
  const asked = sqlOptions.run_ids as string[] | undefined;
  const created = asked ? runIds.filter((runId, i) => runId === asked[i]).length : runIds.length;
  if (created > 0) host.deps.metrics?.runsStarted(workflow.name, workflow.version, created);
  return runIds.map((runId) => handleFor<Jsonify<O>>(host, runId));
}

/**
 * The execution of this process's worker that a start handed the run to (engine.start): what
 * it answers when it completes the run (undefined when it ended otherwise), and its lease.
 */
export interface LocalExecution {
  done: Promise<LocalSuccess | undefined>;
  leaseMs: number;
}

export function handleFor<O>(host: StartHost, runId: string, ranHere?: LocalExecution): RunHandle<O> {
  return { runId, result: (opts) => awaitResult<O>(host, runId, opts?.timeoutMs, ranHere) };
}

/**
 * The input as stored (the schema's output, through the engine's codec when it has one),
 * as JSON text, within the size limit (of the clear JSON and of what is stored); coded errors otherwise.
 */
function checkedInput<In>(host: StartHost, workflow: Workflow<any, any, In>, input: In, what: string): string | undefined {
  let stored: unknown = input;
  if (workflow.inputSchema) {
    const parsed = workflow.inputSchema.safeParse(input);
    if (!parsed.success) {
      throw new InvalidInputError(`${what} is invalid: ${parsed.error.message}`, { details: { issues: parsed.error.issues } });
    }
    stored = parsed.data;
  }
  let inputText: string | undefined;
  try {
    inputText = toJsonText(stored, what);
  } catch (error) {
    throw new InvalidInputError((error as Error).message, { cause: error });
  }
  checkInputSize(host, inputText, what);
  const payloads = host.deps.payloads;
  if (inputText === undefined || !payloads?.enabled) return inputText;
  const storedText = payloads.text(inputText);
  checkInputSize(host, storedText, `${what} (encoded)`);
  return storedText;
}

function checkInputSize(host: StartHost, text: string | undefined, what: string): void {
  const size = text === undefined ? 0 : Buffer.byteLength(text);
  if (size > host.deps.maxPayloadBytes) {
    throw new PayloadTooLargeError(`${what} is ${size} bytes, over the limit of ${host.deps.maxPayloadBytes}`, {
      details: { bytes: size, limit: host.deps.maxPayloadBytes },
    });
  }
}

/** The options every run gets, as start_run's (and start_runs') JSON options. */
function startOptionsToSql(
  workflow: Workflow<any, any>,
  options: Omit<StartOptions, 'runId' | 'idempotencyKey' | 'concurrencyKey'>,
  caller: string,
): Record<string, unknown> {
  const sqlOptions: Record<string, unknown> = {
    version: workflow.version,
    queue: options.queue ?? workflow.queue,
    max_recovery_attempts: workflow.maxRecoveryAttempts,
    version_manifest: workflow.versionManifest,
  };
  if (options.tenantId !== undefined) sqlOptions.tenant_id = options.tenantId;
  // The caller's trace: every execution of the run continues it (runs.traceparent).
  const traceparent = options.traceparent === undefined ? activeTraceparent() : options.traceparent;
  if (traceparent !== undefined && traceparent !== null) {
    if (!isTraceparent(traceparent)) {
      throw new InvalidInputError(
        `${caller}: traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>), not ${JSON.stringify(traceparent)}`,
      );
    }
    sqlOptions.traceparent = traceparent;
  }
  if (options.priority !== undefined) {
    if (!Number.isInteger(options.priority)) throw new InvalidInputError(`${caller}: priority must be a whole number (lower runs first)`);
    sqlOptions.priority = options.priority;
  }
  // A time is a valid Date, a duration 0 to 2^53 - 1 ms (docs/waits.md#how-far-ahead): INVALID_INPUT otherwise.
  if (options.runAt !== undefined) {
    const runAt = options.runAt;
    // A duration travels as a delay, so this process's clock plays no part in when the run starts.
    if (runAt instanceof Date) sqlOptions.run_at = asInvalidInput(() => toInstant(runAt, `${caller}: runAt`));
    else sqlOptions.run_in_ms = Math.round(asInvalidInput(() => toMs(runAt, `${caller}: runAt`)));
  }
  Object.assign(sqlOptions, limitsToSql({ maxSteps: options.maxSteps, budget: options.budget, noProgress: options.noProgress }, caller));
  if (options.deadline !== undefined) {
    const deadline = options.deadline;
    sqlOptions.deadline = asInvalidInput(() =>
      deadline instanceof Date ? toInstant(deadline, `${caller}: deadline`) : `${toMs(deadline, `${caller}: deadline`)} milliseconds`,
    );
  }
  return sqlOptions;
}

/** The options engine.start and engine.startMany take: any other is refused, so a misspelt limit is never dropped. */
const START_OPTIONS: ReadonlyArray<keyof StartOptions> = [
  'runId',
  'idempotencyKey',
  'queue',
  'priority',
  'concurrencyKey',
  'tenantId',
  'deadline',
  'runAt',
  'maxSteps',
  'budget',
  'noProgress',
  'traceparent',
  'debounce',
];
const START_MANY_OPTIONS: ReadonlyArray<keyof StartManyOptions> = [
  ...(START_OPTIONS.filter((name) => !['runId', 'idempotencyKey', 'concurrencyKey', 'debounce'].includes(name)) as Array<
    keyof StartManyOptions
  >),
  'runIds',
  'idempotencyKeys',
  'concurrencyKeys',
];

/** INVALID_INPUT, naming the unknown ones and the known ones, for an option the call does not take (or options that are not an object). */
function checkOptionNames(options: unknown, known: readonly string[], caller: string): void {
  if (options === null || typeof options !== 'object' || Array.isArray(options)) {
    throw new InvalidInputError(
      `${caller}: options must be an object, not ${options === null ? 'null' : Array.isArray(options) ? 'an array' : typeof options}`,
    );
  }
  const unknown = Object.keys(options).filter((name) => !known.includes(name));
  if (unknown.length > 0) {
    throw new InvalidInputError(
      `${caller}: unknown option${unknown.length > 1 ? 's' : ''} ${unknown.map((name) => JSON.stringify(name)).join(', ')} (the options are ${known.join(', ')})`,
      { details: { unknown, known: [...known] } },
    );
  }
}

/** A start option's ConfigError (toMs, toInstant) as the INVALID_INPUT every other bad start option is. */
function asInvalidInput<T>(convert: () => T): T {
  try {
    return convert();
  } catch (error) {
    if (error instanceof ConfigError) throw new InvalidInputError(error.message, { cause: error });
    throw error;
  }
}

/**
 * Waits until the run is terminal. A run this process's worker executes since its start
 * (ranHere) is answered by that execution when it completes the run: the output it
 * committed, with no read. Otherwise, woken by runledger_finished (LISTEN) or by a worker
 * of the same engine, it reads the run row once per wake-up (ResultWatch); without a
 * ResultWatch it reads on a growing interval (10 ms up to 500 ms).
 */
export async function awaitResult<O>(host: StartHost, runId: string, timeoutMs = Infinity, ranHere?: LocalExecution): Promise<O> {
  // A timeout of this caller's own: measured on its clock, never compared with the database's.
  const deadline = Date.now() + timeoutMs;
  if (ranHere) {
    // Only a committed completion answers here, anything else is read below. The execution
    // ends however the run goes (it completes, waits, is released), but not always soon: a
    // step that hangs past the lease is taken over by another worker, which may finish the
    // run while this execution still awaits the step. No other worker can take the run
    // before the lease runs out, so past it the caller watches the database too (the
    // announcement of the run's end, or this worker's own wake-up when it completes).
    const success = await withinMs(ranHere.done, Math.min(timeoutMs, ranHere.leaseMs));
    if (success) return (success.outputText === undefined ? null : JSON.parse(success.outputText)) as O;
  }
  const remaining = Math.max(0, deadline - Date.now());
  const read = () => host.getRun(runId, { withSteps: false });
  const run = host.results ? await host.results.until(runId, read, remaining) : await pollUntil(read, remaining);
  if (!run) throw new RunFailedError(`run ${runId} not found`, { runId });
  if (run.status === 'SUCCEEDED') return run.output as O;
  if (TERMINAL_STATES.has(run.status)) {
    throw new RunFailedError(`run ${runId} ended ${run.status} (${run.terminationReason})${errorSuffix(run.error)}`, {
      runId,
      status: run.status,
      terminationReason: run.terminationReason,
      terminationEvidence: run.terminationEvidence,
      error: run.error,
    });
  }
  const served = run.status !== 'PENDING' || (await servedByLiveWorker(host.deps.pool, run.workflowName, run.workflowVersion));
  const key = `${run.workflowName}@${run.workflowVersion}`;
  throw new RunFailedError(
    `run ${runId} still ${run.status} after ${timeoutMs} ms` +
      (served ? '' : `: no live worker serves ${key} (runledger.workers); start a worker with this workflow defined`),
    { runId, status: run.status, ...(served ? {} : { noLiveWorker: key }) },
  );
}

/** The run row read on a growing interval until it is terminal or missing, or the time is up. */
async function pollUntil(read: () => Promise<RunRecord | undefined>, timeoutMs: number): Promise<RunRecord | undefined> {
  const deadline = Date.now() + timeoutMs;
  for (let interval = 10; ; interval = Math.min(500, interval * 1.5)) {
    const run = await read();
    if (!run || TERMINAL_STATES.has(run.status) || Date.now() + interval > deadline) return run;
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}

/**
 * Whether a live worker (registered in runledger.workers, not stopped, heard from within
 * its lease on the database clock) serves this workflow version.
 */
async function servedByLiveWorker(pool: pg.Pool, name: string, version: string): Promise<boolean> {
  const result = await pool.query(
    `select exists (
       select 1 from runledger.workers
        where $1 = any (workflows) and stopped_at is null
          and last_heartbeat_at + make_interval(secs => lease_ms / 1000.0) > runledger.now()) as served`,
    [`${name}@${version}`],
  );
  return result.rows[0].served === true;
}

function errorSuffix(error: unknown): string {
  const message = (error as { message?: unknown } | null)?.message;
  return typeof message === 'string' ? `: ${message}` : '';
}
