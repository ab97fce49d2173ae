import type { Execution } from './execution.js';
import { ConstraintViolationError, NotSerializableError, SQLSTATE } from '../core/errors.js';
import { pgCode } from '../db/pg-errors.js';

/**
 * What a failed fenced write means for the execution, by SQLSTATE: someone else
 * owns the run (RL001), the run is being cancelled (RL008), its deadline passed
 * (RL009); a broken constraint (class 23) or a value PostgreSQL refused (class 22, e.g.
 * 22P05 for a NUL in jsonb) fails the run, since a replay would meet it again; anything else is an infrastructure failure, resolved by replay.
 */
export function haltOnDbError(exec: Execution, error: unknown, step?: string): void {
  if (isConstraintViolation(error)) {
    exec.halt({ kind: 'fail', error: constraintViolation(error, step) });
    return;
  }
  if (isDataException(error)) {
    exec.halt({ kind: 'fail', error: valueRefused(error, step) });
    return;
  }
  switch (pgCode(error)) {
    case SQLSTATE.LEASE_LOST:
    case SQLSTATE.CHECKPOINT_EXISTS: // another execution wrote this position
      exec.halt({ kind: 'lease_lost', message: (error as Error).message });
      return;
    case SQLSTATE.CANCEL_REQUESTED:
      exec.requestCancel();
      exec.halt({ kind: 'cancelled' });
      return;
    case SQLSTATE.PAST_DEADLINE:
      exec.halt({ kind: 'terminate', reason: 'DEADLINE', evidence: { message: (error as Error).message } });
      return;
    default:
      exec.halt({ kind: 'infrastructure', error });
  }
}

/** SQLSTATE class 23, integrity constraint violation: 23505 unique, 23503 foreign key, 23514 check, 23502 not null... */
export function isConstraintViolation(error: unknown): boolean {
  return pgCode(error)?.startsWith('23') ?? false;
}

/** The coded error a broken constraint ends the run with, naming the SQLSTATE, the constraint and the step. */
export function constraintViolation(error: unknown, step: string | undefined): ConstraintViolationError {
  const pg = error as { message?: string; constraint?: string; detail?: string; table?: string };
  const details = {
    sqlstate: pgCode(error),
    ...(pg.constraint === undefined ? {} : { constraint: pg.constraint }),
    ...(pg.table === undefined ? {} : { table: pg.table }),
    ...(pg.detail === undefined ? {} : { detail: pg.detail }),
    ...(step === undefined ? {} : { step }),
  };
  const where = step === undefined ? 'a write of the run' : `step ${JSON.stringify(step)}`;
  return new ConstraintViolationError(`${where} broke a database constraint: ${pg.message ?? String(error)}`, { cause: error, details });
}

/** SQLSTATE class 22, data exception: a value of the write PostgreSQL refused (22P05, 22P02, 22021, 22003...). */
export function isDataException(error: unknown): boolean {
  return pgCode(error)?.startsWith('22') ?? false;
}

/** The coded error a refused value ends the run with (OUTPUT_NOT_SERIALIZABLE), naming the SQLSTATE and the step. */
function valueRefused(error: unknown, step: string | undefined): NotSerializableError {
  const where = step === undefined ? 'a write of the run' : `step ${JSON.stringify(step)}`;
  return new NotSerializableError(`PostgreSQL refused a value of ${where}: ${(error as Error)?.message ?? String(error)}`, {
    cause: error,
    details: { sqlstate: pgCode(error), ...(step === undefined ? {} : { step }) },
  });
}

/** Reacts to the run status a checkpoint returned: the worker learns of a cancel or a policy stop within one round trip. */
export function observeRunStatus(exec: Execution, status: string | undefined): void {
  if (status === 'CANCELLING') exec.requestCancel();
  else if (status !== undefined && status !== 'RUNNING') exec.halt({ kind: 'stopped', status });
}
