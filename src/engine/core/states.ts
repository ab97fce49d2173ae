/**
 * The contract lists, defined once for TypeScript: run states and their transitions,
 * termination reasons, step kinds and wait kinds. SQL defines each once too
 * (the enum `runledger.run_status`, the functions `runledger.run_transitions()`,
 * `termination_reasons()`, `step_kinds()`, `wait_kinds()`), docs/state-machine.md
 * draws them, and test/contracts.test.ts checks that the three agree.
 */
export const RUN_STATES = [
  /** Waiting to be claimed. A worker's claim (compare-and-set, fencing token + 1) moves it to RUNNING. */
  'PENDING',
  /** Owned by one worker under a lease. The owner moves it to a terminal state, WAITING, or back to PENDING (release);
   *  the sweeper moves it to PENDING (a recovery attempt) or DEAD_LETTER when the lease expires. */
  'RUNNING',
  /** Holds no worker. A timer, signal, approval, child completion or operator moves it back to PENDING. */
  'WAITING',
  /** Stopping, its compensations to run first: a cancel, a policy stop of a run with compensations due, or compensate_run.
   *  The owner (or, if it died, the next claim) runs them and ends the run CANCELLED, or with the record it stopped with
   *  (stop_record: TERMINATED by a policy, or the status compensate_run set aside). A cancel that loses the race with the
   *  run's last write ends it as that write says (SUCCEEDED, FAILED, TERMINATED, DEAD_LETTER). */
  'CANCELLING',
  /** Terminal: the workflow returned. */
  'SUCCEEDED',
  /** Terminal: the workflow threw. `retry_run` moves it back to PENDING. */
  'FAILED',
  /** Terminal: cancelled. */
  'CANCELLED',
  /** Terminal: a policy stopped it (deadline, budget, max steps, no progress). */
  'TERMINATED',
  /** Terminal, out of the automatic path (recovery attempts exhausted, non-determinism). `retry_run` moves it back to PENDING. */
  'DEAD_LETTER',
] as const;

export type RunStatus = (typeof RUN_STATES)[number];

export const TERMINAL_STATES: ReadonlySet<RunStatus> = new Set(['SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER']);

/**
 * Every status change a run can make, with who makes it. SQL refuses any other
 * (rule runs_transition of the trigger runs_invariants), so this list is the state machine, not a picture of it.
 */
export const RUN_TRANSITIONS: ReadonlyArray<{ from: RunStatus; to: RunStatus; by: string }> = [
  { from: 'PENDING', to: 'RUNNING', by: 'a claim (_claim_batch, fencing_token + 1), once admitted' },
  { from: 'PENDING', to: 'CANCELLED', by: 'cancel_run' },
  { from: 'PENDING', to: 'CANCELLING', by: 'cancel_run, or a deadline, with compensations to run' },
  { from: 'PENDING', to: 'TERMINATED', by: 'deadline (_enforce_deadlines, or at claim)' },
  { from: 'RUNNING', to: 'SUCCEEDED', by: 'the workflow returned (_complete_run)' },
  { from: 'RUNNING', to: 'FAILED', by: 'the workflow threw, or its input is invalid (_fail_run)' },
  { from: 'RUNNING', to: 'TERMINATED', by: 'deadline, max steps (_terminate_run); budget, no progress (in a checkpoint)' },
  { from: 'RUNNING', to: 'DEAD_LETTER', by: 'NON_DETERMINISM, or past max_recovery_attempts' },
  { from: 'RUNNING', to: 'PENDING', by: 'lease expired (+1 recovery attempt), or released' },
  { from: 'RUNNING', to: 'WAITING', by: 'sleep, signal, approval, child, durable retry backoff, unknown operation' },
  { from: 'RUNNING', to: 'CANCELLING', by: 'cancel_run; a policy stop with compensations to run (_terminate_run)' },
  { from: 'WAITING', to: 'PENDING', by: 'timer, signal, decision, child ended, resolve_operation (_wake)' },
  { from: 'WAITING', to: 'RUNNING', by: 'a claim of a due timer (_claim_batch, queue without limits)' },
  { from: 'WAITING', to: 'CANCELLED', by: 'cancel_run' },
  { from: 'WAITING', to: 'CANCELLING', by: 'cancel_run, or a deadline, with compensations to run' },
  { from: 'WAITING', to: 'TERMINATED', by: 'deadline (_enforce_deadlines, or at claim)' },
  { from: 'CANCELLING', to: 'CANCELLED', by: 'the owner (_finish_cancel), or recovery if it died' },
  { from: 'CANCELLING', to: 'SUCCEEDED', by: 'the cancel lost the race with the last step (_finish_run)' },
  { from: 'CANCELLING', to: 'FAILED', by: 'the cancel lost the race with a failure (_finish_run)' },
  { from: 'CANCELLING', to: 'TERMINATED', by: 'the cancel lost the race with a policy stop (_finish_run)' },
  { from: 'CANCELLING', to: 'DEAD_LETTER', by: 'the cancel lost the race with a dead-letter (_finish_run)' },
  { from: 'FAILED', to: 'PENDING', by: 'retry_run' },
  { from: 'DEAD_LETTER', to: 'PENDING', by: 'retry_run' },
  { from: 'FAILED', to: 'CANCELLING', by: 'compensate_run' },
  { from: 'CANCELLED', to: 'CANCELLING', by: 'compensate_run' },
  { from: 'TERMINATED', to: 'CANCELLING', by: 'compensate_run' },
  { from: 'DEAD_LETTER', to: 'CANCELLING', by: 'compensate_run' },
];

export const TERMINATION_REASONS = [
  'COMPLETED',
  'FAILED',
  'CANCELLED',
  'DEADLINE',
  'MAX_STEPS',
  'BUDGET',
  'NO_PROGRESS',
  'MAX_RECOVERY_ATTEMPTS',
  'NON_DETERMINISM',
  'UNVERIFIED',
  'POLICY',
] as const;

export type TerminationReason = (typeof TERMINATION_REASONS)[number];

/** What a checkpoint (a row of runledger.steps) records. */
export const STEP_KINDS = ['step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child'] as const;

export type StepKind = (typeof STEP_KINDS)[number];

/** A checkpoint's status; WAITING: a wait (or a retry backoff) in progress at this position. */
export const STEP_STATUSES = ['SUCCEEDED', 'FAILED', 'WAITING'] as const;

export type StepStatus = (typeof STEP_STATUSES)[number];

/**
 * The operation ledger: STARTED, the intent committed and the call may be in flight; UNKNOWN, its outcome was lost;
 * PLANNED, a FAILED operation put back by retry_run, to be called again with the same key.
 */
export const OPERATION_STATUSES = ['PLANNED', 'STARTED', 'SUCCEEDED', 'FAILED', 'UNKNOWN'] as const;

export type OperationStatus = (typeof OPERATION_STATUSES)[number];

/** An operation's compensation, once it started. */
export const COMPENSATION_STATUSES = ['STARTED', 'DONE', 'FAILED'] as const;

export type CompensationStatus = (typeof COMPENSATION_STATUSES)[number];

/** What a WAITING run waits for (runs.wait_kind). */
export const WAIT_KINDS = ['timer', 'signal', 'approval', 'child', 'retry', 'reconcile', 'rate_limit'] as const;

export type WaitKind = (typeof WAIT_KINDS)[number];
