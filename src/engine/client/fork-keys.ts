import type pg from 'pg';
import { fromPgError } from '../core/errors.js';

/** An operation a fork runs again whose recorded idempotency key holds the source run's id. */
export interface ForkKeyWarning {
  seq: number;
  name: string;
  idempotencyKey: string;
}

/**
 * The operations of `runId` at or after step `fromStep` (the ones a fork from there runs
 * again) whose idempotency key holds `runId`: made from ctx.runId, such a key is new in
 * the fork, which then calls the operation again (a second payment). The same list as
 * fork_run's NOTICE (sql/0013_retention.sql, _fork_run). A key made from ctx.lineageId
 * holds the run id too when the run was never forked (`neverForked`).
 */
export async function forkKeyWarnings(
  pool: pg.Pool,
  runId: string,
  fromStep: number,
): Promise<{ operations: ForkKeyWarning[]; neverForked: boolean }> {
  try {
    const result = await pool.query(
      `select o.seq, o.name, o.idempotency_key, (select r.lineage_id is null from runledger.runs r where r.run_id = $1) as never_forked
         from runledger.operations o
        where o.run_id = $1 and o.seq >= $2 and strpos(o.idempotency_key, $1) > 0
        order by o.seq`,
      [runId, fromStep],
    );
    return {
      operations: result.rows.map((r) => ({ seq: r.seq, name: r.name, idempotencyKey: r.idempotency_key })),
      neverForked: result.rows[0]?.never_forked ?? true,
    };
  } catch (error) {
    throw fromPgError(error);
  }
}

/** The warning's text, as fork_run's NOTICE words it (runledger._fork_key_notice); undefined when there is none. */
export function forkKeyWarningText(
  fork: string,
  source: string,
  warnings: { operations: ForkKeyWarning[]; neverForked: boolean },
): string | undefined {
  if (warnings.operations.length === 0) return undefined;
  const keys = warnings.operations.map((o) => `${o.name} (step ${o.seq}, key ${o.idempotencyKey})`).join(', ');
  return (
    `the fork ${fork} runs again operations of run ${source} whose idempotency keys hold that run's id: ${keys}. ` +
    'A key made from ctx.runId is new in the fork, which then calls the operation again under it: a second effect ' +
    '(a second payment, a second ticket). A key made from ctx.lineageId (the same in every fork) or from the business ' +
    'entity stays the same, and the fork reuses the effect the source recorded' +
    (warnings.neverForked
      ? ` (run ${source} was never forked: its lineage id is its run id, so a key made from ctx.lineageId is listed too)`
      : '')
  );
}
