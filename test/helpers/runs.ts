import type pg from 'pg';
import type { TestDatabase } from './database.js';

/** A pool or a dedicated session (one whose runledger.fake_now is the clock of the statement). */
export type Queryable = Pick<pg.Pool, 'query'> | pg.Client;

export const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;

let seq = 0;

/** An id no other run of this test file has (run ids and queue names alike). */
export function newRunId(label: string): string {
  seq += 1;
  return `${label}-${seq}`;
}

/** Runs started with runledger.start_run and read back from the tables, in plain SQL. */
export function runHelpers(db: TestDatabase) {
  async function startRun(
    options: Record<string, unknown> = {},
    input: unknown = { n: 1 },
    on: Queryable = db.pool,
    workflow = 'w',
  ): Promise<string> {
    const result = await on.query('select runledger.start_run($1, $2::jsonb, $3::jsonb) as run_id', [
      workflow,
      JSON.stringify(input),
      JSON.stringify(options),
    ]);
    return result.rows[0].run_id;
  }

  async function getRun(runId: string): Promise<Record<string, any> | undefined> {
    const result = await db.pool.query(`select *, fencing_token::int as fencing_token from runledger.runs where run_id = $1`, [runId]);
    return result.rows[0];
  }

  async function steps(runId: string): Promise<Array<{ seq: number; name: string; status: string; fencing_token: number }>> {
    const result = await db.pool.query(
      `select seq, name, status, fencing_token::int as fencing_token from runledger.steps where run_id = $1 order by seq`,
      [runId],
    );
    return result.rows;
  }

  async function events(runId: string): Promise<Array<{ kind: string; detail: any }>> {
    const result = await db.pool.query(`select kind, detail from runledger.events where run_id = $1 order by event_id`, [runId]);
    return result.rows;
  }

  async function countRuns(): Promise<number> {
    return (await db.pool.query('select count(*)::int as n from runledger.runs')).rows[0].n;
  }

  return { startRun, getRun, steps, events, countRuns };
}

/** The workflow the SQL tests start their runs of (w@1 in queue 'default', 3 recovery attempts). */
export async function registerWorkflowW(db: TestDatabase): Promise<void> {
  await db.pool.query(`select runledger._register_workflow('w', '1', 'default', 3)`);
}
