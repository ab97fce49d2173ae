import type { Queryable, SqlDb } from './runs.js';

/** runledger._checkpoint of a 'step', as the worker writes one. */
export function checkpointHelpers(db: SqlDb) {
  async function checkpoint(
    runId: string,
    token: number,
    stepSeq: number,
    name: string,
    options: { status?: 'SUCCEEDED' | 'FAILED'; output?: unknown; error?: unknown; on?: Queryable } = {},
  ): Promise<number> {
    const result = await (options.on ?? db.pool).query(
      `select pid from runledger._checkpoint($1, $2, $3, $4, 'step', $5, $6::jsonb, $7::jsonb, 1, 0)`,
      [
        runId,
        token,
        stepSeq,
        name,
        options.status ?? 'SUCCEEDED',
        options.output === undefined ? null : JSON.stringify(options.output),
        options.error === undefined ? null : JSON.stringify(options.error),
      ],
    );
    return result.rows[0].pid;
  }
  return { checkpoint };
}
