import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import type pg from 'pg';
import { runMigrations } from 'graphile-worker';
import { SchemaTooNewError } from '../core/errors.js';
import { GRAPHILE_SCHEMA, graphileLogger } from './graphile.js';

/** `sql/` ships with the package; this file sits at src/engine/db or dist/engine/db. */
const SQL_DIR = fileURLToPath(new URL('../../../sql/', import.meta.url));

export interface Migration {
  version: number;
  name: string;
  breaking: boolean;
  text: string;
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
      };
    });
}

/**
 * Installs graphile-worker's schema and applies runledger's missing migrations,
 * each in its own transaction under one advisory lock, so concurrent callers
 * wait for each other instead of racing. Refuses to run when the database has a
 * breaking migration this code does not know.
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
      const known = await appliedMigrations(client);
      const newest = migrations.at(-1)?.version ?? 0;
      const unknownBreaking = known.filter((m) => m.version > newest && m.breaking);
      if (unknownBreaking.length > 0) {
        throw new SchemaTooNewError(
          `the database has runledger migration ${unknownBreaking.map((m) => m.name).join(', ')}, which is newer than this code ` +
            `(newest known: ${migrations.at(-1)?.name}); upgrade runledger before running against this database`,
        );
      }
      const done = new Set(known.map((m) => m.version));
      for (const migration of migrations) {
        if (done.has(migration.version)) continue;
        await client.query('begin');
        try {
          await client.query(migration.text); // the file inserts its own runledger.migrations row
          if (migration.breaking) {
            await client.query('update runledger.migrations set breaking = true where version = $1', [migration.version]);
          }
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

async function appliedMigrations(client: pg.PoolClient): Promise<Array<{ version: number; name: string; breaking: boolean }>> {
  const exists = await client.query(`select to_regclass('runledger.migrations') is not null as present`);
  if (!exists.rows[0].present) return [];
  const result = await client.query('select version, name, breaking from runledger.migrations order by version');
  return result.rows;
}
