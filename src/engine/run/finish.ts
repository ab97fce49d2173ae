import { SQLSTATE, serializeError } from '../core/errors.js';
import { storableJson, storableText } from '../core/storable.js';
import { isConnectionError, pgCode } from '../db/pg-errors.js';
import { stepItemValues } from './checkpoint.js';
import { completeItem } from './commit-items.js';
import { runCompensations } from './compensate.js';
import type { CheckpointRecord, Execution } from './execution.js';

/**
 * How a run's execution ends in the database: the fenced terminal writes (complete, fail,
 * dead letter, terminate, finish a cancel) and the release that gives a run back. Each is
 * retried across lost connections; a write another worker's token refuses writes nothing.
 */

/** How long an infrastructure failure keeps a released run off the workers. */
export const RELEASE_DELAY_MS = 1_000;
const FINISH_TRIES = 5;

/**
 * Success: the output (and the last step's deferred checkpoint) in one transaction, an item
 * of the worker's group commit. `output.stored` is written; `output.clear` is what a
 * caller of this process awaiting the run is handed (engine.start's handle).
 */
export async function complete(
  exec: Execution,
  output: { clear: string | undefined; stored: string | undefined },
  policyVersion: string,
  last: CheckpointRecord | undefined,
  verificationJson: string | undefined,
): Promise<void> {
  const { commits } = exec.deps;
  // The run ends with this write: whatever is pending goes with it, once (with the last step when there is one).
  const charge = exec.takeCharge();
  const item = completeItem({
    runId: exec.runId,
    token: exec.fencingToken.toString(),
    outputText: output.stored,
    policyVersion,
    charge: charge.json,
    ...(verificationJson === undefined ? {} : { verificationJson }),
    ...(last ? { step: stepItemValues(exec, last, charge) } : {}),
  });
  await fencedWrite(exec, async () => {
    const result = await commits.submit(item, true, exec.trace?.ref);
    if (result.runStatus === 'SUCCEEDED') exec.succeeded = { outputText: output.clear };
  });
}

/** The error a _fail_run call stores (JSON text), or a dead letter's reason, for the span. */
function failureOf(arg: unknown): unknown {
  if (typeof arg !== 'string' || !arg.startsWith('{')) return String(arg);
  try {
    const error = JSON.parse(arg) as { message?: unknown; name?: unknown };
    return Object.assign(new Error(String(error.message ?? arg)), { name: typeof error.name === 'string' ? error.name : 'Error' });
  } catch {
    return arg;
  }
}

/** A fenced terminal write, retried across lost connections; a commit already made is recognised by the run's status. */
export async function finish(exec: Execution, call: string, args: unknown[]): Promise<void> {
  // A failure or a dead letter marks this execution's span ERROR (args[0]: the error as JSON, or the reason).
  if (exec.trace && (call.startsWith('runledger._fail_run') || call.startsWith('runledger._dead_letter_run'))) {
    exec.trace.fail(failureOf(args[0]));
  }
  // The record of how a run ended is always stored: a character PostgreSQL cannot hold in
  // an error or evidence (workflow payloads were refused before this) becomes U+FFFD.
  const stored = args.map((arg) => (typeof arg === 'string' ? storableJson(storableText(arg)) : arg));
  await fencedWrite(exec, async () => {
    await exec.deps.pool.query(`select ${call}`, [exec.runId, exec.fencingToken.toString(), ...stored]);
    exec.deps.metrics?.commit('finish');
  });
}

/** A terminal write: once it returns, the engine's callers awaiting the run are woken at once (no NOTIFY round trip). */
async function fencedWrite(exec: Execution, write: () => Promise<unknown>): Promise<void> {
  // Every chunk written is stored before the run ends (a reader stops at a terminal run); chunks that could not be
  // stored (the execution halted) must not be ended without: the run is given back (executeClaimed) and replayed.
  const flushing = exec.flushBeforeEnd();
  if (flushing && !(await flushing)) throw new Error(`run ${exec.runId}: stream chunks could not be stored before the run's end`);
  try {
    // How the run ended (a terminal status, or CANCELLING after _terminate_run) is read for the metrics.
    if (await fencedWriteOnce(exec, write)) exec.deps.finishedRuns?.ended(exec.runId);
  } finally {
    exec.deps.finished?.(exec.runId);
  }
}

/** True when this call's write committed. */
async function fencedWriteOnce(exec: Execution, write: () => Promise<unknown>): Promise<boolean> {
  for (let attempt = 1; ; attempt++) {
    try {
      await write();
      return true;
    } catch (error) {
      if (pgCode(error) === SQLSTATE.LEASE_LOST) {
        // Either another worker took over, or our previous try committed before its reply was lost.
        exec.log('warn', `run ${exec.runId}: not finished by this worker: ${(error as Error).message}`);
        return false;
      }
      if (pgCode(error) === SQLSTATE.PAST_DEADLINE) {
        // The deadline passed before the run could finish: that is how it ends.
        await terminate(exec, 'DEADLINE', { message: (error as Error).message });
        return false;
      }
      if (!isConnectionError(error) || attempt >= FINISH_TRIES) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100 * attempt));
    }
  }
}

/**
 * A policy stop by the owner. A run with compensations due comes back CANCELLING (still
 * ours, with the TERMINATED record set aside): its compensations run here, newest first,
 * and it ends TERMINATED. A crash in between leaves it CANCELLING for recovery and the
 * next claim, which finish the same way.
 */
export async function terminate(exec: Execution, reason: string, evidence: Record<string, unknown>): Promise<void> {
  let status: string | undefined;
  await fencedWrite(exec, async () => {
    const { rows } = await exec.deps.pool.query(
      'select runledger._terminate_run(p_run_id => $1, p_token => $2, p_reason => $3, p_evidence => $4::jsonb) as status',
      [exec.runId, exec.fencingToken.toString(), reason, storableJson(JSON.stringify(exec.mask(evidence)))],
    );
    status = rows[0].status;
    exec.deps.metrics?.commit('finish');
  });
  if (status === 'CANCELLING') await compensateAndFinish(exec);
}

/** The run fails with this error: its compensations run first (sagas), and their failures join the error. */
export async function failRun(exec: Execution, serialized: object, policyVersion: string): Promise<void> {
  const failures = await runCompensations(exec);
  const error = { ...serialized, ...(failures.length > 0 ? { compensationFailures: failures } : {}) };
  await finish(exec, 'runledger._fail_run(p_run_id => $1, p_token => $2, p_error => $3::jsonb, p_policy_version => $4)', [
    JSON.stringify(exec.mask(error)),
    policyVersion,
  ]);
}

/** Runs the compensations and ends the CANCELLING run this execution owns (_finish_cancel: CANCELLED, or its stop_record). */
export async function compensateAndFinish(exec: Execution): Promise<void> {
  await runCompensations(exec);
  if (exec.haltReason?.kind === 'crashed' || exec.haltReason?.kind === 'suspended') return; // a crash point (tests)
  await finish(exec, 'runledger._finish_cancel(p_run_id => $1, p_token => $2)', []);
}

/**
 * A payload this worker cannot decode: the fault is the worker's (a key it lacks), so the
 * run is given back unchanged, its input and checkpoints as they were, for a worker that
 * can, with the coded error as the reason (in the released event, and in the evidence of
 * the dead letter the run becomes after max_recovery_attempts such releases).
 */
export async function releaseUnreadable(exec: Execution, error: unknown): Promise<void> {
  const coded = error as { code?: unknown; message?: unknown };
  const reason = `${typeof coded?.code === 'string' ? coded.code : 'PAYLOAD_UNREADABLE'}: ${String(coded?.message ?? error)}`;
  exec.log('error', `run ${exec.runId}: released, a stored payload cannot be decoded here: ${reason}`, {
    error: serializeError(error),
  });
  await release(exec, RELEASE_DELAY_MS, reason, error);
}

/**
 * Gives the run back. `error`, when a failure is why, is kept with the release and, when
 * this release is one too many (max_recovery_attempts), in the dead letter's runs.error.
 */
export async function release(exec: Execution, delayMs: number, reason: string, error?: unknown): Promise<void> {
  // Only a graceful stop gives a run back for free; every other release counts a recovery attempt.
  const countsAttempt = reason !== 'worker_stopping';
  await exec.deps.pool.query(
    'select runledger._release_run(p_run_id => $1, p_token => $2, p_delay_ms => $3, p_reason => $4, p_counts_attempt => $5, p_error => $6::jsonb)',
    [exec.runId, exec.fencingToken.toString(), delayMs, reason, countsAttempt, error === undefined ? null : releaseError(exec, error)],
  );
  exec.deps.metrics?.commit('release');
  // Past max_recovery_attempts the release dead-lettered the run.
  if (countsAttempt) exec.deps.finishedRuns?.ended(exec.runId, 'MAX_RECOVERY_ATTEMPTS');
}

/** The error a run is given back for, as stored: class, code, message and the SQLSTATE of a database error. */
function releaseError(exec: Execution, error: unknown): string {
  const sqlstate = pgCode(error);
  const { stack: _stack, ...serialized } = serializeError(error);
  return storableJson(JSON.stringify(exec.mask({ ...serialized, ...(sqlstate === undefined ? {} : { sqlstate }) })));
}
