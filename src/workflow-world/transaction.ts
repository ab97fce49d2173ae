import type pg from 'pg';

/**
 * Runs body in a transaction on a connection of its own: committed when body returns, rolled
 * back when it throws. A connection whose rollback failed is destroyed, not returned to the pool.
 */
export async function inTransaction<T>(pool: pg.Pool, body: (tx: pg.PoolClient) => Promise<T>): Promise<T> {
  const client = await pool.connect();
  let broken = false;
  try {
    await client.query('begin');
    const result = await body(client);
    await client.query('commit');
    return result;
  } catch (error) {
    await client.query('rollback').catch(() => {
      broken = true;
    });
    throw error;
  } finally {
    client.release(broken);
  }
}
