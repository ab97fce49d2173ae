/**
 * engine.migrate(): idempotent, safe to run from many processes at once, refuses a
 * database that carries a breaking migration newer than the code, and one whose applied
 * migrations differ from the code's files (checksums).
 */
import { createHash } from 'node:crypto';
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import pg from 'pg';
import { ulid } from 'ulid';
import { createEngine, type Engine } from '../src/engine/index.js';
import { loadMigrations } from '../src/engine/db/migrate.js';
import { MigrationMismatchError, RunledgerError, SchemaTooNewError } from '../src/engine/core/errors.js';
import { withDatabase } from './setup/global-setup.js';

const SQL_DIR = fileURLToPath(new URL('../sql/', import.meta.url));
const FILES = readdirSync(SQL_DIR)
  .filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f))
  .sort()
  .map((f) => f.replace(/\.sql$/, ''));

const databases: string[] = [];
const engines: Engine[] = [];
const poolsToEnd: pg.Pool[] = [];

async function admin<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: inject('adminUrl') });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/** A fresh, empty database (no runledger, no graphile_worker) on the suite's server. */
async function emptyDatabase(): Promise<{ url: string; pool: pg.Pool }> {
  const name = `rl_migrate_${ulid().toLowerCase()}`;
  await admin((client) => client.query(`create database ${name}`));
  databases.push(name);
  const url = withDatabase(inject('adminUrl'), name);
  const pool = new pg.Pool({ connectionString: url, max: 3 });
  pool.on('error', () => {});
  poolsToEnd.push(pool);
  return { url, pool };
}

function engineFor(url: string): Engine {
  const engine = createEngine({ connectionString: url, log: () => {} });
  engines.push(engine);
  return engine;
}

async function migrations(pool: pg.Pool): Promise<Array<{ version: number; name: string; breaking: boolean }>> {
  return (await pool.query('select version, name, breaking from runledger.migrations order by version, name')).rows;
}

/** True when nobody holds the migrator's advisory lock (it must be released even after a refusal). */
async function migrateLockIsFree(pool: pg.Pool): Promise<boolean> {
  const client = await pool.connect();
  try {
    const got = (await client.query(`select pg_try_advisory_lock(hashtext('runledger.migrate')) as got`)).rows[0].got as boolean;
    if (got) await client.query(`select pg_advisory_unlock(hashtext('runledger.migrate'))`);
    return got;
  } finally {
    client.release();
  }
}

afterAll(async () => {
  await Promise.allSettled(engines.map((e) => e.close()));
  await Promise.allSettled(poolsToEnd.map((p) => p.end()));
  await admin(async (client) => {
    for (const name of databases) await client.query(`drop database if exists ${name} with (force)`);
  });
});

describe('engine.migrate()', () => {
  let url: string;
  let pool: pg.Pool;

  beforeAll(async () => {
    ({ url, pool } = await emptyDatabase());
  });

  it('run by 5 engines at once on an empty database: all succeed and each migration is applied exactly once', async () => {
    expect(FILES.length).toBeGreaterThan(0);
    const before = await pool.query(`select count(*)::int as n from pg_namespace where nspname in ('runledger', 'graphile_worker')`);
    expect(before.rows[0].n).toBe(0);

    const concurrent = Array.from({ length: 5 }, () => engineFor(url));
    const results = await Promise.allSettled(concurrent.map((engine) => engine.migrate()));
    const failures = results.filter((r) => r.status === 'rejected').map((r) => String((r as PromiseRejectedResult).reason));
    expect(failures, failures.join('\n')).toEqual([]);

    const applied = results.flatMap((r) => (r as PromiseFulfilledResult<{ applied: string[] }>).value.applied);
    expect([...applied].sort()).toEqual(FILES);
    // One engine did all the work, in order; the others found nothing left to do.
    const workers = results.map((r) => (r as PromiseFulfilledResult<{ applied: string[] }>).value.applied);
    expect(workers.filter((a) => a.length > 0)).toEqual([FILES]);

    // The 0.2.0 baseline has no breaking migration (nothing older runs against it); the flag is
    // read from a file's first line (the test below) and recorded with each file.
    expect(await migrations(pool)).toEqual(FILES.map((name) => ({ version: Number(name.slice(0, 4)), name, breaking: false })));
    const dup = await pool.query('select name, count(*)::int as n from runledger.migrations group by name having count(*) > 1');
    expect(dup.rows).toEqual([]);
    // graphile-worker's schema is installed too (it fires cron schedules).
    const graphile = await pool.query(`select to_regclass('graphile_worker.jobs') is not null as present`);
    expect(graphile.rows[0].present).toBe(true);
    expect(await migrateLockIsFree(pool)).toBe(true);
  });

  it('applies nothing when run again', async () => {
    const before = await migrations(pool);
    await expect(engineFor(url).migrate()).resolves.toEqual({ applied: [] });
    await expect(engineFor(url).migrate()).resolves.toEqual({ applied: [] });
    expect(await migrations(pool)).toEqual(before);
  });

  it('reads the breaking flag from a file whose first line is `-- breaking: <why>`', () => {
    const dir = mkdtempSync(join(tmpdir(), 'runledger-migrations-'));
    try {
      writeFileSync(join(dir, '0001_base.sql'), '-- 0001_base: tables.\nselect 1;\n');
      writeFileSync(join(dir, '0002_change.sql'), '-- breaking: older builds misread the new column\nselect 1;\n');
      writeFileSync(join(dir, '0003_note.sql'), '-- 0003_note: says -- breaking on a later line only\n-- breaking: no\nselect 1;\n');
      expect(loadMigrations(dir).map((m) => [m.name, m.breaking])).toEqual([
        ['0001_base', false],
        ['0002_change', true],
        ['0003_note', false],
      ]);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });

  it('tolerates a newer non-breaking migration it does not know', async () => {
    await pool.query(`insert into runledger.migrations (version, name, breaking) values (9998, '9998_future_additive', false)`);
    try {
      await expect(engineFor(url).migrate()).resolves.toEqual({ applied: [] });
      expect((await migrations(pool)).map((m) => m.name)).toEqual([...FILES, '9998_future_additive']);
    } finally {
      await pool.query('delete from runledger.migrations where version = 9998');
    }
  });

  it('rejects with SCHEMA_TOO_NEW when the database has a breaking migration newer than the code, and releases its lock', async () => {
    await pool.query(`insert into runledger.migrations (version, name, breaking) values (9999, '9999_future', true)`);
    try {
      const error = await engineFor(url)
        .migrate()
        .then(
          () => undefined,
          (e: unknown) => e,
        );
      expect(error).toBeInstanceOf(SchemaTooNewError);
      expect(error).toBeInstanceOf(RunledgerError);
      expect(error).toMatchObject({ code: 'SCHEMA_TOO_NEW' });
      expect((error as Error).message).toContain('9999_future');
      // Nothing was changed, and the next migrator is not blocked.
      expect((await migrations(pool)).map((m) => m.name)).toEqual([...FILES, '9999_future']);
      expect(await migrateLockIsFree(pool)).toBe(true);
    } finally {
      await pool.query('delete from runledger.migrations where version = 9999');
    }
    await expect(engineFor(url).migrate()).resolves.toEqual({ applied: [] });
  });
});

function sha256(file: string): string {
  return createHash('sha256')
    .update(readFileSync(`${SQL_DIR}/${file}.sql`, 'utf8'), 'utf8')
    .digest('hex');
}

async function refusal(url: string): Promise<unknown> {
  return engineFor(url)
    .migrate()
    .then(
      () => undefined,
      (e: unknown) => e,
    );
}

describe('engine.migrate() and the checksums of applied migrations', () => {
  let url: string;
  let pool: pg.Pool;
  const last = FILES.at(-1)!;
  const lastVersion = Number(last.slice(0, 4));

  beforeAll(async () => {
    ({ url, pool } = await emptyDatabase());
    await engineFor(url).migrate();
  });

  it('records the sha256 of each file it applies', async () => {
    const rows = (await pool.query('select name, checksum from runledger.migrations order by version')).rows;
    expect(rows).toEqual(FILES.map((name) => ({ name, checksum: sha256(name) })));
  });

  it('records the checksum of a migration applied without one (psql -f) and applies nothing', async () => {
    await pool.query(`update runledger.migrations set checksum = null where name = '0002_runs'`);
    await expect(engineFor(url).migrate()).resolves.toEqual({ applied: [] });
    const row = (await pool.query(`select checksum from runledger.migrations where name = '0002_runs'`)).rows[0];
    expect(row.checksum).toBe(sha256('0002_runs'));
  });

  it('refuses with MIGRATION_MISMATCH when an applied migration differs from the file, applies nothing, and releases its lock', async () => {
    // A tampered checksum, and a missing last migration that migrate would otherwise apply.
    await pool.query(`update runledger.migrations set checksum = repeat('0', 64) where name = '0002_runs'`);
    await pool.query('delete from runledger.migrations where version = $1', [lastVersion]);
    const error = await refusal(url);
    expect(error).toBeInstanceOf(MigrationMismatchError);
    expect(error).toBeInstanceOf(RunledgerError);
    expect(error).toMatchObject({ code: 'MIGRATION_MISMATCH' });
    const message = (error as Error).message;
    expect(message).toContain('0002_runs');
    expect(message).toContain('different build of runledger');
    expect(message).toMatch(/recreate the database/);
    expect(message).not.toContain('0003_');
    // Nothing applied: the last migration is still missing.
    expect((await migrations(pool)).map((m) => m.name)).toEqual(FILES.slice(0, -1));
    expect(await migrateLockIsFree(pool)).toBe(true);
    await pool.query(`update runledger.migrations set checksum = $1 where name = '0002_runs'`, [sha256('0002_runs')]);
    await pool.query('insert into runledger.migrations (version, name, checksum) values ($1, $2, $3)', [lastVersion, last, sha256(last)]);
    await expect(engineFor(url).migrate()).resolves.toEqual({ applied: [] });
  });

  it('refuses a migration of the same number under another name', async () => {
    await pool.query(`update runledger.migrations set name = '0003_something_else' where version = 3`);
    try {
      const error = await refusal(url);
      expect(error).toMatchObject({ code: 'MIGRATION_MISMATCH' });
      expect((error as Error).message).toContain('0003_something_else');
    } finally {
      await pool.query(`update runledger.migrations set name = $1 where version = 3`, [FILES[2]]);
    }
  });

  it('refuses a database migrated by a build from before checksums (no checksum column), naming every file', async () => {
    await pool.query('alter table runledger.migrations drop column checksum');
    const error = await refusal(url);
    expect(error).toMatchObject({ code: 'MIGRATION_MISMATCH' });
    for (const name of FILES) expect((error as Error).message).toContain(name);
    expect(await migrateLockIsFree(pool)).toBe(true);
  });
});
