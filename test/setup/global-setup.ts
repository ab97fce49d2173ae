import pg from 'pg';
import type { TestProject } from 'vitest/node';
import { createEngine } from '../../src/engine/index.js';
import { startEmbeddedPostgres, type EmbeddedPostgres } from '../../src/dev/index.js';

declare module 'vitest' {
  export interface ProvidedContext {
    /** URL of a maintenance database on the server the suite uses. */
    adminUrl: string;
    /** Migrated template every test file clones. */
    templateDatabase: string;
  }
}

let embedded: EmbeddedPostgres | undefined;
let adminUrl: string;
let templateDatabase: string;

/**
 * DATABASE_URL set: the suite uses that server. Unset: an embedded PostgreSQL in a
 * throw-away folder. Either way one migrated template database is built here with
 * the real migrator, and each test file clones it.
 */
export async function setup(project: TestProject): Promise<void> {
  if (process.env.DATABASE_URL) {
    adminUrl = process.env.DATABASE_URL;
  } else {
    embedded = await startEmbeddedPostgres({ dataDir: `.runledger/test-pg-${process.pid}`, ephemeral: true });
    adminUrl = embedded.connectionString;
  }
  templateDatabase = `runledger_template_${process.pid}`;
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${templateDatabase}`);
    await admin.query(`create database ${templateDatabase}`);
  } finally {
    await admin.end();
  }
  const engine = createEngine({ connectionString: withDatabase(adminUrl, templateDatabase) });
  try {
    await engine.migrate();
  } finally {
    await engine.close();
  }
  project.provide('adminUrl', adminUrl);
  project.provide('templateDatabase', templateDatabase);
}

export async function teardown(): Promise<void> {
  const admin = new pg.Client({ connectionString: adminUrl });
  await admin.connect();
  try {
    await admin.query(`drop database if exists ${templateDatabase} with (force)`);
  } finally {
    await admin.end();
  }
  await embedded?.stop();
}

export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}
