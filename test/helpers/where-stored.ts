import type pg from 'pg';
import { expect } from 'vitest';

/**
 * Every text, varchar, json, jsonb and text[] column of every runledger table where the
 * text occurs, and every bytea column holding its UTF-8 bytes: "table.column" per hit.
 */
export async function whereStored(pool: pg.Pool, text: string): Promise<string[]> {
  const one = async <T>(sql: string, values: unknown[]) => (await pool.query(sql, values)).rows[0] as T;
  const columns = await pool.query<{ table_name: string; column_name: string; data_type: string }>(
    `select c.table_name, c.column_name, c.data_type
       from information_schema.columns c
       join information_schema.tables t on t.table_schema = c.table_schema and t.table_name = c.table_name
      where c.table_schema = 'runledger' and t.table_type = 'BASE TABLE'
        and c.data_type in ('text', 'character varying', 'json', 'jsonb', 'ARRAY', 'bytea')
      order by 1, 2`,
  );
  expect(columns.rows.length).toBeGreaterThan(50);
  const hits: string[] = [];
  for (const { table_name: table, column_name: column, data_type: type } of columns.rows) {
    const where = type === 'bytea' ? `position(convert_to($1, 'UTF8') in "${column}") > 0` : `"${column}"::text like '%' || $1 || '%'`;
    const { n } = await one<{ n: number }>(`select count(*)::int as n from runledger."${table}" where ${where}`, [text]);
    if (n > 0) hits.push(`${table}.${column}`);
  }
  return hits;
}
