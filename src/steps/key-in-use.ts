import { ConstraintViolationError } from '../engine/core/errors.js';
import { pgCode } from '../engine/db/pg-errors.js';
import { constraintViolation } from '../engine/run/halts.js';
import type { Execution } from '../engine/run/execution.js';

/** The partial unique index on operations.idempotency_key (sql/0007_operations.sql): one operation per key, forks aside. */
const KEY_INDEX = 'operations_idempotency_key';

/** An operation's intent was refused because another run's operation holds its idempotency key. */
export function isKeyInUse(error: unknown): boolean {
  return pgCode(error) === '23505' && (error as { constraint?: unknown }).constraint === KEY_INDEX;
}

interface Holder {
  run_id: string;
  operation_id: string;
  name: string;
  status: string;
  workflow_name: string | null;
  run_status: string | null;
}

/**
 * The run's error for an idempotency key another run's operation holds: CONSTRAINT_VIOLATION
 * (a replay would break the key again, so the run fails, after its compensations) whose
 * message and details name the key and the run and operation that hold it, instead of
 * PostgreSQL's bare "duplicate key value violates unique constraint".
 */
export async function keyInUse(exec: Execution, name: string, key: string, error: unknown): Promise<ConstraintViolationError> {
  const base = constraintViolation(error, name);
  let holder: Holder | undefined;
  try {
    const found = await exec.deps.pool.query<Holder>(
      `select o.run_id, o.operation_id, o.name, o.status, r.workflow_name, r.status::text as run_status
         from runledger.operations o left join runledger.runs r on r.run_id = o.run_id
        where o.idempotency_key = $1 and o.prior_operation_id is null`,
      [key],
    );
    holder = found.rows[0];
  } catch {
    // Looked up for the message only: without it the error still names the key.
  }
  const who = holder
    ? `operation ${holder.operation_id} (${JSON.stringify(holder.name)}, ${holder.status}) of run ${holder.run_id}` +
      (holder.workflow_name ? ` (workflow ${holder.workflow_name}, ${holder.run_status})` : '')
    : 'an operation of another run';
  return new ConstraintViolationError(
    `operation ${JSON.stringify(name)}: idempotency key ${JSON.stringify(key)} is already used by ${who}, ` +
      `which is neither run ${exec.runId} nor a run it was forked from; a key belongs to one operation. ` +
      "Nothing was called. Make the key from what is this run's own (ctx.lineageId, the business entity this run acts on)",
    {
      cause: error,
      details: {
        ...base.details,
        idempotencyKey: key,
        ...(holder ? { heldByRunId: holder.run_id, heldByOperationId: holder.operation_id } : {}),
      },
    },
  );
}
