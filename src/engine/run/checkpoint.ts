import type { ChargeToSend, CheckpointRecord, Execution } from './execution.js';
import { haltOnDbError, observeRunStatus } from './halts.js';
import { isConnectionError } from '../db/pg-errors.js';
import { checkpointItem, type StepItemValues } from './commit-items.js';
import { msSince } from '../core/duration.js';

/** runledger._checkpoint's parameters, in the order of checkpointValues(). */
export const CHECKPOINT_PARAMS = [
  'p_run_id',
  'p_token',
  'p_seq',
  'p_name',
  'p_kind',
  'p_status',
  'p_output',
  'p_error',
  'p_attempts',
  'p_started_ms_ago',
  'p_charge',
] as const;

export type { CheckpointRecord } from './execution.js';

/** The checkpoint's arguments; the step's start goes as the time elapsed since it, measured now (call it just before sending). */
export function checkpointValues(exec: Execution, record: CheckpointRecord, charge: ChargeToSend): unknown[] {
  return [
    exec.runId,
    exec.fencingToken.toString(),
    record.seq,
    record.name,
    record.kind,
    record.status,
    record.outputText ?? null,
    record.status === 'FAILED' ? JSON.stringify(exec.serializeError(record.error)) : null,
    record.attempts,
    msSince(record.startedAt),
    charge.json,
  ];
}

/** The same checkpoint as named values, for the worker's group commit (runledger._commit_batch). */
export function stepItemValues(exec: Execution, record: CheckpointRecord, charge: ChargeToSend): StepItemValues {
  return {
    runId: exec.runId,
    token: exec.fencingToken.toString(),
    seq: record.seq,
    name: record.name,
    kind: record.kind,
    status: record.status,
    outputText: record.outputText,
    errorJson: record.status === 'FAILED' ? JSON.stringify(exec.serializeError(record.error)) : null,
    attempts: record.attempts,
    startedMsAgo: msSince(record.startedAt),
    charge: charge.json,
  };
}

/** One fenced checkpoint write, an item of the worker's group commit. Returns the run's status. */
async function sendCheckpoint(exec: Execution, record: CheckpointRecord, charge: ChargeToSend): Promise<string | undefined> {
  return (await exec.deps.commits.submit(checkpointItem(stepItemValues(exec, record, charge)), false, exec.trace?.ref)).runStatus;
}

export type WriteResult = { ok: true } | { ok: false; halted: true };

const WRITE_TRIES = 5;

/**
 * Writes a checkpoint in one round trip: in the worker's group commit, with the
 * checkpoints of other runs ready at the same moment (alone, a batch of one).
 * A stale fencing token halts the execution (lease lost). A connection lost
 * mid-write leaves the outcome unknown: it is resolved by reading whether the
 * checkpoint committed, and written again only if it did not.
 */
export async function writeCheckpoint(exec: Execution, record: CheckpointRecord): Promise<WriteResult> {
  // One charge for every attempt of this write: an attempt that did not commit sends it again.
  const charge = exec.takeCharge();
  for (let attempt = 1; ; attempt++) {
    try {
      // Each attempt measures the step's elapsed time afresh (a retry after a lost connection is later).
      committed(exec, await sendCheckpoint(exec, record, charge), charge);
      return { ok: true };
    } catch (error) {
      if (!isConnectionError(error) || attempt >= WRITE_TRIES) {
        exec.releaseCharge(charge);
        haltOnDbError(exec, error);
        return { ok: false, halted: true };
      }
      const outcome = await readCheckpointOutcome(exec, record.seq).catch(() => undefined);
      if (outcome?.committed) {
        committed(exec, undefined, charge);
        return { ok: true };
      }
      if (outcome && !outcome.stillOwner) {
        exec.releaseCharge(charge);
        exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: taken over while a checkpoint write was in doubt` });
        return { ok: false, halted: true };
      }
      await backoff(attempt);
    }
  }
}

/** Writes the deferred checkpoint, if any; false when the execution halted instead. */
export async function flushPending(exec: Execution): Promise<boolean> {
  const pending = exec.pendingCheckpoint;
  // Nothing left to write, but a write may be on its way (the next step started it): a halt
  // (cancel, shutdown) waits for it, or the run could end before that step's result is kept.
  if (!pending) return (await exec.flushing?.catch(() => false)) ?? true;
  exec.pendingCheckpoint = undefined;
  const flushing = writeCheckpoint(exec, pending).then((written) => written.ok);
  exec.flushing = flushing;
  try {
    return await flushing;
  } finally {
    if (exec.flushing === flushing) exec.flushing = undefined;
  }
}

/** After a checkpoint committed: the charge it carried is spent, and the run's status (cancel, policy stop) is acted on. */
export function committed(exec: Execution, runStatus: string | undefined, charge: ChargeToSend): void {
  exec.chargeCommitted(charge);
  observeRunStatus(exec, runStatus);
}

export interface CheckpointOutcome {
  committed: boolean;
  status: 'SUCCEEDED' | 'FAILED' | 'WAITING' | null;
  output: unknown;
  error: unknown;
  stillOwner: boolean;
}

/** Waits out any in-flight transaction on the run (row lock), then reports whether the checkpoint exists. */
export async function readCheckpointOutcome(exec: Execution, seq: number): Promise<CheckpointOutcome> {
  const result = await exec.deps.pool.query(
    'select committed, status, output, error, still_owner from runledger._checkpoint_outcome(p_run_id => $1, p_seq => $2, p_token => $3)',
    [exec.runId, seq, exec.fencingToken.toString()],
  );
  const row = result.rows[0];
  return { committed: row.committed, status: row.status, output: row.output, error: row.error, stillOwner: row.still_owner };
}

export function backoff(attempt: number): Promise<void> {
  const ms = Math.min(2_000, 50 * 2 ** attempt) * (0.5 + Math.random() / 2);
  return new Promise((resolve) => setTimeout(resolve, ms));
}
