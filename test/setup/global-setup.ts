import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { createTestDatabase, ensureTestTemplate, withDatabase, type TestDatabase } from '../../src/testing/index.js';
import { startEmbeddedPostgres, type EmbeddedPostgres } from '../../src/dev/index.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** URL of a maintenance database on the server the suite uses. */
    adminUrl: string;
    /** Migrated template every test file clones. */
    templateDatabase: string;
    /** One migrated database every file shares for rollback-per-test SQL (test/helpers/test-tx.ts). */
    sharedDatabaseUrl: string;
  }
}

let embedded: EmbeddedPostgres | undefined;
let adminUrl: string;
let templateDatabase: string;
let shared: TestDatabase | undefined;

/**
 * DATABASE_URL set: the suite uses that server. Unset: an embedded PostgreSQL in a
 * throw-away folder. Either way one migrated template database is built here with
 * runledger/testing (the real migrator), and each test file clones it.
 */
export async function setup(project: TestProject): Promise<void> {
  if (process.env.DATABASE_URL) {
    adminUrl = process.env.DATABASE_URL;
  } else {
    embedded = await startEmbeddedPostgres({ dataDir: `.runledger/test-pg-${process.pid}`, ephemeral: true });
    adminUrl = embedded.connectionString;
  }
  // Per run, not the hash-named template runledger/testing keeps by default: CI and a
  // developer's runs never share one, and teardown drops it.
  templateDatabase = `runledger_template_${process.pid}`;
  await dropDatabase(templateDatabase);
  await ensureTestTemplate({ adminUrl, template: templateDatabase });
  // One clone for the whole run: tests through test/helpers/test-tx.ts work in a transaction
  // rolled back at their end, so they leave nothing behind for the next.
  shared = await createTestDatabase({ adminUrl, template: templateDatabase });
  project.provide('adminUrl', adminUrl);
  project.provide('templateDatabase', templateDatabase);
  project.provide('sharedDatabaseUrl', shared.url);
}

export async function teardown(): Promise<void> {
  await shared?.drop();
  await dropDatabase(templateDatabase);
  await embedded?.stop();
}

async function dropDatabase(name: string): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${name} with (force)`);
  } finally {
    await admin.end();
  }
}

export { withDatabase };
