/**
 * npm run schema:snapshot: migrates a fresh database with sql/NNNN_*.sql and writes
 * sql/schema.snapshot.sql, the net definition of every object in schema runledger.
 * With DATABASE_URL set it creates (and drops) a throw-away database on that server;
 * otherwise it starts an embedded PostgreSQL in a temporary folder.
 */
import { writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { ulid } from 'ulid';
import { createEngine } from '../../src/engine/index.js';
import { startEmbeddedPostgres } from '../../src/dev/embedded-postgres.js';
import { withDatabase } from '../setup/global-setup.js';
import { schemaSnapshot } from './snapshot.js';

export const SNAPSHOT_FILE = fileURLToPath(new URL('../../sql/schema.snapshot.sql', import.meta.url));

export const SNAPSHOT_HEADER = [
  '-- GENERATED FILE, do not edit. The net schema `runledger` after every migration in',
  '-- sql/NNNN_*.sql, read from the catalog (test/schema/snapshot.ts). Regenerate with',
  '--   npm run schema:snapshot',
  '-- and commit it with the migration that changes it; test/schema-snapshot.test.ts fails',
  '-- while it differs from a freshly migrated database.',
  '',
].join('\n');

/** The snapshot file's full text for a migrated database. */
export async function snapshotFileText(client: pg.ClientBase): Promise<string> {
  return `${SNAPSHOT_HEADER}\n${await schemaSnapshot(client)}`;
}

async function main(): Promise<void> {
  let adminUrl = process.env.DATABASE_URL;
  let stopEmbedded: (() => Promise<void>) | undefined;
  if (!adminUrl) {
    // Under .runledger/ like the test suite's server: as root, the server runs as the
    // postgres user, which cannot enter a private mkdtemp folder.
    const embedded = await startEmbeddedPostgres({ dataDir: `.runledger/snapshot-pg-${process.pid}`, ephemeral: true });
    adminUrl = embedded.connectionString;
    stopEmbedded = () => embedded.stop();
  }
  const database = `rl_snapshot_${ulid().toLowerCase()}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`create database ${database}`);
    try {
      const url = withDatabase(adminUrl, database);
      const engine = createEngine({ connectionString: url, log: () => {} });
      try {
        await engine.migrate();
      } finally {
        await engine.close();
      }
      const client = new pg.Client({ connectionString: url });
      await client.connect();
      try {
        writeFileSync(SNAPSHOT_FILE, await snapshotFileText(client));
      } finally {
        await client.end();
      }
    } finally {
      await admin.query(`drop database if exists ${database} with (force)`);
    }
  } finally {
    await admin.end();
    await stopEmbedded?.();
  }
  console.log(`wrote ${SNAPSHOT_FILE}`);
}

if (process.argv[1] && fileURLToPath(import.meta.url) === process.argv[1]) {
  main().catch((error: unknown) => {
    console.error(error);
    process.exitCode = 1;
  });
}
