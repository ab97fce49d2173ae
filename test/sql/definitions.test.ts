/**
 * Each function of schema runledger is defined once in the released files (the 0.2.0
 * baseline: one file per concept), and at most once more among the files newer than the
 * last release, which may redefine only what a release holds (sql/README.md, rules 2 and 3).
 * Read from the files themselves: the catalog shows only the last definition, not how many
 * files made it.
 */
import { mkdtempSync, readFileSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SQL_DIR = fileURLToPath(new URL('../../sql/', import.meta.url));

/**
 * The version of the last migration of the last release (0.2.0: 0001–0014), the newest file
 * sql/released.sha256 lists. A change to a released function is a new file that redefines
 * it; only files newer than this one may.
 */
const LAST_RELEASED_MIGRATION = Math.max(
  ...readFileSync(`${SQL_DIR}/released.sha256`, 'utf8')
    .trim()
    .split('\n')
    .map((line) => Number(line.split(/\s+/)[1]!.slice(0, 4))),
);

interface Definition {
  name: string;
  file: string;
  version: number;
}

/** Every `create [or replace] function runledger.x(` outside comments and strings of function bodies. */
function definitions(dir = SQL_DIR): Definition[] {
  const found: Definition[] = [];
  for (const file of readdirSync(dir).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort()) {
    // Line comments out; function bodies ($$ ... $$) out, so a name in a body is not a definition.
    const text = readFileSync(`${dir}/${file}`, 'utf8')
      .replace(/--[^\n]*/g, '')
      .replace(/\$\$[\s\S]*?\$\$/g, '$$$$');
    for (const match of text.matchAll(/\bcreate\s+(?:or\s+replace\s+)?function\s+runledger\.("?)([a-z_][a-z0-9_]*)\1\s*\(/gi)) {
      found.push({ name: match[2]!.toLowerCase(), file, version: Number(file.slice(0, 4)) });
    }
  }
  return found;
}

/** Every breach of the rules: a name created twice in the released files, or twice among the newer ones. */
function breaches(defs: Definition[], released: number): string[] {
  const out: string[] = [];
  const group = (list: Definition[]) => {
    const byName = new Map<string, string[]>();
    for (const d of list) byName.set(d.name, [...(byName.get(d.name) ?? []), d.file]);
    return [...byName.entries()].filter(([, files]) => files.length > 1);
  };
  for (const [name, files] of group(defs.filter((d) => d.version <= released))) out.push(`${name}: ${files.join(', ')} (released)`);
  for (const [name, files] of group(defs.filter((d) => d.version > released))) out.push(`${name}: ${files.join(', ')} (after the release)`);
  return out;
}

/** The rows of sql/README.md's table under "Where a function's live definition is": [name, released in, live in]. */
function readmeRedefinitions(readme: string): string[][] {
  const section = readme.split(/^## /m).find((part) => part.startsWith("Where a function's live definition is")) ?? '';
  return section
    .split('\n')
    .filter((line) => /^\| `/.test(line))
    .map((line) => line.split('|').slice(1, 4).map((cell) => cell.trim().replace(/`/g, '')));
}

describe('sql/ function definitions', () => {
  it('finds the functions and the release (so the check below is not vacuous)', () => {
    expect(LAST_RELEASED_MIGRATION).toBe(14);
    const names = new Set(definitions().map((d) => d.name));
    expect(names.size).toBeGreaterThan(150);
    expect([...names]).toEqual(expect.arrayContaining(['start_run', '_claim_batch', '_commit_batch', '_admit']));
  });

  it('creates each function once in the released files, and at most once more after them', () => {
    const found = breaches(definitions(), LAST_RELEASED_MIGRATION);
    expect(found, `functions defined more than once (see sql/README.md, rule 2):\n${found.join('\n')}`).toEqual([]);
  });

  it('lists every redefinition after the release in sql/README.md and in the redefining file\'s header', () => {
    const defs = definitions();
    const released = new Map(defs.filter((d) => d.version <= LAST_RELEASED_MIGRATION).map((d) => [d.name, d.file]));
    const redefined = defs
      .filter((d) => d.version > LAST_RELEASED_MIGRATION && released.has(d.name))
      .map((d) => [d.name, released.get(d.name)!, d.file])
      .sort(([a], [b]) => (a! < b! ? -1 : 1));
    expect(redefined.length).toBeGreaterThan(0); // 0015_completion.sql redefines three
    expect(readmeRedefinitions(readFileSync(`${SQL_DIR}/README.md`, 'utf8'))).toEqual(redefined);
    for (const [name, , file] of redefined) {
      const header = readFileSync(`${SQL_DIR}/${file}`, 'utf8').match(/^-- redefines: (.*)$/m)?.[1] ?? '';
      expect(header.split(/,\s*/), `${file}'s "-- redefines:" header`).toContain(name);
    }
  });

  it('reads the table of redefinitions (the check can fail)', () => {
    const table = '| function | released in | live definition in |\n| --- | --- | --- |\n| `f` | `0001_a.sql` | `0002_b.sql` |\n';
    expect(readmeRedefinitions(`## Where a function's live definition is\n\ntext\n\n${table}\n## Next\n| \`g\` | x | y |\n`)).toEqual([
      ['f', '0001_a.sql', '0002_b.sql'],
    ]);
  });

  it('reports a function defined twice (the check can fail)', () => {
    const dir = mkdtempSync(join(tmpdir(), 'runledger-definitions-'));
    try {
      writeFileSync(join(dir, '0001_a.sql'), 'create function runledger.f() returns int language sql as $$ select 1 $$;\n');
      writeFileSync(join(dir, '0002_b.sql'), '-- create function runledger.g( in a comment is no definition\ncreate or replace function runledger.f() returns int language sql as $$ select 2 $$;\n');
      writeFileSync(join(dir, '0003_c.sql'), 'create function runledger.g() returns int language sql as $$ select runledger.f() $$;\ncreate function runledger.g() returns int language sql as $$ select 3 $$;\n');
      const defs = definitions(dir);
      expect(breaches(defs, 2)).toEqual(['f: 0001_a.sql, 0002_b.sql (released)', 'g: 0003_c.sql, 0003_c.sql (after the release)']);
      expect(breaches(defs, 1)).toEqual(['g: 0003_c.sql, 0003_c.sql (after the release)']);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
