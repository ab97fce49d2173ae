/**
 * The run state machine. Kept equal to the SQL enum `runledger.run_status`
 * (test/sql/catalog.test.ts compares them) and drawn in docs/state-machine.md.
 */
export const RUN_STATES = [
  /** Waiting to be claimed. A worker's claim (compare-and-set, fencing token + 1) moves it to RUNNING. */
  'PENDING',
  /** Owned by one worker under a lease. The owner moves it to a terminal state, WAITING, or back to PENDING (release);
   *  the sweeper moves it to PENDING (a recovery attempt) or DEAD_LETTER when the lease expires. */
  'RUNNING',
  /** Holds no worker. A timer, signal, approval, child completion or operator moves it back to PENDING. */
  'WAITING',
  /** Cancel requested while executing; the owner (or recovery, if the owner died) moves it to CANCELLED. */
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

export const TERMINATION_REASONS = [
  'COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET', 'NO_PROGRESS', 'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM',
] as const;

export type TerminationReason = (typeof TERMINATION_REASONS)[number];
