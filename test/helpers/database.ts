import pg from 'pg';
import { inject } from 'vitest';
import { ulid } from 'ulid';
import { withDatabase } from '../setup/global-setup.js';

export interface TestDatabase {
  name: string;
  url: string;
  /** A small pool for assertions and fixtures. */
  pool: pg.Pool;
  drop(): Promise<void>;
}

/** A fresh database cloned from the migrated template; dropped (with force) by drop(). */
export async function createTestDatabase(): Promise<TestDatabase> {
  const adminUrl = inject('adminUrl');
  const template = inject('templateDatabase');
  const name = `t_${ulid().toLowerCase()}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`create database ${name} template ${template}`);
  } finally {
    await admin.end();
  }
  const url = withDatabase(adminUrl, name);
  const pool = new pg.Pool({ connectionString: url, max: 5 });
  pool.on('error', () => {});
  return {
    name,
    url,
    pool,
    async drop() {
      await pool.end();
      const client = new pg.Client({ connectionString: adminUrl });
      await client.connect();
      try {
        await client.query(`drop database if exists ${name} with (force)`);
      } finally {
        await client.end();
      }
    },
  };
}

/** Polls `check` until it returns a truthy value; fails with `what` after timeoutMs. Conditions, not sleeps. */
export async function waitFor<T>(what: string, check: () => Promise<T>, timeoutMs = 30_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (let interval = 10; ; interval = Math.min(250, interval * 2)) {
    try {
      const value = await check();
      if (value) return value as NonNullable<T>;
      last = value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${String(last)})`);
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}
