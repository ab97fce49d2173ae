import { flushPending } from '../engine/run/checkpoint.js';
import type { ZodType } from 'zod';
import { InvalidInputError, InvalidReconcileAnswerError, StepTimeoutError, type SerializedError } from '../engine/core/errors.js';
import { monotonicMark, msSince } from '../engine/core/duration.js';
import { committed } from '../engine/run/checkpoint.js';
import { haltOnDbError } from '../engine/run/halts.js';
import { resultSchemaKey, UNREADABLE, type CompensationFunction, type Execution } from '../engine/run/execution.js';
import { heartbeatStep } from './heartbeat.js';
import { streamsFlushed } from './stream.js';
import type { Jsonify } from '../engine/core/jsonify.js';
import { encodeOutput, stepFailure } from './replay.js';
import { decideRetry, resolveRetryPolicy, type RetryPolicy } from './retry.js';
import { resumeAttempt, stepTimeoutMs } from './step.js';
import { attemptWithTimeout } from './attempt.js';
import { isKeyInUse, keyInUse } from './key-in-use.js';
import { acquirePermit, checkRateLimitKey, pauseOnRetryAfter } from './rate-limit.js';
import { allowedByPolicy } from './policy.js';
import { toMs, type Duration } from '../engine/core/duration.js';
import { storableJson } from '../engine/core/storable.js';

export type ReconcileAnswer<T> =
  { status: 'succeeded'; result: T; externalResourceId?: string } | { status: 'failed'; error?: unknown } | { status: 'unknown' };

export interface OperationOptions<T> {
  /**
   * Stable across attempts and recoveries; default `<runId>:<position>:<name>`. Passed to fn.
   * A fork (fork_run) reuses the result its source recorded under the same key (a key from the
   * business entity: the effect happens once across forks); a key from `ctx.runId` gives the fork its own effect.
   */
  idempotencyKey?: string;
  /** Asks the outside world what happened to a call whose outcome is UNKNOWN. */
  reconcile?: (info: { idempotencyKey: string; operationId: string }) => Promise<ReconcileAnswer<T>>;
  /** The call is safe to repeat with the same key: an UNKNOWN outcome is settled by calling again. */
  idempotent?: boolean;
  retry?: RetryPolicy;
  /** Names the external resource created (ticket id, payment id...) for the ledger; gets the stored (JSON) result. */
  externalResourceId?: (result: Jsonify<T>) => string | undefined;
  /** Undoes the operation if the run later fails or is cancelled (sagas); recorded, never run twice. Gets the stored (JSON) result. */
  compensate?: (info: { result: Jsonify<T>; idempotencyKey: string; signal: AbortSignal }) => Promise<unknown> | unknown;
  /** How long to wait before asking `reconcile` again when it answered 'unknown'; default 30 s. */
  reconcileEveryMs?: number;
  /**
   * The result's schema (zod). A result an operator settled with resolve_operation is
   * checked against it when the run replays the operation: one that does not match fails
   * the run with INVALID_INPUT naming the operation (see docs/operations.md).
   */
  result?: ZodType<T>;
  /**
   * A shared rate limit key (set_rate_limit / engine.setRateLimit): each call first waits for a
   * permit on it, across every run and worker (a long wait holds no worker and leaves the ledger
   * row PLANNED, not UNKNOWN), and a call that fails with a Retry-After pauses the key for every run.
   */
  rateLimit?: string;
  /**
   * How long one call may run: past it its signal fires and the attempt ends with STEP_TIMEOUT.
   * The call may have happened, so its outcome is unknown: an `idempotent` operation is called
   * again within `retry` (same key); any other is UNKNOWN in the ledger, settled by `reconcile`
   * or an operator, as after a crash during the call.
   */
  timeout?: Duration;
}

/** Marks the options of an operation a tool call makes (src/agents/tool.ts): the policy was asked about the tool call. */
const FROM_TOOL_CALL = Symbol('runledger.fromToolCall');

/** The options of the operation a tool call makes: the workflow's policy is not asked again about it. */
export function fromToolCall<T>(options: OperationOptions<T>): OperationOptions<T> {
  return Object.assign(options, { [FROM_TOOL_CALL]: true });
}

export type OperationFunction<T> = (info: {
  idempotencyKey: string;
  operationId: string;
  signal: AbortSignal;
  attempt: number;
  /** Renews the lease from inside a long call and records progress. */
  heartbeat: (progress?: unknown) => Promise<void>;
}) => Promise<T>;

interface LedgerRow {
  operation_id: string;
  status: 'STARTED' | 'SUCCEEDED' | 'FAILED' | 'UNKNOWN' | 'UNKNOWN_NOW';
  attempts: number;
  idempotency_key: string;
  result: unknown;
  error: unknown;
}

const RECONCILE_EVERY_MS_DEFAULT = 30_000;

/**
 * `ctx.operation`: an external side effect through the ledger. The intent (STARTED,
 * with the idempotency key) commits before `fn` is called; the outcome commits with
 * the step checkpoint. A STARTED row found on replay is UNKNOWN: `reconcile` decides,
 * or an idempotent operation is called again with the same key, or the run waits for
 * an operator (resolve_operation). Never a silent retry of a non-idempotent call.
 */
export async function runOperation<T>(
  exec: Execution,
  name: string,
  options: OperationOptions<T>,
  fn: OperationFunction<T>,
): Promise<Jsonify<T>> {
  const policy = resolveRetryPolicy(options.retry, `operation ${JSON.stringify(name)}`);
  if (options.reconcileEveryMs !== undefined) toMs(options.reconcileEveryMs, `operation ${JSON.stringify(name)}: reconcileEveryMs`);
  const rateLimit = checkRateLimitKey(options.rateLimit, `operation ${JSON.stringify(name)}`);
  const timeoutMs = stepTimeoutMs(options.timeout, `operation ${JSON.stringify(name)}: timeout`);
  // The policy's question is built only when the workflow has a policy (this is every operation's path).
  if (
    exec.policy &&
    !(options as { [FROM_TOOL_CALL]?: boolean })[FROM_TOOL_CALL] &&
    !allowedByPolicy(exec, {
      kind: 'operation',
      name,
      idempotencyKey: options.idempotencyKey ?? `${exec.runId}:${exec.stepsTaken}:${name}`,
    })
  )
    return exec.suspend();
  const position = exec.takeStep(name, 'operation');
  if (!position) return exec.suspend();
  const { seq, recorded } = position;
  if (options.result) exec.deps.resultSchemas?.set(resultSchemaKey(exec.workflowKey, name), options.result);
  if (recorded && recorded[2] !== 'WAITING') {
    const stored = (recorded[3] as [Stored<T>] | null)?.[0];
    if (recorded[2] === 'FAILED') throw stepFailure(name, recorded[4] as never);
    registerCompensation(exec, name, options, stored!);
    return stored!.value;
  }
  if (!(await flushPending(exec))) return exec.suspend();
  if (exec.stopping) return exec.noNewStep();
  const key = options.idempotencyKey ?? `${exec.runId}:${seq}:${name}`;
  exec.checkText(key, `idempotency key of operation ${JSON.stringify(name)}`);
  const retryPending = recorded?.[2] === 'WAITING';

  return exec.inStep(async (): Promise<Jsonify<T>> => {
    const begin = async (again: boolean): Promise<LedgerRow | undefined> => {
      try {
        const result = await exec.deps.pool.query(
          'select * from runledger._operation_begin(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_key => $5, p_compensable => $6, p_again => $7)',
          [exec.runId, exec.fencingToken.toString(), seq, name, key, options.compensate !== undefined, again],
        );
        return result.rows[0];
      } catch (error) {
        // Another run's operation holds the key: the run fails with an error that names it.
        if (isKeyInUse(error)) exec.halt({ kind: 'fail', error: await keyInUse(exec, name, key, error) });
        else haltOnDbError(exec, error, name);
        return undefined;
      }
    };
    let row = await begin(retryPending);
    let attempt = Math.max(resumeAttempt(recorded), row?.attempts ?? 1);
    let reconciledResourceId: string | undefined;
    const startedAt = monotonicMark();
    for (;;) {
      if (!row || exec.haltReason) return exec.suspend();
      let outcome: Outcome<T> | undefined;
      if (row.status === 'STARTED') {
        // Started by this execution (a STARTED row found on replay comes back UNKNOWN): not called yet.
        if (rateLimit && !(await acquirePermit(exec, rateLimit, { seq, name, kind: 'operation' }, attempt))) return exec.suspend();
        const started = row;
        try {
          const value = await attemptWithTimeout(exec, name, started.attempts, timeoutMs, (signal) => {
            const info = {
              idempotencyKey: started.idempotency_key,
              operationId: started.operation_id,
              signal,
              attempt: started.attempts,
              heartbeat: (progress?: unknown) => heartbeatStep(exec, seq, progress),
            };
            return exec.trace ? exec.trace.child('operation', name, seq, started.attempts, () => fn(info)) : fn(info);
          });
          outcome = { ok: true, value };
        } catch (error) {
          outcome = { ok: false, error };
          if (error instanceof StepTimeoutError && !options.idempotent && !exec.haltReason) {
            // The call may have happened: its outcome is unknown, as after a crash during it.
            exec.log('warn', `run ${exec.runId}: operation ${JSON.stringify(name)} ran past its timeout: its outcome is unknown`);
            row = await begin(false);
            continue;
          }
        }
      } else if (row.status === 'SUCCEEDED') {
        // Settled by an operator or a reconciler: an operator's JSON is checked against the schema.
        const settled = exec.readable(() => exec.payloads.decode<T>(row!.result));
        if (settled === UNREADABLE) return exec.suspend();
        const value = options.result ? checkResolvedResult(name, row.operation_id, options.result, settled) : settled;
        outcome = { ok: true, value };
      } else if (row.status === 'FAILED') {
        // Settled FAILED in the ledger (resolve_operation): thrown as a step failure carrying the recorded error.
        const recordedError = toSerializedError(row.error, name);
        outcome = { ok: false, error: stepFailure(name, recordedError), recorded: recordedError };
      } else if (options.reconcile) {
        let answer: unknown;
        try {
          answer = await options.reconcile({ idempotencyKey: row.idempotency_key, operationId: row.operation_id });
        } catch {
          answer = { status: 'unknown' };
        }
        if (!isReconcileAnswer<T>(answer)) {
          // A bug in reconcile, not an outcome of the call: the ledger stays UNKNOWN, the step fails, no retry.
          const error = invalidAnswer(name, row, answer, exec.payloads.enabled);
          exec.log('error', `run ${exec.runId}: ${error.message}`);
          outcome = { ok: false, error, keepUnknown: true };
        } else if (answer.status === 'succeeded') {
          outcome = { ok: true, value: answer.result };
          if (answer.externalResourceId) reconciledResourceId = answer.externalResourceId;
        } else if (answer.status === 'failed')
          outcome = { ok: false, error: answer.error ?? new Error(`operation ${name} failed (reconciled)`) };
        else return park(exec, seq, row.operation_id, options.reconcileEveryMs ?? RECONCILE_EVERY_MS_DEFAULT);
      } else if (options.idempotent) {
        row = await begin(true);
        continue;
      } else {
        return park(exec, seq, row.operation_id, null);
      }
      if (exec.haltReason) return exec.suspend();
      if (!outcome.ok && rateLimit && row.status === 'STARTED' && !(await pauseOnRetryAfter(exec, rateLimit, outcome.error)))
        return exec.suspend();

      if (!outcome.ok && !outcome.keepUnknown && !exec.cancelRequested) {
        const decision = await decideRetry(exec, policy, { seq, name, kind: 'operation' }, attempt, outcome.error);
        if (decision.kind === 'suspended') return exec.suspend();
        if (decision.kind === 'again') {
          attempt = decision.attempt;
          row = await begin(true);
          continue;
        }
      }
      if (exec.deps.crash?.hit('before-checkpoint', name)) return exec.suspend();
      // The chunks the operation wrote are stored before its checkpoint (see stream.ts, streamsFlushed).
      const flushing = streamsFlushed(exec);
      if (flushing && !(await flushing)) return exec.suspend();
      return record(
        exec,
        { seq, name, operationId: row.operation_id, key: row.idempotency_key, attempt, startedAt, reconciledResourceId },
        outcome,
        options,
      );
    }
  }, seq);
}

/** An operator's result that does not match the operation's schema fails the run (thrown, not recorded). */
export function checkResolvedResult<T>(name: string, operationId: string, schema: ZodType<T>, result: unknown): T {
  const parsed = schema.safeParse(result);
  if (parsed.success) return parsed.data;
  const issues = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(result)'}: ${issue.message}`).join('; ');
  throw new InvalidInputError(
    `operation ${JSON.stringify(name)} (${operationId}): the resolved result does not match its result schema: ${issues}`,
  );
}

type Outcome<T> =
  | { ok: true; value: T }
  /** recorded: the error as the ledger holds it; keepUnknown: the ledger row stays UNKNOWN (invalid reconcile answer). */
  | { ok: false; error: unknown; recorded?: SerializedError; keepUnknown?: boolean };

const ANSWER_SHAPES = "{ status: 'succeeded', result }, { status: 'failed', error? } or { status: 'unknown' }";

function isReconcileAnswer<T>(answer: unknown): answer is ReconcileAnswer<T> {
  if (typeof answer !== 'object' || answer === null) return false;
  const status = (answer as { status?: unknown }).status;
  return (status === 'succeeded' && 'result' in answer) || status === 'failed' || status === 'unknown';
}

/**
 * The error of an answer that is none of ANSWER_SHAPES. It is stored (steps.error, the run's
 * error, events), so with a payload codec it describes the answer's shape and never quotes
 * it: what reconcile answered is the outside world's data, a payload like a result.
 */
function invalidAnswer(name: string, row: LedgerRow, answer: unknown, encoded: boolean): InvalidReconcileAnswerError {
  let shown: string;
  if (encoded) {
    shown = `${describeAnswer(answer)} (not quoted: the payload codec is on)`;
  } else {
    try {
      shown = JSON.stringify(answer) ?? String(answer);
    } catch {
      shown = String(answer);
    }
    if (shown.length > 200) shown = `${shown.slice(0, 200)}...`;
  }
  return new InvalidReconcileAnswerError(
    `reconcile of operation ${JSON.stringify(name)} (${row.operation_id}) answered ${shown}; it must answer ${ANSWER_SHAPES}. The operation stays UNKNOWN.`,
    { operationId: row.operation_id, idempotencyKey: row.idempotency_key, answer: shown },
  );
}

/** What an invalid reconcile answer is, in words that hold none of its values. */
function describeAnswer(answer: unknown): string {
  if (answer === null || answer === undefined) return String(answer);
  if (Array.isArray(answer)) return 'an array';
  if (typeof answer !== 'object') return `a ${typeof answer}`;
  if (!('status' in answer)) return 'an object without a status';
  const status = (answer as { status?: unknown }).status;
  if (status === 'succeeded') return "an object with status 'succeeded' but no result";
  if (typeof status !== 'string') return `an object whose status is a ${status === null ? 'null' : typeof status}`;
  return 'an object whose status is none of the three';
}

/** The error a ledger row holds (serialised by runledger, or any JSON an operator gave resolve_operation) as a SerializedError. */
function toSerializedError(error: unknown, name: string): SerializedError {
  if (error === null || error === undefined) return { name: 'Error', message: `operation ${JSON.stringify(name)} failed` };
  if (typeof error !== 'object' || Array.isArray(error)) {
    return { name: 'Error', message: typeof error === 'string' ? error : JSON.stringify(error) };
  }
  const e = error as Record<string, unknown>;
  return {
    name: typeof e.name === 'string' ? e.name : 'Error',
    message: typeof e.message === 'string' ? e.message : JSON.stringify(error),
    ...(typeof e.code === 'string' || typeof e.code === 'number' ? { code: e.code } : {}),
    ...(typeof e.stack === 'string' ? { stack: e.stack } : {}),
  };
}

async function park<T>(exec: Execution, seq: number, operationId: string, retryInMs: number | null): Promise<T> {
  try {
    await exec.deps.pool.query(
      'select runledger._operation_park(p_run_id => $1, p_token => $2, p_seq => $3, p_operation_id => $4, p_retry_in_ms => $5)',
      [exec.runId, exec.fencingToken.toString(), seq, operationId, retryInMs],
    );
    exec.halt({ kind: 'suspended' });
  } catch (error) {
    haltOnDbError(exec, error);
  }
  return exec.suspend();
}

/** An operation's checkpoint output: its result in stored (JSON) form and its ledger identity. */
interface Stored<T> {
  value: Jsonify<T>;
  operationId: string;
  idempotencyKey: string;
}

async function record<T>(
  exec: Execution,
  at: { seq: number; name: string; operationId: string; key: string; attempt: number; startedAt: number; reconciledResourceId?: string },
  outcome: Outcome<T>,
  options: OperationOptions<T>,
): Promise<Jsonify<T>> {
  let outputText: string | null = null;
  let errorJson: string | null = null;
  let stored: Stored<T> | undefined;
  let failure = outcome.ok ? undefined : outcome.error;
  let recordedError = outcome.ok ? undefined : outcome.recorded;
  let externalResourceId: string | null = at.reconciledResourceId ?? null;
  if (outcome.ok) {
    try {
      const encoded = encodeOutput(exec, at.name, outcome.value);
      stored = { value: encoded.value as Jsonify<T>, operationId: at.operationId, idempotencyKey: at.key };
      // The checkpoint holds the value as stored (its codec's form; SQL copies it to operations.result).
      const value = encoded.text === undefined ? '' : `"value":${encoded.text},`;
      outputText = `{${value}"operationId":${JSON.stringify(at.operationId)},"idempotencyKey":${JSON.stringify(at.key)}}`;
    } catch (error) {
      failure = error;
    }
  }
  // A throwing externalResourceId is handled as before: by the write's catch below (the execution halts).
  let resourceIdError: unknown;
  if (stored && at.reconciledResourceId === undefined && options.externalResourceId) {
    try {
      externalResourceId = options.externalResourceId(stored.value) ?? null;
    } catch (error) {
      resourceIdError = error;
    }
  }
  try {
    exec.checkText(externalResourceId, `the external resource id of operation ${JSON.stringify(at.name)}`);
  } catch (error) {
    failure = error;
    stored = undefined;
    outputText = null;
    externalResourceId = null;
  }
  if (failure !== undefined) {
    recordedError = exec.mask(recordedError ?? exec.serializeError(failure));
    errorJson = storableJson(JSON.stringify(recordedError));
  }
  const charge = exec.takeCharge();
  try {
    if (resourceIdError !== undefined) throw resourceIdError;
    const result = await exec.deps.pool.query(
      'select run_status from runledger._operation_checkpoint(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_operation_id => $5, p_status => $6, p_output => $7::jsonb, p_error => $8::jsonb, p_external_resource_id => $9, p_attempts => $10, p_started_ms_ago => $11, p_charge => $12)',
      [
        exec.runId,
        exec.fencingToken.toString(),
        at.seq,
        at.name,
        at.operationId,
        failure === undefined ? 'SUCCEEDED' : !outcome.ok && outcome.keepUnknown ? 'UNKNOWN' : 'FAILED',
        outputText,
        errorJson,
        externalResourceId,
        at.attempt,
        msSince(at.startedAt),
        charge.json,
      ],
    );
    exec.deps.metrics?.commit('checkpoint');
    exec.deps.metrics?.stepFinished(
      exec.workflowName,
      at.name,
      'operation',
      failure === undefined ? 'SUCCEEDED' : !outcome.ok && outcome.keepUnknown ? 'UNKNOWN' : 'FAILED',
      msSince(at.startedAt),
    );
    committed(exec, result.rows[0]?.run_status, charge);
  } catch (error) {
    exec.releaseCharge(charge);
    // Unknown or failed write: replay settles it (the row is STARTED or final in the ledger).
    haltOnDbError(exec, error, at.name);
    return exec.suspend();
  }
  if (failure !== undefined) throw stepFailure(at.name, recordedError!, outcome.ok || !outcome.recorded ? failure : undefined);
  registerCompensation(exec, at.name, options, stored!);
  return stored!.value;
}

function registerCompensation<T>(exec: Execution, name: string, options: OperationOptions<T>, stored: Stored<T>): void {
  if (!options.compensate) return;
  exec.compensations.push({
    operationId: stored.operationId,
    name,
    idempotencyKey: stored.idempotencyKey,
    result: stored.value,
    fn: options.compensate as CompensationFunction,
  });
}
