import type { Execution } from './execution.js';
import { SQLSTATE } from '../core/errors.js';
import { pgCode } from '../db/pg-errors.js';

/**
 * What a failed fenced write means for the execution, by SQLSTATE: someone else
 * owns the run (RL001), the run is being cancelled (RL008), its deadline passed
 * (RL009); anything else is an infrastructure failure, resolved by replay.
 */
export function haltOnDbError(exec: Execution, error: unknown): void {
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

/** Reacts to the run status a checkpoint returned: the worker learns of a cancel or a policy stop within one round trip. */
export function observeRunStatus(exec: Execution, status: string | undefined): void {
  if (status === 'CANCELLING') exec.requestCancel();
  else if (status !== undefined && status !== 'RUNNING') exec.halt({ kind: 'stopped', status });
}
