import type pg from 'pg';
import type { ZodType } from 'zod';
import type { Kysely } from 'kysely';
import {
  ConfigError,
  NonDeterminismError,
  NotInWorkflowError,
  PayloadUnreadableError,
  RunledgerError,
  SecretInPayloadError,
  SecretNotFoundError,
  serializeError,
  type ConstraintViolationError,
  type NotSerializableError,
  type SerializedError,
  type StepNotAwaitedError,
} from '../core/errors.js';
import type { LogFunction, RunLogFields } from '../core/log.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';
import { Masker, type Redaction, type RedactSource } from '../core/redaction.js';
import { assertStorable } from '../core/json.js';
import { checkSecretName, type SecretResolver } from '../core/secrets.js';
import { workflowKey, type Workflow } from '../core/workflow.js';
import type { CrashHook } from '../core/crash-points.js';
import type { RunledgerDatabase } from '../db/schema.js';
import type { CommitItem, CommitResult } from './commit-items.js';
import { addAmounts, subtractAmounts, toSqlAmounts, type BudgetAmounts } from '../core/budget.js';
import type { ExecutionTrace, SpanRef, Tracing } from '../observe/tracing.js';

/** A charge taken for one write: its amounts, and the JSON the SQL functions take (null: nothing to charge). */
export interface ChargeToSend {
  amounts: BudgetAmounts;
  json: string | null;
}

/** The no-progress policy of the run's workflow for ctx.progress, set by the worker once the run's context exists. */
export interface NoProgressPolicy {
  limit: number;
  /** The workflow's onNoProgress, bound to the run's context; called once. */
  onNoProgress?: (evidence: { rounds: number; limit: number; positions: number[] }) => Promise<void> | void;
}

/** Per execution: the progress hashes seen so far, the current streak, and whether onNoProgress was called. */
export interface ProgressState {
  seen: Set<string>;
  rounds: number;
  positions: number[];
  warned: boolean;
}

/** Limits and spending per budget dimension, as loaded from the run's row. */
export interface BudgetState {
  limits: BudgetAmounts;
  spent: BudgetAmounts;
}

export type CompensationFunction = (info: { result: unknown; idempotencyKey: string; signal: AbortSignal }) => Promise<unknown> | unknown;

import type { StepKind } from '../core/states.js';
import type { EngineMetrics } from '../observe/metrics.js';
import type { FinishedLookup } from '../observe/finished.js';
import type { PolicyFunction } from '../core/policy.js';
export type { StepKind } from '../core/states.js';

/** One checkpoint as loaded at claim time: [seq, name, status, output, error, kind]. */
export type CheckpointRow = [number, string, 'SUCCEEDED' | 'FAILED' | 'WAITING', unknown, unknown, StepKind];

/** Why an execution stopped before the workflow function settled. */
export type Halt =
  | { kind: 'lease_lost'; message: string }
  | { kind: 'non_determinism'; error: NonDeterminismError }
  | { kind: 'infrastructure'; error: unknown }
  /** A write broke a database constraint: replaying would break it again, so the run ends FAILED with this error. */
  | { kind: 'fail'; error: ConstraintViolationError | NotSerializableError }
  | { kind: 'shutdown' }
  /** The run is parked WAITING in the database; the worker just lets go of it. */
  | { kind: 'suspended' }
  /** Cancel requested: the step in flight has finished; the run ends CANCELLED. */
  | { kind: 'cancelled' }
  /** A policy stops the run (deadline, max steps); the worker records the termination. */
  | { kind: 'terminate'; reason: 'DEADLINE' | 'MAX_STEPS' | 'NO_PROGRESS' | 'POLICY'; evidence: Record<string, unknown> }
  /** The worker crashed at a crash point (tests): it writes nothing more, its lease runs out. */
  | { kind: 'crashed' }
  /** The run already ended in the database (a checkpoint tripped its budget or no-progress limit). */
  | { kind: 'stopped'; status: string }
  /** The workflow returned or threw with a ctx call still in flight: the run fails with this error. */
  | { kind: 'not_awaited'; error: StepNotAwaitedError }
  /**
   * A stored payload this worker's codec cannot decode (a key it lacks: PAYLOAD_KEY_MISSING):
   * the worker is at fault, not the run, so the run is given back unchanged for a worker that can.
   */
  | { kind: 'unreadable'; error: RunledgerError };

/** A ctx call that has not settled yet: what it is, its name and the step position it took. */
export interface PendingCall {
  call: string;
  name: string | undefined;
  position: number;
}

export interface RunLimits {
  maxSteps: number | null;
  budget: number | null;
  budgetSpent: number;
}

/**
 * What an execution starts from: the run as this worker claimed it (runledger._claim_batch,
 * its payloads decoded) and the code that executes it. Fixed for the whole execution.
 */
export interface RunClaim {
  runId: string;
  /** The claim's new fencing token: every write of this execution is fenced by it. */
  fencingToken: bigint;
  /** 1 for the first execution of the run; +1 for every recovery after a lost lease. */
  attempt: number;
  /** The run's history, by step position: what the replay returns without running anything. */
  checkpoints: ReadonlyArray<CheckpointRow>;
  /** Date.now() at the claim (the worker's heartbeat compares it with its own sends). */
  claimedAt: number;
  workflowName: string;
  workflowVersion: string;
  /** runs.lineage_id: the run a chain of forks started from; none for a run never forked. */
  lineageId?: string | null;
  limits?: RunLimits;
  /** The run's budgets as claimed (budget-state.ts budgetStateOf); none: no limits, nothing spent. */
  budget?: BudgetState;
  /** Last heartbeat progress per step position. */
  progress?: Record<string, unknown> | null;
  /** Lease length of the worker executing this run (for step heartbeats); default 30 s. */
  leaseMs?: number;
  /** The definition this worker serves the run with; none if it serves none (the run is then given back). */
  workflow?: Pick<Workflow, 'versionManifest' | 'redaction'>;
  /** This execution's span while a tracer provider records. */
  trace?: ExecutionTrace;
}

/** How long a cancelled run's step in flight may take to finish and record its result. */
export const CANCEL_GRACE_MS = 10_000;

/** A step's checkpoint before it is written. */
export interface CheckpointRecord {
  seq: number;
  name: string;
  kind: 'step' | 'transaction';
  status: 'SUCCEEDED' | 'FAILED';
  outputText: string | undefined;
  error: unknown;
  attempts: number;
  /** When the step started, as a monotonicMark() of this worker; sent as the elapsed time (p_started_ms_ago). */
  startedAt: number;
}

/** What the run layer needs of the worker's group commit: send an item, hear how it went. */
export interface CommitQueue {
  /** `trace`: the span of the execution the item is written for (the batch's span links to it). */
  submit(item: CommitItem, completes?: boolean, trace?: SpanRef): Promise<CommitResult>;
}

/** What the engine shares with each of its workers: an execution's dependencies but the worker's own group commit. */
export type EngineDeps = Omit<ExecutionDeps, 'commits'>;

export interface ExecutionDeps {
  pool: pg.Pool;
  db: Kysely<RunledgerDatabase>;
  maxPayloadBytes: number;
  log: LogFunction;
  /** A log bound to one run's fields (core/log.ts engineLog); without it the fields go into each line's meta. */
  logFor?: (fields: RunLogFields) => LogFunction;
  /** The engine option `secrets`: what ctx.secret resolves names with. */
  secrets?: SecretResolver;
  /** The worker's group commit: every plain checkpoint and every completion is an item of it (a batch of one when alone). */
  commits: CommitQueue;
  /** Crash points (tests only, engine option crashAt), bound to the worker that dies at one. */
  crash?: CrashHook;
  /** Makes a workflow startable from SQL (child runs are started by runledger.start_run). */
  registerWorkflow: (workflow: Workflow<any, any>) => Promise<void>;
  /**
   * The result schemas (ctx.operation's `result` option) this engine's runs have used, by
   * resultSchemaKey(workflow@version, operation name): engine.resolveOperation checks
   * an operator's result against them before writing it.
   */
  resultSchemas?: Map<string, ZodType<unknown>>;
  /** The runs whose environment (WorkflowOptions.environment) this worker process has: made or rebuilt here, not reclaimed since. */
  localEnvironments?: Set<string>;
  /** A terminal write of this run committed (or may have): the engine's callers awaiting it read it now. */
  finished?: (runId: string) => void;
  /** The engine's payload codec (createEngine's `codec`); none: payloads are stored in clear. */
  payloads?: Payloads;
  /** OpenTelemetry traces (observe/tracing.ts); none without @opentelemetry/api. */
  tracing?: Tracing;
  /** The engine's metrics (observe/metrics.ts); none when no MeterProvider records them. */
  metrics?: EngineMetrics;
  /** How the runs this worker's terminal writes ended, looked up for metrics (with `metrics` only). */
  finishedRuns?: FinishedLookup;
}

/** What Execution.readable returns when the payload could not be decoded (the execution halted). */
export const UNREADABLE: unique symbol = Symbol('unreadable');

export function resultSchemaKey(workflowKey: string, operation: string): string {
  return `${workflowKey}\u0000${operation}`;
}

/**
 * The in-memory state of one claimed run on one worker: its fencing token, the
 * checkpoints loaded at claim, the position of the next step and how it stops.
 * Internal control flow (lease lost, non-determinism, shutdown) never throws
 * through user code: the execution halts and the pending ctx call never settles.
 */
export class Execution {
  readonly abortController = new AbortController();
  readonly halted: Promise<Halt>;
  haltReason: Halt | undefined;
  private resolveHalt!: (halt: Halt) => void;
  private nextSeq = 0;
  private consumed = 0;
  private inFlight = 0;
  cancelRequested = false;
  /** Steps in flight, newest last: ctx.heartbeat speaks for the newest. */
  readonly activeSteps: number[] = [];
  /** Set while a step heartbeats itself: the worker's own heartbeat then leaves this run's lease to it. */
  selfHeartbeat = false;
  /** Compensations of operations that succeeded in this run, in order; run in reverse on failure or cancel. */
  readonly compensations: Array<{ operationId: string; name: string; idempotencyKey: string; result: unknown; fn: CompensationFunction }> =
    [];
  /**
   * The last step's checkpoint, not yet written: it is written before anything else
   * happens (the next step, a wait, a failure), or together with the run's completion,
   * saving one round trip for a run's final step. Until then a crash re-runs that step,
   * which ctx.step allows (at least once until its checkpoint commits).
   */
  pendingCheckpoint: CheckpointRecord | undefined;
  /** The deferred checkpoint's write while it is on its way (see flushPending). */
  flushing: Promise<boolean> | undefined;
  /** What ctx.charge charged since the last checkpoint, per dimension; it commits with the next one. */
  pendingCharge: BudgetAmounts = {};
  /**
   * The run's budgets as this execution last saw them: as claimed, then kept up to date
   * by its own charges (and by what ctx.chargeNow's write returns).
   */
  budgetState: BudgetState;
  /**
   * The workflow's no-progress policy for ctx.progress. Set by the worker after
   * construction, the one field that is: its onNoProgress is bound to the run's context,
   * which is built on this execution.
   */
  noProgressPolicy: NoProgressPolicy | undefined;
  /** The run's environment manifest (WorkflowOptions.environment), once its step ran or replayed: ctx.environment. */
  environment: unknown = undefined;
  /** The workflow's policy (WorkflowOptions.policy), asked before each action is first taken; set by the worker. */
  policy: PolicyFunction | undefined;
  /** The rounds ctx.progress counted so far in this execution (created by its first call). */
  progressState: ProgressState | undefined;
  /** ctx.patched's answer per patch id, so every call in one execution gets the same. */
  readonly patches = new Map<string, boolean>();
  /**
   * The values this execution keeps out of what it writes: the secrets it resolved, and
   * the values its redact paths selected in the input, the step results, the signals and
   * the output it has seen so far.
   */
  readonly masks = new Masker();
  /** ctx.secret's values, by name, resolved once per execution (never stored). */
  readonly #secrets = new Map<string, Promise<string>>();

  /** Notes the values the workflow's redact paths select in data the run saw (its input, a step's result...). */
  observe<T>(source: RedactSource, value: T): T {
    if (this.redaction) this.masks.addRedacted(this.redaction.select(source, value));
    return value;
  }

  /** A copy with this execution's secrets and redacted values masked: for errors, evidence and log meta. */
  mask<T>(value: T): T {
    return this.masks.mask(value);
  }

  /** An error as stored (step, operation, retry, compensation and run errors), masked. */
  serializeError(thrown: unknown): SerializedError {
    return this.masks.mask(serializeError(thrown));
  }

  /** The engine's log for this run: every line with the run's id and workflow, the message and meta masked. */
  log(level: 'info' | 'warn' | 'error', message: string, meta?: Record<string, unknown>): void {
    this.runLog()(level, this.masks.maskText(message), meta === undefined ? undefined : this.masks.mask(meta));
  }

  #runLog: LogFunction | undefined;
  /** The engine's log bound to the run's fields, once. */
  private runLog(): LogFunction {
    if (this.#runLog) return this.#runLog;
    const fields: RunLogFields = { runId: this.runId, workflow: this.workflowName, version: this.workflowVersion || undefined };
    const { logFor, log } = this.deps;
    this.#runLog = logFor ? logFor(fields) : (level, message, meta) => log(level, message, { ...fields, ...meta });
    return this.#runLog;
  }

  /**
   * Refuses a payload about to be written that holds a secret this execution resolved
   * (SECRET_IN_PAYLOAD, naming the secret and `what`, never the value).
   */
  checkPayload(payload: string | Uint8Array | undefined | null, what: string): void {
    if (!this.masks.hasSecrets) return;
    const secret = this.masks.secretIn(payload);
    if (secret === undefined) return;
    throw new SecretInPayloadError(
      `${what} contains the value of secret ${JSON.stringify(secret)} (ctx.secret): it is not stored. ` +
        'Use a secret inside the step that needs it, and return what the call produced, never the secret.',
      { secret, payload: what },
    );
  }
  /**
   * checkPayload for a plain text the workflow gave (a key, an id, an approval's action),
   * not JSON text: one PostgreSQL cannot store (NUL, a lone surrogate) fails the call that
   * made it, not a statement other runs share. JSON text was checked by toJsonText.
   */
  checkText(text: string | undefined | null, what: string): void {
    if (typeof text === 'string') assertStorable(text, what);
    this.checkPayload(text, what);
  }

  /** ctx.secret: the value of secret `name`, from the engine's resolver, once per execution. */
  secret(name: string): Promise<string> {
    const what = `ctx.secret(${JSON.stringify(name)})`;
    try {
      this.assertLive(what);
      checkSecretName(name);
    } catch (error) {
      return Promise.reject(error);
    }
    let value = this.#secrets.get(name);
    if (!value) {
      value = this.#resolveSecret(name, what);
      this.#secrets.set(name, value);
      value.catch(() => this.#secrets.delete(name)); // a failed resolution is tried again by the next call
    }
    return value;
  }

  async #resolveSecret(name: string, what: string): Promise<string> {
    const resolver = this.deps.secrets;
    if (!resolver) {
      throw new ConfigError(
        `${what}: no secrets resolver is configured; pass createEngine({ secrets: (name, { runId, workflow }) => value })`,
      );
    }
    let value: unknown;
    try {
      value = await resolver(name, {
        runId: this.runId,
        workflow: this.workflowName,
        version: this.workflowVersion,
        signal: this.abortController.signal,
      });
    } catch (error) {
      const message = this.masks.maskText(error instanceof Error ? error.message : String(error));
      throw new SecretNotFoundError(`${what}: the secrets resolver failed: ${message}`, { cause: error, details: { secret: name } });
    }
    if (value === undefined || value === null) {
      throw new SecretNotFoundError(`${what}: the secrets resolver has no secret ${JSON.stringify(name)}`, { details: { secret: name } });
    }
    if (typeof value !== 'string' || value.length === 0) {
      throw new ConfigError(
        `${what}: the secrets resolver returned ${typeof value === 'string' ? 'an empty string' : `a ${typeof value}`}, not the secret's value as a non-empty string`,
      );
    }
    // Known before the value reaches the workflow: from here on no write of this execution may hold it.
    this.masks.addSecret(name, value);
    return value;
  }

  /** Adds a charge to the pending one (validated by the caller). */
  addPendingCharge(amount: BudgetAmounts): void {
    this.pendingCharge = addAmounts(this.pendingCharge, amount);
  }

  /** Of the pending charge, what a write on its way carries already (not sent again by another write). */
  private chargeInFlight: BudgetAmounts = {};

  /**
   * The pending charge a write is to carry: what no other write on its way carries. It
   * stays pending (counted by budget.remaining) until the write commits (chargeCommitted)
   * or fails (releaseCharge), so a charge made meanwhile by a concurrent step is neither
   * lost nor sent twice, and a write retried after a failure sends it again.
   */
  takeCharge(): ChargeToSend {
    const amounts = subtractAmounts(this.pendingCharge, this.chargeInFlight);
    this.chargeInFlight = addAmounts(this.chargeInFlight, amounts);
    const sql = toSqlAmounts(amounts);
    return { amounts, json: sql === undefined ? null : JSON.stringify(sql) };
  }

  /** The write did not commit: its charge can go with the next one. */
  releaseCharge(charge: ChargeToSend): void {
    this.chargeInFlight = subtractAmounts(this.chargeInFlight, charge.amounts);
  }

  /** The write committed with its charge: that much is spent, and no longer pending. */
  chargeCommitted(charge: ChargeToSend): void {
    this.releaseCharge(charge);
    this.pendingCharge = subtractAmounts(this.pendingCharge, charge.amounts);
    this.budgetState.spent = addAmounts(this.budgetState.spent, charge.amounts);
  }
  /**
   * Set once this execution's completion committed with the run SUCCEEDED: the output as
   * the JSON text it sent (undefined for none). A caller of this process awaiting the run
   * takes it from here instead of reading the row (engine.start's handle).
   */
  succeeded: { outputText: string | undefined } | undefined;
  /**
   * How this execution ended, once the workflow function settled or the worker let go of
   * the run: from then on no ctx call may start (NotInWorkflowError) and none starts its work.
   */
  ended: string | undefined;
  /** The ctx calls started and not settled yet, by call number: what the workflow left in flight. */
  readonly pendingCalls = new Map<number, PendingCall>();
  private callNumber = 0;

  readonly runId: string;
  readonly fencingToken: bigint;
  readonly attempt: number;
  readonly checkpoints: ReadonlyArray<CheckpointRow>;
  readonly claimedAt: number;
  readonly limits: RunLimits;
  /** The run's workflow name and version (its log lines, metrics, the secrets resolver). */
  readonly workflowName: string;
  readonly workflowVersion: string;
  /** workflow@version of the run (core/workflow.ts workflowKey). */
  readonly workflowKey: string;
  /** ctx.lineageId: the run a chain of forks started from (runs.lineage_id), or this run. */
  readonly lineageId: string;
  /** Last heartbeat progress per step position, loaded at claim. */
  readonly progress: Readonly<Record<string, unknown>>;
  /** Lease length of the worker executing this run (for step heartbeats). */
  readonly leaseMs: number;
  /** The version manifest of the code executing the run: a non-determinism's evidence names it. */
  readonly codeManifest: Readonly<Record<string, unknown>> | undefined;
  /** The workflow's redact paths. */
  readonly redaction: Redaction | undefined;
  /** This execution's span while a tracer provider records; undefined otherwise. */
  readonly trace: ExecutionTrace | undefined;

  constructor(
    claim: RunClaim,
    readonly deps: ExecutionDeps,
  ) {
    this.runId = claim.runId;
    this.fencingToken = claim.fencingToken;
    this.attempt = claim.attempt;
    this.checkpoints = claim.checkpoints;
    this.claimedAt = claim.claimedAt;
    this.limits = claim.limits ?? { maxSteps: null, budget: null, budgetSpent: 0 };
    this.budgetState = claim.budget ?? { limits: {}, spent: {} };
    this.workflowName = claim.workflowName;
    this.workflowVersion = claim.workflowVersion;
    this.workflowKey = workflowKey(claim.workflowName, claim.workflowVersion);
    this.lineageId = claim.lineageId || claim.runId;
    this.progress = claim.progress ?? {};
    this.leaseMs = claim.leaseMs ?? 30_000;
    this.codeManifest = claim.workflow?.versionManifest;
    this.redaction = claim.workflow?.redaction;
    this.trace = claim.trace;
    this.halted = new Promise((resolve) => (this.resolveHalt = resolve));
  }

  /** True when no new step may start: halted, cancel requested, or the workflow function already settled. */
  get stopping(): boolean {
    return this.haltReason !== undefined || this.cancelRequested || this.ended !== undefined;
  }

  /** What must be stored before the run's terminal write (registered by steps/stream.ts: the chunks its writers hold). */
  readonly #beforeEnd: Array<() => Promise<boolean> | undefined> = [];

  /** Registers a flush the run's terminal write waits for: it answers undefined when nothing is pending, else whether all was stored. */
  onBeforeEnd(flush: () => Promise<boolean> | undefined): void {
    this.#beforeEnd.push(flush);
  }

  /**
   * Waits for what must be stored before the run ends (onBeforeEnd): undefined when nothing
   * is pending (the hot path pays nothing); else true once stored, false when something was
   * lost because the execution halted (the run must not end without it).
   */
  flushBeforeEnd(): Promise<boolean> | undefined {
    const pending = this.#beforeEnd.map((flush) => flush()).filter((p): p is Promise<boolean> => p !== undefined);
    if (pending.length === 0) return undefined;
    return Promise.all(pending).then((all) => all.every(Boolean));
  }

  /** Marks the execution ended (the first reason given stays): see `ended`. */
  end(how: string): void {
    this.ended ??= how;
  }

  /** Refuses a ctx call once the execution ended: the ctx belongs to a run (execution) that is over. */
  assertLive(what: string): void {
    if (this.ended !== undefined) {
      throw new NotInWorkflowError(
        `${what} was called after run ${this.runId} ended (${this.ended}); a ctx is valid only while its workflow function runs`,
      );
    }
  }

  /**
   * Starts a ctx call that takes a step position and tracks it until it settles, so that
   * a workflow ending with it unsettled is seen (the call was not awaited). Refused with
   * NotInWorkflowError (a rejected promise) once the execution ended.
   */
  track<T>(call: string, name: string | undefined, start: () => Promise<T>): Promise<T> {
    const what = name === undefined ? `ctx.${call}()` : `ctx.${call}(${JSON.stringify(name)})`;
    try {
      this.assertLive(what);
    } catch (error) {
      return Promise.reject(error);
    }
    const id = this.callNumber++;
    this.pendingCalls.set(id, { call, name, position: this.nextSeq });
    let promise: Promise<T>;
    try {
      promise = start();
    } catch (error) {
      this.pendingCalls.delete(id);
      return Promise.reject(error);
    }
    // Registered before the caller can await the promise, so the call counts as settled
    // by the time the workflow's code after the await runs.
    const settle = () => void this.pendingCalls.delete(id);
    promise.then(settle, settle);
    return promise;
  }

  /**
   * Cancel requested (NOTIFY or a checkpoint's answer): the abort signal fires at once,
   * no new step starts, and the run ends once the step in flight has recorded its result
   * (or after the grace period).
   */
  requestCancel(graceMs = CANCEL_GRACE_MS): void {
    if (this.cancelRequested) return;
    this.cancelRequested = true;
    this.abortController.abort('cancelled');
    if (this.inFlight === 0) this.halt({ kind: 'cancelled' });
    else
      setTimeout(() => {
        // A child process being killed (ctx.exec) holds the end until its kill is confirmed.
        if (this.#cancelHolds.size === 0) this.halt({ kind: 'cancelled' });
        else void Promise.allSettled([...this.#cancelHolds]).then(() => this.halt({ kind: 'cancelled' }));
      }, graceMs).unref();
  }

  readonly #cancelHolds = new Set<Promise<unknown>>();

  /** Keeps a cancelled run from ending before `settled` settles (past the cancel grace too): a kill in progress. */
  holdCancel(settled: Promise<unknown>): void {
    this.#cancelHolds.add(settled);
    const release = () => void this.#cancelHolds.delete(settled);
    settled.then(release, release);
  }

  /** The engine's payload codec, or none. */
  get payloads(): Payloads {
    return this.deps.payloads ?? NO_CODEC;
  }

  /**
   * Decodes what this execution read back from the database (a signal's payload, a
   * child's output, a session's entries...). A payload this worker cannot decode halts the
   * execution ('unreadable': the run is given back unchanged) and gives UNREADABLE, so that
   * the ctx call suspends instead of throwing the codec's error into the workflow.
   */
  readable<T>(decode: () => T): T | typeof UNREADABLE {
    try {
      return decode();
    } catch (error) {
      this.halt({
        kind: 'unreadable',
        error:
          error instanceof RunledgerError
            ? error
            : new PayloadUnreadableError(`run ${this.runId}: a stored payload cannot be decoded: ${String(error)}`, { cause: error }),
      });
      return UNREADABLE;
    }
  }

  get inFlightCount(): number {
    return this.inFlight;
  }

  /** No new step may start: suspends, and ends a cancelled execution once nothing is in flight. */
  noNewStep<T>(): Promise<T> {
    if (this.cancelRequested && this.inFlight === 0) this.halt({ kind: 'cancelled' });
    return this.suspend();
  }

  /** Marks the run cancelled from the start (a CANCELLING run claimed to finish its compensations). */
  startCancelled(): void {
    this.cancelRequested = true;
    this.abortController.abort('cancelled');
  }

  /** Runs one step's work (body and checkpoint) counted as in flight, for cancellation. */
  async inStep<T>(work: () => Promise<T>, seq?: number): Promise<T> {
    this.inFlight++;
    if (seq !== undefined) this.activeSteps.push(seq);
    try {
      return await work();
    } finally {
      this.inFlight--;
      if (seq !== undefined) {
        this.activeSteps.splice(this.activeSteps.lastIndexOf(seq), 1);
        if (this.activeSteps.length === 0) this.selfHeartbeat = false;
      }
      if (this.cancelRequested && this.inFlight === 0) this.halt({ kind: 'cancelled' });
    }
  }

  halt(reason: Halt): void {
    if (this.haltReason) return;
    this.haltReason = reason;
    if (reason.kind === 'lease_lost') this.deps.metrics?.leaseLost(this.workflowName, this.workflowVersion);
    this.abortController.abort(reason.kind);
    this.resolveHalt(reason);
  }

  /** A promise that never settles: the execution is abandoned by the worker, not unwound through user frames. */
  suspend<T>(): Promise<T> {
    return new Promise<T>(() => {});
  }

  /**
   * Takes the next step position and returns the checkpoint recorded there, if any.
   * A name differing from the recorded one is non-determinism: the run is parked, never guessed.
   */
  takeStep(name: string, kind: StepKind): { seq: number; recorded: CheckpointRow | undefined } | undefined {
    assertStorable(name, `the name of ctx.${kind} ${JSON.stringify(name)}`);
    const seq = this.nextSeq++;
    const recorded = this.checkpoints[seq];
    if (recorded) {
      if (recorded[1] !== name || recorded[5] !== kind) {
        this.halt({
          kind: 'non_determinism',
          error: new NonDeterminismError(
            `run ${this.runId}: step ${seq} is ${kind} ${JSON.stringify(name)} in this execution but ${recorded[5]} ${JSON.stringify(recorded[1])} in the checkpoint`,
            { seq, expected: recorded[1], actual: name, expectedKind: recorded[5], actualKind: kind },
          ),
        });
        return undefined;
      }
      this.consumed++;
      // Charges made before a recorded step were committed with it.
      this.pendingCharge = {};
      this.chargeInFlight = {};
    } else if (this.limits.maxSteps !== null && seq >= this.limits.maxSteps) {
      this.halt({ kind: 'terminate', reason: 'MAX_STEPS', evidence: { max_steps: this.limits.maxSteps, next_step: name, seq } });
      return undefined;
    }
    return { seq, recorded };
  }

  /** The checkpoint at the next position, without taking it: ctx.patched asks whether an old run passed here. */
  peekCheckpoint(): CheckpointRow | undefined {
    return this.checkpoints[this.nextSeq];
  }

  /** Checkpoints the workflow returned without reaching: the code now takes fewer steps than the history. */
  unconsumedCheckpoints(): CheckpointRow[] {
    return this.checkpoints.slice(this.nextSeq);
  }

  get stepsTaken(): number {
    return this.nextSeq;
  }
}
