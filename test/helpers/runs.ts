import type pg from 'pg';
import type { TestDatabase } from './database.js';

/** A pool or a dedicated session (one whose runledger.fake_now is the clock of the statement). */
export type Queryable = Pick<pg.Pool, 'query'> | pg.ClientBase;

/**
 * What the SQL helpers work on: a test database (its pool, and its url for sessions of their
 * own), or a test's transaction (test/helpers/test-tx.ts) given as `{ pool: tx }`. A
 * transaction has no url, and no other session sees what it wrote: claimRun then makes sure
 * the run is the only one the claim could take instead of locking the others from a second
 * session, commitBatchCounting refuses it, and notifyHelpers takes a test database only.
 */
export type SqlDb = TestDatabase | TxDb;

/** A test's transaction as the SQL helpers take it: `{ pool: tx }`. */
export interface TxDb {
  pool: pg.PoolClient;
  url?: undefined;
}

export const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;

let seq = 0;

/** An id no other run of this test file has (run ids and queue names alike). */
export function newRunId(label: string): string {
  seq += 1;
  return `${label}-${seq}`;
}

/**
 * Runs started with runledger.start_run and read back from the tables, in plain SQL.
 * `defaults.workflow`: what startRun starts when not told ('w'; a file on the shared
 * database starts a workflow named after itself, test/helpers/test-tx.ts).
 */
export function runHelpers(db: SqlDb, defaults: { workflow?: string } = {}) {
  async function startRun(
    options: Record<string, unknown> = {},
    input: unknown = { n: 1 },
    on: Queryable = db.pool,
    workflow = defaults.workflow ?? 'w',
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
  await registerWorkflow(db.pool, 'w');
}

/** Registers `name`@1 in queue 'default' with 3 recovery attempts, as registerWorkflowW does w. */
export async function registerWorkflow(on: Queryable, name: string): Promise<void> {
  await on.query(`select runledger._register_workflow($1, '1', 'default', 3)`, [name]);
}
