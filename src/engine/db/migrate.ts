import { createHash } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { runMigrations } from 'graphile-worker';
import { MigrationMismatchError, SchemaTooNewError } from '../core/errors.js';
import { GRAPHILE_SCHEMA, graphileLogger } from './graphile.js';

/** `sql/` ships with the package; this file sits at src/engine/db or dist/engine/db. */
const SQL_DIR = fileURLToPath(new URL('../../../sql/', import.meta.url));

export interface Migration {
  version: number;
  name: string;
  breaking: boolean;
  text: string;
  /** sha256 (hex) of text: recorded when applied, compared on every migrate(). */
  checksum: string;
}

interface AppliedMigration {
  version: number;
  name: string;
  breaking: boolean;
  /** null: applied without migrate() (psql -f). */
  checksum: string | null;
}

interface AppliedState {
  rows: AppliedMigration[];
  /** false: migrated by a build from before checksums (the column does not exist). */
  hasChecksum: boolean;
}

export function loadMigrations(dir = SQL_DIR): Migration[] {
  return readdirSync(dir)
    .filter((file) => /^\d{4}_[a-z0-9_]+\.sql$/.test(file))
    .sort()
    .map((file) => {
      const text = readFileSync(`${dir}/${file}`, 'utf8');
      return {
        version: Number(file.slice(0, 4)),
        name: file.replace(/\.sql$/, ''),
        breaking: /^-- breaking\b/.test(text),
        text,
        checksum: createHash('sha256').update(text, 'utf8').digest('hex'),
      };
    });
}

/**
 * Installs graphile-worker's schema and applies runledger's missing migrations,
 * each in its own transaction under one advisory lock, so concurrent callers
 * wait for each other instead of racing. Refuses to run when the database has a
 * breaking migration this code does not know, or when a migration it has applied
 * differs from this code's file of the same number (checksum or name): the schema
 * would differ from the one this code was built for, silently.
 */
export async function migrate(pool: pg.Pool, log: (message: string) => void = () => {}): Promise<{ applied: string[] }> {
  const migrations = loadMigrations();
  const client = await pool.connect();
  const applied: string[] = [];
  try {
    // Session lock held across graphile-worker's migration (its own connection) and ours.
    await client.query(`select pg_advisory_lock(hashtext('runledger.migrate'))`);
    try {
      await runMigrations({ pgPool: pool, schema: GRAPHILE_SCHEMA, logger: graphileLogger() });
      const { rows: known, hasChecksum } = await appliedMigrations(client);
      const newest = migrations.at(-1)?.version ?? 0;
      const unknownBreaking = known.filter((m) => m.version > newest && m.breaking);
      if (unknownBreaking.length > 0) {
        throw new SchemaTooNewError(
          `the database has runledger migration ${unknownBreaking.map((m) => m.name).join(', ')}, which is newer than this code ` +
            `(newest known: ${migrations.at(-1)?.name}); upgrade runledger before running against this database`,
        );
      }
      await checkApplied(client, migrations, { rows: known, hasChecksum }, log);
      const done = new Set(known.map((m) => m.version));
      for (const migration of migrations) {
        if (done.has(migration.version)) continue;
        await client.query('begin');
        try {
          // The file inserts its own row (so it also runs as-is with psql); its checksum and
          // breaking flag are recorded here, in the same transaction.
          await client.query(migration.text);
          await client.query(
            `insert into runledger.migrations (version, name, breaking, checksum) values ($1, $2, $3, $4)
             on conflict (version) do update set breaking = excluded.breaking, checksum = excluded.checksum`,
            [migration.version, migration.name, migration.breaking, migration.checksum],
          );
          await client.query('commit');
        } catch (error) {
          await client.query('rollback');
          throw error;
        }
        applied.push(migration.name);
        log(`applied ${migration.name}`);
      }
    } finally {
      await client.query(`select pg_advisory_unlock(hashtext('runledger.migrate'))`);
    }
  } finally {
    client.release();
  }
  return { applied };
}

async function appliedMigrations(client: pg.PoolClient): Promise<AppliedState> {
  const exists = await client.query(`
    select to_regclass('runledger.migrations') is not null as present,
           exists (select 1 from pg_attribute
                    where attrelid = to_regclass('runledger.migrations') and attname = 'checksum' and not attisdropped) as has_checksum`);
  if (!exists.rows[0].present) return { rows: [], hasChecksum: true };
  const hasChecksum: boolean = exists.rows[0].has_checksum;
  const checksum = hasChecksum ? 'checksum' : 'null::text as checksum';
  const result = await client.query(`select version, name, breaking, ${checksum} from runledger.migrations order by version`);
  return { rows: result.rows, hasChecksum };
}

/**
 * Every applied migration this code also has must be the same file: same name and same
 * checksum. A row without a checksum was applied with psql from the files (they insert
 * their own row), and is taken as this build's: its checksum is recorded now. A table
 * without the checksum column was migrated by a build from before checksums, whose
 * files cannot be checked: refused like a mismatch.
 */
async function checkApplied(
  client: pg.PoolClient,
  migrations: Migration[],
  { rows: known, hasChecksum }: AppliedState,
  log: (message: string) => void,
): Promise<void> {
  const byVersion = new Map(migrations.map((m) => [m.version, m]));
  const differing: string[] = [];
  const unrecorded: Migration[] = [];
  for (const applied of known) {
    const file = byVersion.get(applied.version);
    if (!file) continue; // newer than this code: handled by the breaking-migration rule
    if (applied.name !== file.name) differing.push(`${file.name} (the database has ${applied.name})`);
    else if (!hasChecksum) differing.push(`${file.name} (no checksum recorded)`);
    else if (applied.checksum === null) unrecorded.push(file);
    else if (applied.checksum !== file.checksum) differing.push(`${file.name} (checksum differs)`);
  }
  if (differing.length > 0) {
    throw new MigrationMismatchError(
      `runledger migration${differing.length > 1 ? 's' : ''} ${differing.join(', ')} applied to this database ` +
        `${differing.length > 1 ? 'differ' : 'differs'} from this build's sql/ files, so the database was migrated with a different build ` +
        'of runledger: recreate the database if it is a development one, or run the runledger build that migrated it',
      { migrations: differing },
    );
  }
  for (const file of unrecorded) {
    await client.query('update runledger.migrations set checksum = $2 where version = $1 and checksum is null', [
      file.version,
      file.checksum,
    ]);
    log(`recorded the checksum of ${file.name} (applied without migrate)`);
  }
}
