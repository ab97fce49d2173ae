import type pg from 'pg';

/**
 * Every place `value` is stored in the runledger schema: each text, varchar, json, jsonb
 * and text[] column (cast to text, as `where col::text like '%value%'` would, without LIKE's wildcards) and each bytea column (as bytes) of every table, named
 * `table.column (rows)`. Empty when the value is stored nowhere.
 */
export async function whereStored(pool: pg.Pool, value: string): Promise<string[]> {
  const columns = await pool.query<{ table_name: string; column_name: string; data_type: string }>(
    `select c.table_name, c.column_name, c.data_type
       from information_schema.columns c
       join information_schema.tables t on t.table_schema = c.table_schema and t.table_name = c.table_name
      where c.table_schema = 'runledger' and t.table_type = 'BASE TABLE'
        and (c.data_type in ('text', 'character varying', 'character', 'json', 'jsonb', 'bytea')
             or (c.data_type = 'ARRAY' and c.udt_name in ('_text', '_varchar', '_jsonb')))
      order by c.table_name, c.ordinal_position`,
  );
  if (columns.rows.length < 40) throw new Error(`whereStored: only ${columns.rows.length} columns found; is the schema there?`);
  const found: string[] = [];
  for (const { table_name, column_name, data_type } of columns.rows) {
    const column = `"${column_name.replace(/"/g, '""')}"`;
    const condition = data_type === 'bytea' ? `position(convert_to($1, 'UTF8') in ${column}) > 0` : `strpos(${column}::text, $1) > 0`;
    const { rows } = await pool.query<{ n: number }>(`select count(*)::int as n from runledger."${table_name}" where ${condition}`, [
      value,
    ]);
    if (rows[0]!.n > 0) found.push(`${table_name}.${column_name} (${rows[0]!.n})`);
  }
  return found;
}

/** A log function that keeps every line (level, message and meta as JSON) for the test to read. */
export function captureLog(): { lines: string[]; log: (level: string, message: string, meta?: Record<string, unknown>) => void } {
  const lines: string[] = [];
  return { lines, log: (level, message, meta) => lines.push(`${level} ${message} ${JSON.stringify(meta ?? {})}`) };
}
