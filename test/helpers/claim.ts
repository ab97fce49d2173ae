import type pg from 'pg';

/**
 * Claims one given run as worker `workerId`, the way a worker does (_claim_batch over the
 * run's queue and workflow@version, limit 1), for tests that play a worker from SQL (for
 * example one that dies). Fails unless that run is the one claimed: the caller must make
 * it the only claimable run of its queue and workflow.
 */
export async function claimRun(
  pool: pg.Pool,
  runId: string,
  workerId: string,
  leaseMs: number,
): Promise<{ run_id: string; fencing_token: string }> {
  const result = await pool.query<{ run_id: string; fencing_token: string }>(
    `select c.run_id, c.fencing_token::text as fencing_token
       from runledger.runs r,
            runledger._claim_batch($2, array[r.queue_name], array[r.workflow_name || '@' || r.workflow_version], 1, $3) c
      where r.run_id = $1 and c.run_id is not null`,
    [runId, workerId, leaseMs],
  );
  const claimed = result.rows[0];
  if (result.rows.length !== 1 || claimed?.run_id !== runId) {
    throw new Error(`claimRun: expected to claim ${runId}, claimed ${JSON.stringify(result.rows.map((r) => r.run_id))}`);
  }
  return claimed;
}
