import type { Execution } from './execution.js';

/** How often a compensation is tried before it is recorded FAILED, and the backoff before each retry. */
export const COMPENSATION_ATTEMPTS = 3;
export const COMPENSATION_BACKOFF_MS = [200, 1_000] as const;

/**
 * Runs the compensations of the operations that succeeded in this run, newest first
 * (sagas). Each is recorded in the ledger before and after it runs: a crash in the
 * middle resumes with the ones not DONE, and a DONE one never runs again. A
 * compensation receives the operation's key + ':compensate', stable across retries.
 * A compensation that throws is tried again, COMPENSATION_ATTEMPTS times in all with
 * COMPENSATION_BACKOFF_MS between tries (same key), and only then recorded FAILED.
 * Returns the failures, which become part of the run's error.
 */
export async function runCompensations(exec: Execution): Promise<Array<{ operation: string; error: unknown }>> {
  const failures: Array<{ operation: string; error: unknown }> = [];
  const signal = new AbortController().signal; // compensations run to completion, even for a cancelled run
  for (const compensation of [...exec.compensations].reverse()) {
    const begun = await exec.deps.pool.query(
      'select runledger._compensation_begin(p_run_id => $1, p_token => $2, p_operation_id => $3) as status',
      [exec.runId, exec.fencingToken.toString(), compensation.operationId],
    );
    if (begun.rows[0].status !== 'STARTED') continue;
    let error: unknown;
    let attempt = 0;
    for (;;) {
      attempt++;
      error = undefined;
      try {
        await compensation.fn({ result: compensation.result, idempotencyKey: `${compensation.idempotencyKey}:compensate`, signal });
        break;
      } catch (caught) {
        error = caught;
      }
      if (attempt >= COMPENSATION_ATTEMPTS) break;
      exec.log('warn', `run ${exec.runId}: compensation of ${compensation.name} failed (attempt ${attempt}), trying again`, {
        error: exec.serializeError(error),
      });
      await new Promise((resolve) => setTimeout(resolve, COMPENSATION_BACKOFF_MS[attempt - 1] ?? COMPENSATION_BACKOFF_MS.at(-1)));
    }
    const recorded = error === undefined ? null : { ...exec.serializeError(error), attempts: attempt };
    if (recorded) failures.push({ operation: compensation.name, error: recorded });
    await exec.deps.pool.query(
      'select runledger._compensation_finish(p_run_id => $1, p_token => $2, p_operation_id => $3, p_ok => $4, p_error => $5::jsonb)',
      [exec.runId, exec.fencingToken.toString(), compensation.operationId, error === undefined, recorded ? JSON.stringify(recorded) : null],
    );
    if (exec.deps.crash?.hit('after-compensation', compensation.name)) return exec.suspend();
  }
  return failures;
}
