import { createHash } from 'node:crypto';
import pg from 'pg';
import { ulid } from 'ulid';
import { ConfigError } from '../engine/core/errors.js';
import { loadMigrations } from '../engine/db/migrate.js';
import { createEngine } from '../engine/index.js';

export interface TestDatabaseOptions {
  /** A URL on the server where test databases are created (a maintenance database); default DATABASE_URL. */
  adminUrl?: string;
  /**
   * The migrated template to clone. Default: `runledger_template_<hash>`, built once per
   * version of runledger's SQL (the hash of the migration files) and kept for later runs,
   * so a test database costs a file copy, not a migration.
   */
  template?: string;
}

export interface TestDatabase {
  name: string;
  url: string;
  /** A small pool on the test database, for fixtures and assertions. */
  pool: pg.Pool;
  /** Drops the database (with force: a connection left open does not keep it alive). */
  drop(): Promise<void>;
}

/** `url` with its database replaced. */
export function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
}

/** The default template's name: it changes whenever a migration file does. */
export function templateName(): string {
  const hash = createHash('sha256');
  for (const migration of loadMigrations()) hash.update(`${migration.name}\n${migration.text}\n`);
  return `runledger_template_${hash.digest('hex').slice(0, 12)}`;
}

function adminUrlFrom(options: TestDatabaseOptions): string {
  const url = options.adminUrl ?? process.env.DATABASE_URL;
  if (!url)
    throw new ConfigError('createTestDatabase: pass adminUrl or set DATABASE_URL (a URL of the server that will hold the test databases)');
  return url;
}

async function withAdmin<T>(adminUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * Makes sure the migrated template exists and returns its name. Concurrent callers (test
 * files in parallel processes) wait for each other on an advisory lock; the template is
 * built under a temporary name and renamed, so no one clones a half-migrated database.
 */
export async function ensureTestTemplate(options: TestDatabaseOptions = {}): Promise<string> {
  const adminUrl = adminUrlFrom(options);
  const template = options.template ?? templateName();
  await withAdmin(adminUrl, async (admin) => {
    await admin.query(`select pg_advisory_lock(hashtext('runledger.test-template'))`);
    try {
      const exists = await admin.query('select 1 from pg_database where datname = $1', [template]);
      if (exists.rowCount) return;
      const building = `${template}_building_${process.pid}`;
      await admin.query(`drop database if exists ${building}`);
      await admin.query(`create database ${building}`);
      const engine = createEngine({ connectionString: withDatabase(adminUrl, building), log: () => {} });
      try {
        await engine.migrate();
        // A test database honours the test clock (runledger.fake_now, runledger.clock_offset):
        // the owner's switch, which a deployment leaves off (docs/testing.md).
        await engine.pool.query('update runledger.owner_settings set test_clock = true');
      } finally {
        await engine.close();
      }
      await admin.query(`alter database ${building} rename to ${template}`);
    } finally {
      await admin.query(`select pg_advisory_unlock(hashtext('runledger.test-template'))`);
    }
  });
  return template;
}

/**
 * A fresh, migrated database for one test file (or test): a clone of the template, with the
 * test clock switched on (runledger.owner_settings.test_clock), so runledger.now() follows
 * the settings runledger.fake_now and runledger.clock_offset (createTestClock).
 */
export async function createTestDatabase(options: TestDatabaseOptions = {}): Promise<TestDatabase> {
  const adminUrl = adminUrlFrom(options);
  const template = options.template ?? (await ensureTestTemplate(options));
  const name = `t_${ulid().toLowerCase()}`;
  await withAdmin(adminUrl, (admin) => admin.query(`create database ${name} template ${template}`));
  const url = withDatabase(adminUrl, name);
  const pool = new pg.Pool({ connectionString: url, max: 5 });
  pool.on('error', () => {}); // a connection ended by drop() must not crash the process
  return {
    name,
    url,
    pool,
    async drop() {
      await pool.end();
      await withAdmin(adminUrl, (admin) => admin.query(`drop database if exists ${name} with (force)`));
    },
  };
}
