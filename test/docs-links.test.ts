/**
 * The docs cite test files as proof ("`test/crash.test.ts` shows ..."): every such path in
 * README.md, sql/README.md and docs/*.md names a file (or a folder, `test/sql/`) that
 * exists, so a renamed or split test file cannot leave a doc pointing at nothing.
 */
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';

const ROOT = fileURLToPath(new URL('..', import.meta.url));

/** The Markdown files a reader meets: the README, sql/README.md and everything under docs/. */
function docFiles(): string[] {
  const docs = readdirSync(`${ROOT}/docs`, { recursive: true, encoding: 'utf8' })
    .filter((file) => file.endsWith('.md'))
    .map((file) => `docs/${file}`);
  return ['README.md', 'sql/README.md', ...docs];
}

/** Every `test/...ts` path (and `test/.../` folder) a text mentions. */
function testPathsIn(text: string): string[] {
  return [...text.matchAll(/(?<![\w./-])test\/[\w./-]*?(?:\.ts\b|\/(?=[`\s)]))/g)].map((m) => m[0]);
}

describe('test files cited by the docs', () => {
  it('finds the paths a doc writes', () => {
    expect(testPathsIn('see `test/crash.test.ts`, (test/sql/child-wake.test.ts) and the files of `test/sql/`; not latest/x.ts')).toEqual([
      'test/crash.test.ts',
      'test/sql/child-wake.test.ts',
      'test/sql/',
    ]);
  });

  it('every test/...ts path in README.md, sql/README.md and docs/*.md exists', () => {
    const cited: string[] = [];
    const missing: string[] = [];
    for (const doc of docFiles()) {
      const lines = readFileSync(`${ROOT}/${doc}`, 'utf8').split('\n');
      lines.forEach((line, i) => {
        for (const path of testPathsIn(line)) {
          cited.push(path);
          const exists = existsSync(`${ROOT}/${path}`) && (path.endsWith('/') ? statSync(`${ROOT}/${path}`).isDirectory() : true);
          if (!exists) missing.push(`${doc}:${i + 1}: ${path}`);
        }
      });
    }
    expect(cited.length).toBeGreaterThan(20);
    expect(missing).toEqual([]);
  });
});
