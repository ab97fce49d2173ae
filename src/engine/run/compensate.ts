import { serializeError } from '../core/errors.js';
import type { Execution } from './execution.js';

/**
 * Runs the compensations of the operations that succeeded in this run, newest first
 * (sagas). Each is recorded in the ledger before and after it runs: a crash in the
 * middle resumes with the ones not DONE, and a DONE one never runs again. A
 * compensation receives the operation's key + ':compensate', stable across retries.
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
    try {
      await compensation.fn({ result: compensation.result, idempotencyKey: `${compensation.idempotencyKey}:compensate`, signal });
    } catch (caught) {
      error = caught;
      failures.push({ operation: compensation.name, error: serializeError(caught) });
    }
    await exec.deps.pool.query(
      'select runledger._compensation_finish(p_run_id => $1, p_token => $2, p_operation_id => $3, p_ok => $4, p_error => $5::jsonb)',
      [
        exec.runId,
        exec.fencingToken.toString(),
        compensation.operationId,
        error === undefined,
        error === undefined ? null : JSON.stringify(serializeError(error)),
      ],
    );
    if (exec.deps.crash?.hit('after-compensation', compensation.name)) return exec.suspend();
  }
  return failures;
}
