/**
 * Every text column of runledger's tables compares bytewise (COLLATE "C",
 * sql/0030_bytewise_text.sql), whatever the database's default collation: under a
 * linguistic one each index comparison is a strcoll(), and a start_runs row cost twice the
 * instructions (callgrind, PostgreSQL 15, en_US.UTF-8).
 *
 * Also checked: the migration makes the views, policies and trigger it has to drop again
 * as they were, and it stops, changing nothing, when a view of another schema reads the
 * columns it would change.
 */
import { describe, expect, it } from 'vitest';
import { loadMigrations } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { runMigration, withEmptyDatabase } from '../helpers/empty-database.js';

const { db } = useTestEngine({ engine: false });

const NOT_BYTEWISE = `
  select format('%s.%I', a.attrelid::regclass, a.attname) as col, a.attcollation::regcollation::text as collation
    from pg_attribute a join pg_class c on c.oid = a.attrelid
   where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'p')
     and a.attnum > 0 and not a.attisdropped and a.attcollation <> 0
     and a.attcollation <> 'pg_catalog."C"'::regcollation
   order by 1`;

/** Views, policies and triggers of schema runledger with what defines them: what 0030 drops and makes again. */
const DEPENDENTS = `
  select 'view ' || c.relname || ': ' || pg_get_viewdef(c.oid) || ' | ' || coalesce(obj_description(c.oid, 'pg_class'), '-')
         || ' | ' || coalesce(c.relacl::text, '-') as def
    from pg_class c where c.relnamespace = 'runledger'::regnamespace and c.relkind = 'v'
  union all
  select 'policy ' || p.polname || ' on ' || p.polrelid::regclass || ': ' || p.polcmd::text || ' ' || p.polpermissive::text || ' '
         || p.polroles::text || ' ' || coalesce(pg_get_expr(p.polqual, p.polrelid), '-') || ' '
         || coalesce(pg_get_expr(p.polwithcheck, p.polrelid), '-')
    from pg_policy p join pg_class c on c.oid = p.polrelid where c.relnamespace = 'runledger'::regnamespace
  union all
  select 'trigger ' || pg_get_triggerdef(t.oid) || ' | ' || coalesce(obj_description(t.oid, 'pg_trigger'), '-')
    from pg_trigger t join pg_class c on c.oid = t.tgrelid
   where c.relnamespace = 'runledger'::regnamespace and not t.tgisinternal
  order by 1`;

describe('text columns of runledger', () => {
  it('are all COLLATE "C"', async () => {
    const textColumns = await db.pool.query<{ n: number }>(
      `select count(*)::int as n from pg_attribute a join pg_class c on c.oid = a.attrelid
        where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'p') and a.attnum > 0 and a.attcollation <> 0`,
    );
    // The query below looks at these; there are many (so an empty answer is not for lack of columns).
    expect(textColumns.rows[0]!.n).toBeGreaterThan(90);
    const notBytewise = await db.pool.query(NOT_BYTEWISE);
    expect(notBytewise.rows, 'text columns without collate "C" (a new column must say collate "C", see sql/0030_bytewise_text.sql)').toEqual([]);
  });

  it('finds a new column without COLLATE "C" (the check can fail)', async () => {
    const client = await db.pool.connect();
    try {
      await client.query('begin');
      await client.query('alter table runledger.runs add column note_for_test text');
      const notBytewise = await client.query(NOT_BYTEWISE);
      expect(notBytewise.rows).toEqual([{ col: 'runledger.runs.note_for_test', collation: expect.any(String) }]);
    } finally {
      await client.query('rollback');
      client.release();
    }
  });
});

describe('migration 0030_bytewise_text', () => {
  const migrations = loadMigrations();
  const before = migrations.filter((m) => m.version < 30);
  const bytewise = migrations.find((m) => m.version === 30)!;

  it('makes the views, policies and triggers it drops again as they were', async () => {
    expect(bytewise.name).toBe('0030_bytewise_text');
    await withEmptyDatabase('rl_collation', async (client) => {
      for (const m of before) await runMigration(client, m.text);
      // A grant to a role whose name needs quoting (regrole::text already quotes it) is made again as it was.
      await client.query(`do $$ begin if not exists (select from pg_roles where rolname = 'Report Reader') then create role "Report Reader"; end if; end $$`);
      await client.query('grant select on runledger.waiting to "Report Reader"');
      const dependentsBefore = (await client.query<{ def: string }>(DEPENDENTS)).rows.map((r) => r.def);
      expect(dependentsBefore.filter((d) => d.startsWith('view ')).length).toBeGreaterThan(10);
      expect(dependentsBefore.filter((d) => d.startsWith('policy ')).length).toBeGreaterThan(10);
      expect(dependentsBefore.some((d) => d.startsWith('trigger CREATE TRIGGER sessions_mark_holder'))).toBe(true);
      expect((await client.query(NOT_BYTEWISE)).rows.length).toBeGreaterThan(90);

      await runMigration(client, bytewise.text);
      expect((await client.query(NOT_BYTEWISE)).rows).toEqual([]);
      expect(dependentsBefore.some((d) => d.includes('Report Reader'))).toBe(true);
      expect((await client.query<{ def: string }>(DEPENDENTS)).rows.map((r) => r.def)).toEqual(dependentsBefore);
      await client.query('revoke select on runledger.waiting from "Report Reader"');
    });
  });

  it('stops before changing anything when a view of another schema reads the columns, and names it', async () => {
    await withEmptyDatabase('rl_collation', async (client) => {
      for (const m of before) await runMigration(client, m.text);
      await client.query('create view public.my_runs as select run_id, status from runledger.runs');
      const notBytewiseBefore = (await client.query(NOT_BYTEWISE)).rows;

      const error = await runMigration(client, bytewise.text).then(
        () => ({ code: 'none', message: 'the migration succeeded' }),
        (e: { code?: string; message?: string }) => ({ code: e.code, message: e.message }),
      );
      expect(error.code).toBe('RL003');
      expect(error.message).toContain('public.my_runs');
      expect((await client.query(NOT_BYTEWISE)).rows).toEqual(notBytewiseBefore);
      const version = await client.query<{ v: number }>('select max(version)::int as v from runledger.migrations');
      expect(version.rows[0]!.v).toBe(29);

      await client.query('drop view public.my_runs');
      await runMigration(client, bytewise.text);
      expect((await client.query(NOT_BYTEWISE)).rows).toEqual([]);
    });
  });
});
