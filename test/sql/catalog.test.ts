/**
 * The runledger schema as seen from psql: every object documented (\d+ and \df+ show the
 * comments), the run-state enum equal to the TypeScript state list, and every file in
 * sql/ runnable as-is with psql, in order, on an empty database.
 */
import { accessSync, constants, readdirSync } from 'node:fs';
import { execFile } from 'node:child_process';
import { delimiter, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, inject, it } from 'vitest';
import pg from 'pg';
import { ulid } from 'ulid';
import { RUN_STATES } from '../../src/engine/core/states.js';
import { withDatabase } from '../setup/global-setup.js';
import { useTestEngine } from '../helpers/test-engine.js';

const SQL_DIR = fileURLToPath(new URL('../../sql/', import.meta.url));

const { db } = useTestEngine({ engine: false });

interface CatalogObject {
  kind: string;
  name: string;
  comment: string | null;
}

async function catalog(): Promise<CatalogObject[]> {
  const result = await db.pool.query<CatalogObject>(`
    select 'function' as kind, p.oid::regprocedure::text as name, obj_description(p.oid, 'pg_proc') as comment
      from pg_proc p
     where p.pronamespace = 'runledger'::regnamespace
    union all
    select case when c.relkind in ('v', 'm') then 'view' else 'table' end, c.oid::regclass::text,
           obj_description(c.oid, 'pg_class')
      from pg_class c
     where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'p', 'v', 'm', 'f')
    union all
    select 'type', t.oid::regtype::text, obj_description(t.oid, 'pg_type')
      from pg_type t
      left join pg_class c on c.oid = t.typrelid
     where t.typnamespace = 'runledger'::regnamespace
       -- enums, domains, ranges, standalone composites, base types; not the row types of
       -- tables and views (their comment is the table's) nor array types
       and (t.typtype in ('e', 'd', 'r', 'm') or (t.typtype = 'c' and c.relkind = 'c') or (t.typtype = 'b' and t.typcategory <> 'A'))
     order by 1, 2`);
  return result.rows;
}

describe('catalog comments', () => {
  it('lists the objects the SQL contract names (so the comment check below is not vacuous)', async () => {
    const objects = await catalog();
    const names = (kind: string) => objects.filter((o) => o.kind === kind).map((o) => o.name.replace(/\(.*$/, ''));
    expect(names('function')).toEqual(
      expect.arrayContaining(
        [
          'now', 'start_run', 'retry_run', '_claim_batch', '_checkpoint', '_fence', '_checkpoint_outcome', '_complete_run',
          '_fail_run', '_dead_letter_run', '_release_run', '_register_workflow', '_register_worker', '_heartbeat',
          '_stop_worker', '_recover_expired',
        ].map((f) => `runledger.${f}`),
      ),
    );
    expect(names('table')).toEqual(
      expect.arrayContaining(['runs', 'steps', 'events', 'workers', 'workflows', 'migrations'].map((t) => `runledger.${t}`)),
    );
    expect(names('view')).toEqual(expect.arrayContaining(['runledger.active', 'runledger.dead_letter', 'runledger.run_timeline']));
    expect(names('type')).toEqual(expect.arrayContaining(['runledger.run_status']));
  });

  // Functions whose names start with _ are internal, but \df+ shows them to operators too: they need a comment as well.
  it.each(['function', 'view', 'table', 'type'])('every %s in schema runledger has a COMMENT', async (kind) => {
    const objects = (await catalog()).filter((o) => o.kind === kind);
    expect(objects.length).toBeGreaterThan(0);
    const missing = objects.filter((o) => !o.comment || o.comment.trim() === '').map((o) => o.name);
    expect(missing, `${kind}s without a COMMENT: ${missing.join(', ')}`).toEqual([]);
  });
});

describe('runledger.run_status', () => {
  it('equals RUN_STATES in src/engine/core/states.ts, in order', async () => {
    const result = await db.pool.query(`select enum_range(null::runledger.run_status)::text[] as states`);
    expect(result.rows[0].states).toEqual([...RUN_STATES]);
  });
});

function findOnPath(binary: string): string | undefined {
  for (const dir of (process.env.PATH ?? '').split(delimiter)) {
    if (!dir) continue;
    const candidate = join(dir, binary);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // not here
    }
  }
  return undefined;
}

function runPsql(psql: string, url: string, file: string): Promise<{ code: number; output: string }> {
  return new Promise((resolve) => {
    execFile(
      psql,
      ['-X', '-q', '-v', 'ON_ERROR_STOP=1', '-1', '-f', file, '-d', url],
      { encoding: 'utf8', env: { ...process.env, PGCONNECT_TIMEOUT: '10' } },
      (error, stdout, stderr) => {
        const code = error ? (typeof error.code === 'number' ? error.code : 1) : 0;
        resolve({ code, output: `${stdout}${stderr}` });
      },
    );
  });
}

describe('sql/ files with psql', () => {
  it('each file runs with psql -v ON_ERROR_STOP=1 -1 -f, in order, on an empty database and records its migrations row', async (ctx) => {
    const psql = findOnPath('psql');
    ctx.skip(psql === undefined, 'psql is not on PATH: cannot check that sql/*.sql run as-is in psql');

    const files = readdirSync(SQL_DIR).filter((f) => /^\d{4}_.*\.sql$/.test(f)).sort();
    expect(files.length).toBeGreaterThan(0);

    const adminUrl = inject('adminUrl');
    const name = `rl_psql_${ulid().toLowerCase()}`;
    const admin = new pg.Client({ connectionString: adminUrl });
    await admin.connect();
    try {
      await admin.query(`create database ${name}`);
    } finally {
      await admin.end();
    }
    const url = withDatabase(adminUrl, name);
    const client = new pg.Client({ connectionString: url });
    try {
      await client.connect();
      const empty = await client.query(`select count(*)::int as n from pg_namespace where nspname in ('runledger', 'graphile_worker')`);
      expect(empty.rows[0].n).toBe(0);

      for (const [index, file] of files.entries()) {
        const { code, output } = await runPsql(psql!, url, join(SQL_DIR, file));
        expect(code, `psql -f sql/${file} exited ${code}:\n${output}`).toBe(0);
        const rows = await client.query('select version, name from runledger.migrations order by version');
        expect(rows.rows, `runledger.migrations after sql/${file}`).toHaveLength(index + 1);
        expect(rows.rows.at(-1)).toEqual({ version: Number(file.slice(0, 4)), name: file.replace(/\.sql$/, '') });
      }
      const all = await client.query('select version, name from runledger.migrations order by version');
      expect(all.rows).toEqual(files.map((f) => ({ version: Number(f.slice(0, 4)), name: f.replace(/\.sql$/, '') })));
    } finally {
      await client.end().catch(() => {});
      const cleanup = new pg.Client({ connectionString: adminUrl });
      await cleanup.connect();
      try {
        await cleanup.query(`drop database if exists ${name} with (force)`);
      } finally {
        await cleanup.end();
      }
    }
  });
});
