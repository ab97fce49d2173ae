import { Kysely, PostgresDialect, type Transaction } from 'kysely';
import type pg from 'pg';

/**
 * A transaction on one connection checked out of the pool, where the last statement and
 * the COMMIT travel together: `finish(sql)` sends `sql; commit` as one simple query, so a
 * transaction step costs BEGIN, the user's statements, and one round trip for its
 * checkpoint and commit (Kysely's own transaction() would send the COMMIT separately).
 * The user's code gets a real Kysely Transaction on that connection.
 */
export interface OwnTransaction<DB> {
  readonly trx: Transaction<DB>;
  /** Quotes a value as an SQL literal (for finish's statement, which cannot take parameters). */
  literal(value: string): string;
  /** Runs `statement` then COMMIT, in one round trip; returns the statement's rows. On error nothing is committed. */
  finish<R>(statement: string): Promise<R[]>;
}

/** One Kysely per pooled connection, reused: it only adapts that connection for Kysely, and never releases it. */
const kyselyOf = new WeakMap<pg.PoolClient, Kysely<any>>();

function kyselyOn(client: pg.PoolClient): Kysely<any> {
  let kysely = kyselyOf.get(client);
  if (!kysely) {
    const adapter = { query: (text: string, values: unknown[]) => client.query(text, values), release: () => {} };
    kysely = new Kysely<any>({ dialect: new PostgresDialect({ pool: { connect: async () => adapter as never, end: async () => {} } }) });
    kyselyOf.set(client, kysely);
  }
  return kysely;
}

/**
 * Runs body in a transaction of its own connection. body ends it with finish(); if body
 * throws, or returns without finishing, the transaction is rolled back. The connection
 * goes back to the pool, or is destroyed if its state is unknown.
 */
export async function inOwnTransaction<DB, T>(pool: pg.Pool, body: (tx: OwnTransaction<DB>) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let finished = false;
  let broken = false;
  try {
    const trx = (await kyselyOn(client).startTransaction().execute()) as unknown as Transaction<DB>;
    const result = await body({
      trx,
      literal: (value) => client.escapeLiteral(value),
      async finish<R>(statement: string): Promise<R[]> {
        finished = true; // from here the COMMIT may have happened
        const results = (await client.query(`${statement}; commit`)) as unknown as pg.QueryResult[];
        return (results[0]?.rows ?? []) as R[];
      },
    });
    if (!finished) await client.query('rollback');
    return result;
  } catch (error) {
    await client.query('rollback').catch(() => (broken = true));
    throw error;
  } finally {
    client.release(broken || undefined);
  }
}
