/**
 * A release is what it says: the package's version is the runtime's (recorded in every run's
 * manifest and printed by `runledger --version`), CHANGELOG.md has its section, and the
 * released migrations are frozen: each file sql/released.sha256 lists still has that sha256
 * (a database migrated with it would otherwise be refused, MIGRATION_MISMATCH), and every
 * file up to the newest one listed is listed (sql/README.md, rule 2).
 */
import { createHash } from 'node:crypto';
import { readFileSync, readdirSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { RUNTIME_VERSION } from '../src/engine/core/version.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const read = (path: string) => readFileSync(`${ROOT}/${path}`, 'utf8');

describe('the release', () => {
  const version = (JSON.parse(read('package.json')) as { version: string }).version;

  it('is the runtime version every run records', () => {
    expect(RUNTIME_VERSION).toBe(version);
  });

  it('has its section in CHANGELOG.md', () => {
    expect(read('CHANGELOG.md')).toMatch(new RegExp(`^## ${version.replaceAll('.', '\\.')}\\b`, 'm'));
  });

  it('keeps every released migration as it was released', () => {
    const listed = read('sql/released.sha256')
      .trim()
      .split('\n')
      .map((line) => line.split(/\s+/) as [string, string]);
    expect(listed.length).toBeGreaterThan(0);
    const changed = listed
      .filter(
        ([sum, file]) =>
          createHash('sha256')
            .update(read(`sql/${file}`), 'utf8')
            .digest('hex') !== sum,
      )
      .map(([, file]) => file);
    expect(changed, 'released migrations must never change: write a new numbered file (sql/README.md)').toEqual([]);
    const newest = Math.max(...listed.map(([, file]) => Number(file.slice(0, 4))));
    const files = readdirSync(`${ROOT}/sql`).filter((f) => /^\d{4}_[a-z0-9_]+\.sql$/.test(f));
    const unlisted = files.filter((f) => Number(f.slice(0, 4)) <= newest && !listed.some(([, file]) => file === f));
    expect(unlisted, 'every file up to the last released one is listed').toEqual([]);
  });
});
