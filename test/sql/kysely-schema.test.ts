/**
 * src/engine/db/schema.ts (RunledgerDatabase, the Kysely types of runledger's tables)
 * against the catalog of a migrated database: every table and column it names exists
 * with the same type, nullability and default, and every column of every runledger
 * table is in it. A migration that adds, drops or retypes a column fails here until
 * the map is updated, so the Kysely types cannot drift from the schema.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { parseColumnSpec, RUNLEDGER_TABLES, type ColumnSpec } from '../../src/engine/db/schema.js';
import { createTestDatabase, type TestDatabase } from '../helpers/database.js';

let db: TestDatabase;

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await db?.drop();
});

interface CatalogColumn {
  table: string;
  column: string;
  type: string;
  nullable: boolean;
  hasDefault: boolean;
}

async function catalogColumns(): Promise<CatalogColumn[]> {
  const result = await db.pool.query<CatalogColumn>(`
    select c.table_schema || '.' || c.table_name as table, c.column_name as column, c.udt_name as type,
           c.is_nullable = 'YES' as nullable, (c.column_default is not null or c.is_identity = 'YES') as "hasDefault"
      from information_schema.columns c
      join information_schema.tables t on t.table_schema = c.table_schema and t.table_name = c.table_name
     where c.table_schema = 'runledger' and t.table_type = 'BASE TABLE'
     order by c.table_name, c.ordinal_position`);
  return result.rows;
}

const declared = (): CatalogColumn[] =>
  Object.entries(RUNLEDGER_TABLES).flatMap(([table, columns]) =>
    Object.entries(columns as Record<string, ColumnSpec>).map(([column, spec]) => {
      const { type, nullable, hasDefault } = parseColumnSpec(spec);
      return { table, column, type, nullable, hasDefault };
    }),
  );

describe('RunledgerDatabase (src/engine/db/schema.ts) and the catalog', () => {
  it('names every runledger table, and only those', async () => {
    const tables = [...new Set((await catalogColumns()).map((c) => c.table))].sort();
    expect(tables.length).toBeGreaterThanOrEqual(12); // not vacuous
    expect(Object.keys(RUNLEDGER_TABLES).sort()).toEqual(tables);
  });

  it('has every column of every table, with its type, nullability and default', async () => {
    const key = (c: CatalogColumn) => `${c.table}.${c.column}`;
    const catalog = new Map((await catalogColumns()).map((c) => [key(c), c]));
    const ours = new Map(declared().map((c) => [key(c), c]));
    const problems = [
      ...[...catalog.keys()].filter((k) => !ours.has(k)).map((k) => `${k}: missing from schema.ts`),
      ...[...ours.keys()].filter((k) => !catalog.has(k)).map((k) => `${k}: in schema.ts, not in the catalog`),
      ...[...ours].flatMap(([k, column]) => {
        const actual = catalog.get(k);
        return actual && JSON.stringify(actual) !== JSON.stringify(column) ? [`${k}: schema.ts says ${JSON.stringify(column)}, the catalog ${JSON.stringify(actual)}`] : [];
      }),
    ];
    expect(problems).toEqual([]);
    expect(ours.size).toBe(catalog.size);
  });

  it('parses specs as written', () => {
    expect(parseColumnSpec('int8 null default')).toEqual({ type: 'int8', nullable: true, hasDefault: true });
    expect(parseColumnSpec(['text', ['a', 'b']])).toEqual({ type: 'text', nullable: false, hasDefault: false, values: ['a', 'b'] });
  });

  it("takes each enumerated column's values from the schema's rules", async () => {
    // run_status: equal to the enum. Text columns: each listed value is named in the rules
    // that check them (check constraints, runledger._check_run / _check_step and the lists they use).
    const checks = await db.pool.query<{ table: string; def: string }>(`
      select conrelid::regclass::text as table, pg_get_constraintdef(oid) as def
        from pg_constraint where connamespace = 'runledger'::regnamespace and contype = 'c'`);
    const functions = await db.pool.query<{ src: string }>(`
      select prosrc as src from pg_proc where pronamespace = 'runledger'::regnamespace and proname in ('_check_run', '_check_step', 'termination_reasons', 'step_kinds', 'wait_kinds')`);
    const enumValues = await db.pool.query<{ v: string }>(`select unnest(enum_range(null::runledger.run_status))::text as v`);
    const ruleText = [...checks.rows.map((r) => r.def), ...functions.rows.map((r) => r.src)].join('\n');
    for (const [table, columns] of Object.entries(RUNLEDGER_TABLES)) {
      for (const [column, spec] of Object.entries(columns as Record<string, ColumnSpec>)) {
        const { type, values } = parseColumnSpec(spec);
        if (!values) continue;
        if (type === 'run_status') {
          expect([...values], `${table}.${column}`).toEqual(enumValues.rows.map((r) => r.v));
          continue;
        }
        for (const value of values) expect(ruleText, `${table}.${column}: '${value}'`).toContain(`'${value}'`);
      }
    }
  });
});
