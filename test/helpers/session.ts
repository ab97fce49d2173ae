import pg from 'pg';
import type { TestDatabase } from './database.js';

/**
 * A dedicated session per call, for session settings (runledger.fake_now,
 * runledger.max_payload_bytes) that must not leak into the shared pool.
 */
export function sessionHelpers(db: TestDatabase) {
  async function session<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      return await fn(client);
    } finally {
      await client.end();
    }
  }
  return { session };
}

/** Moves the session's clock: runledger.now() honours runledger.fake_now ('' is the real clock again). */
export async function setNow(client: pg.Client, at: string): Promise<void> {
  await client.query(`select set_config('runledger.fake_now', $1, false)`, [at]);
}

/** Moves the clock of a test's transaction (test/helpers/test-tx.ts): `set local`, gone with the transaction. */
export async function setNowLocal(tx: pg.ClientBase, at: string): Promise<void> {
  await tx.query(`select set_config('runledger.fake_now', $1, true)`, [at]);
}

/** `seconds` after the ISO time `base`, as an ISO string (for setNow and for comparing stored times). */
export function at(base: string, seconds: number): string {
  return new Date(Date.parse(base) + seconds * 1000).toISOString();
}
