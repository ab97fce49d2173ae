/**
 * Each function of schema runledger has one definition in sql/NNNN_*.sql, in the file of
 * its concept, until the first release (sql/README.md). Read from the files themselves:
 * the catalog shows only the last definition, not how many files made it.
 */
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const SQL_DIR = fileURLToPath(new URL('../../sql/', import.meta.url));

/**
 * The version of the last migration of the first release; null while nothing is
 * released. After it, a change to a function is a new file that redefines it, and only
 * files newer than this one may do so.
 */
const LAST_RELEASED_MIGRATION: number | null = 18;

interface Definition {
  name: string;
  file: string;
  version: number;
}

/** Every `create [or replace] function runledger.x(` outside comments and strings of function bodies. */
function definitions(): Definition[] {
  const found: Definition[] = [];
  for (const file of readdirSync(SQL_DIR).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f)).sort()) {
    // Line comments out; function bodies ($$ ... $$) out, so a name in a body is not a definition.
    const text = readFileSync(`${SQL_DIR}/${file}`, 'utf8')
      .replace(/--[^\n]*/g, '')
      .replace(/\$\$[\s\S]*?\$\$/g, '$$$$');
    for (const match of text.matchAll(/\bcreate\s+(?:or\s+replace\s+)?function\s+runledger\.("?)([a-z_][a-z0-9_]*)\1\s*\(/gi)) {
      found.push({ name: match[2]!.toLowerCase(), file, version: Number(file.slice(0, 4)) });
    }
  }
  return found;
}

describe('sql/ function definitions', () => {
  it('finds the functions (so the check below is not vacuous)', () => {
    const names = new Set(definitions().map((d) => d.name));
    expect(names.size).toBeGreaterThan(50);
    expect([...names]).toEqual(expect.arrayContaining(['start_run', '_claim_batch', '_commit_batch', '_admit']));
  });

  it('creates each function once, in one file (redefinitions only in files after the first release)', () => {
    const byName = new Map<string, Definition[]>();
    for (const d of definitions()) byName.set(d.name, [...(byName.get(d.name) ?? []), d]);
    const twice = [...byName.entries()]
      .filter(([, defs]) => {
        const first = defs[0]!;
        const later = defs.slice(1);
        const released = LAST_RELEASED_MIGRATION;
        // Before the release a function is folded into its concept's file; after it, only newer files redefine.
        return later.length > 0 && (released === null || first.version > released || later.some((d) => d.version <= released));
      })
      .map(([name, defs]) => `${name}: ${defs.map((d) => d.file).join(', ')}`);
    expect(twice, `functions defined more than once (fold them into one definition, see sql/README.md):\n${twice.join('\n')}`).toEqual([]);
  });

  it('defines each function at most once among the files not released yet (rule 2 among themselves)', () => {
    const released = LAST_RELEASED_MIGRATION;
    const unreleased = definitions().filter((d) => released === null || d.version > released);
    const files = new Map<string, string[]>();
    for (const d of unreleased) files.set(d.name, [...(files.get(d.name) ?? []), d.file]);
    const twice = [...files.entries()].filter(([, fs]) => fs.length > 1).map(([name, fs]) => `${name}: ${fs.join(', ')}`);
    expect(unreleased.length, 'there are unreleased definitions to check').toBeGreaterThan(0);
    expect(twice, `functions defined again in a later unreleased file (edit the first one in place):\n${twice.join('\n')}`).toEqual([]);
  });
});
