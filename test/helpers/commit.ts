import pg from 'pg';
import { runHelpers, type Queryable, type SqlDb } from './runs.js';

export interface BatchResultRow {
  item: number;
  code: string | null;
  message: string | null;
  run_status: string | null;
}

/** The step fields of a batch item: a SUCCEEDED 'step' at its first attempt, started now (0 ms ago), no charge. */
export function stepItem(
  runId: string,
  token: number,
  stepSeq: number,
  name: string,
  extra: Record<string, unknown> = {},
): Record<string, unknown> {
  return {
    run_id: runId,
    token,
    seq: stepSeq,
    name,
    kind: 'step',
    status: 'SUCCEEDED',
    attempts: 1,
    started_ms_ago: 0,
    charge: 0,
    ...extra,
  };
}

/** The group commit (runledger._commit_batch) and its two paths for a completion (sql/0005_steps_and_commit.sql), in plain SQL. */
export function commitHelpers(db: SqlDb) {
  const { getRun, events } = runHelpers(db);

  /** runledger._commit_batch over a JSON array of items (plain objects here). */
  async function commitBatch(items: unknown[], on: Queryable = db.pool): Promise<BatchResultRow[]> {
    const result = await on.query('select item, code, message, run_status from runledger._commit_batch($1::jsonb)', [
      JSON.stringify(items),
    ]);
    return result.rows;
  }

  /**
   * One batch in its own transaction on a connection of its own, with how often each of
   * `functions` (runledger functions, by name) ran inside it (track_functions, read before
   * the commit while the transaction's counts are still its own).
   */
  async function commitBatchCounting(
    items: unknown[],
    functions: string[],
  ): Promise<{ rows: BatchResultRow[]; calls: Record<string, number> }> {
    if (db.url === undefined) throw new Error('commitBatchCounting commits on a connection of its own: not in a test transaction');
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await client.query(`set track_functions = 'pl'`);
      await client.query('begin');
      const rows = await commitBatch(items, client);
      const counted = await client.query<{ proname: string; n: number }>(
        `select p.proname, coalesce(pg_stat_get_xact_function_calls(p.oid), 0)::int as n
           from pg_proc p where p.pronamespace = 'runledger'::regnamespace and p.proname = any($1) order by 1`,
        [functions],
      );
      await client.query('commit');
      return { rows, calls: Object.fromEntries(counted.rows.map((row) => [row.proname, row.n])) };
    } finally {
      await client.end();
    }
  }

  async function stepRows(runId: string): Promise<Array<Record<string, any>>> {
    const result = await db.pool.query(
      `select seq, name, kind, status, output, error, attempts, fencing_token::int as fencing_token, output_hash
         from runledger.steps where run_id = $1 order by seq`,
      [runId],
    );
    return result.rows;
  }

  /** Everything a failed commit must not have touched: the run row, its steps and its events. */
  async function snapshot(runId: string): Promise<{ run: Record<string, any> | undefined; steps: unknown[]; events: unknown[] }> {
    return { run: await getRun(runId), steps: await stepRows(runId), events: await events(runId) };
  }

  /**
   * Completes a run with its last step as a worker does: a group commit of one complete item
   * (runledger._commit_batch) in `client`, and says which path wrote it: the fast part
   * (_commit_fast) or the general path (_complete_with_checkpoint), counted with
   * track_functions, per transaction. An item that failed rejects with its SQLSTATE (`code`).
   *
   * The call commits, in a transaction of its own; on a client already inside one (a test's
   * transaction, test/helpers/test-tx.ts) it runs under a savepoint instead, and the calls
   * are those the transaction's count gained.
   */
  async function completeWithCheckpoint(
    client: pg.ClientBase,
    args: {
      runId: string;
      token: number;
      seq: number;
      name: string;
      charge?: number;
      stepOutput?: unknown;
      output?: unknown;
      attempts?: number;
      startedMsAgo?: number;
      status?: string;
    },
  ): Promise<'fast' | 'general'> {
    const inTransaction = client.getTransactionStatus() === 'T';
    const generalPathCalls = async () =>
      (
        await client.query(
          `select coalesce(pg_stat_get_xact_function_calls(
                    'runledger._complete_with_checkpoint(text, bigint, int, text, text, text, jsonb, jsonb, int, bigint, jsonb, jsonb, text, jsonb)'::regprocedure), 0)::int as n`,
        )
      ).rows[0].n as number;
    const item = {
      op: 'complete',
      ...stepItem(args.runId, args.token, args.seq, args.name, {
        status: args.status ?? 'SUCCEEDED',
        attempts: args.attempts ?? 1,
        started_ms_ago: args.startedMsAgo ?? 0,
        charge: args.charge ?? null,
      }),
      ...(args.stepOutput === undefined ? {} : { step_output: args.stepOutput }),
      ...(args.output === undefined ? {} : { output: args.output }),
      policy_version: 'p/1',
    };
    await client.query(`set track_functions = 'pl'`);
    await client.query(inTransaction ? 'savepoint complete_with_checkpoint' : 'begin');
    try {
      const before = inTransaction ? await generalPathCalls() : 0;
      const [row] = await commitBatch([item], client);
      if (row?.code) throw Object.assign(new Error(row.message ?? row.code), { code: row.code });
      const calls = (await generalPathCalls()) - before;
      await client.query(inTransaction ? 'release savepoint complete_with_checkpoint' : 'commit');
      return calls === 0 ? 'fast' : 'general';
    } catch (error) {
      await client.query(inTransaction ? 'rollback to savepoint complete_with_checkpoint' : 'rollback');
      if (inTransaction) await client.query('release savepoint complete_with_checkpoint');
      throw error;
    }
  }

  async function completedEvents(runId: string): Promise<Array<{ kind: string; detail: any }>> {
    return (await events(runId)).filter((e) => e.kind === 'completed');
  }

  return { commitBatch, commitBatchCounting, stepRows, snapshot, completeWithCheckpoint, completedEvents };
}
