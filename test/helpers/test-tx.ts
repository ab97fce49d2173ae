/**
 * Rollback-per-test SQL, after River's TestTx: a test gets `tx`, a connection to one
 * migrated database the whole run shares (the global setup's `sharedDatabaseUrl`), inside a
 * transaction that is rolled back when the test ends, pass or fail. Nothing a test writes is
 * seen by the next one or by a file running beside it, so a file of SQL-level tests needs no
 * database of its own (no clone from the template, no engine) and its tests may run in any
 * order.
 *
 *     import { txTest as it } from '../helpers/test-tx.js';
 *
 *     it('start_run stores a run', async ({ tx }) => {
 *       await tx.query(`select runledger.start_run('w', '{}')`);
 *       ...
 *     });
 *
 * What fits: a SQL function or a few statements checked on one connection. What does not: an
 * engine or a worker (they open connections of their own and cannot see the uncommitted
 * rows), several sessions racing, LISTEN/NOTIFY (delivered at commit), or anything that must
 * commit. Inside the transaction `now()` stands still at its start; move runledger.now()
 * with `set local runledger.fake_now` (the shared database has the test clock on).
 *
 * Files run side by side on the shared database: a row two open transactions both write (the
 * same workflow registered, the same queue set) makes the second wait until the first test
 * ends. Name what a file registers after the file (test-tx.test.ts registers `test-tx-probe`).
 *
 * A statement that fails aborts the transaction: wrap a call that is meant to fail in
 * `inSavepoint(tx, ...)`, which rolls back to before it and rethrows its error. A test that
 * commits or rolls back `tx` itself fails, since what it committed would stay behind.
 * Settings made with `set` inside the transaction go with its rollback; advisory locks the
 * test took at session level are released before the connection is reused.
 */
import pg from 'pg';
import { inject, test } from 'vitest';

export interface TestTxFixtures {
  /** A connection inside BEGIN on the shared database; rolled back after the test. */
  tx: pg.PoolClient;
}

interface FileFixtures {
  sharedPool: pg.Pool;
}

/** `it` with a `tx` fixture: `txTest('...', async ({ tx }) => ...)`. */
export const txTest = test.extend<TestTxFixtures & FileFixtures>({
  // One small pool per test file; a test holds one connection at a time.
  sharedPool: [
    // eslint-disable-next-line no-empty-pattern
    async ({}, use) => {
      const pool = new pg.Pool({ connectionString: inject('sharedDatabaseUrl'), max: 2 });
      pool.on('error', () => {}); // an idle connection the server closed must not crash the file
      await use(pool);
      await pool.end();
    },
    { scope: 'file' },
  ],
  tx: async ({ sharedPool }, use) => {
    const client = await sharedPool.connect();
    let status: string;
    try {
      await client.query('begin');
      await use(client);
      status = client.getTransactionStatus() ?? 'I';
    } finally {
      await rollBackAndRelease(client);
    }
    if (status === 'I') {
      throw new Error('test-tx: the test ended its own transaction (commit or rollback); its writes may stay in the shared database');
    }
  },
});

async function rollBackAndRelease(client: pg.PoolClient): Promise<void> {
  try {
    await client.query('rollback');
    await client.query('select pg_advisory_unlock_all()');
    client.release();
  } catch (error) {
    client.release(true); // a connection that cannot roll back is not reused
    throw error;
  }
}

/**
 * Runs `fn` inside a savepoint of `tx`: on success the savepoint is released, on an error
 * the transaction goes back to where it was and the error is rethrown, so the test can go on
 * using `tx` after a statement that was meant to fail.
 */
export async function inSavepoint<T>(tx: pg.ClientBase, fn: () => Promise<T>): Promise<T> {
  await tx.query('savepoint test_tx');
  try {
    const result = await fn();
    await tx.query('release savepoint test_tx');
    return result;
  } catch (error) {
    await tx.query('rollback to savepoint test_tx');
    await tx.query('release savepoint test_tx');
    throw error;
  }
}
