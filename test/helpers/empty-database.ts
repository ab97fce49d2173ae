import pg from 'pg';
import { ulid } from 'ulid';
import { inject } from 'vitest';
import { withDatabase } from '../setup/global-setup.js';

/**
 * A new, empty database on the suite's server for one test of a migration (migrated by
 * hand, up to the version under test), dropped afterwards.
 */
export async function withEmptyDatabase(prefix: string, use: (client: pg.Client) => Promise<void>): Promise<void> {
  const adminUrl = inject('adminUrl');
  const name = `${prefix}_${ulid().toLowerCase()}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  await admin.query(`create database ${name}`);
  const client = new pg.Client({ connectionString: withDatabase(adminUrl, name) });
  try {
    await client.connect();
    await use(client);
  } finally {
    await client.end().catch(() => {});
    await admin.query(`drop database if exists ${name} with (force)`);
    await admin.end();
  }
}

/** One migration's text in its own transaction, as migrate() applies it. */
export async function runMigration(client: pg.Client, text: string): Promise<void> {
  await client.query('begin');
  try {
    await client.query(text);
    await client.query('commit');
  } catch (error) {
    await client.query('rollback');
    throw error;
  }
}
