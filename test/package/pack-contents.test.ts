/**
 * The package a user installs: the rules test/package/pack-contents.ts checks (CI runs it on the
 * built tree), and the README's relative links, which must resolve in the unpacked package because
 * the registry page and node_modules/runledger/README.md have nothing else to resolve them against.
 * test/package/install-check.sh installs a packed and a git-installed copy into new apps.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { brokenReadmeLinks, packedFiles, packProblems, relativeLinks, ROOT } from './pack-contents.js';

const GOOD = [
  'LICENSE',
  'README.md',
  'package.json',
  'dist/index.js',
  'dist/index.d.ts',
  'sql/0001_schema.sql',
  'sql/README.md',
  'docs/concepts.md',
];

describe('the rules of the tarball', () => {
  it('accept a package with its entry point, declarations, migrations, LICENSE and README', () => {
    expect(packProblems(GOOD, () => '')).toEqual([]);
  });

  it('name each required file that is missing', () => {
    for (const required of ['dist/index.js', 'dist/index.d.ts', 'LICENSE', 'README.md']) {
      expect(packProblems(GOOD.filter((file) => file !== required))).toEqual([`missing ${required}`]);
    }
    expect(packProblems(GOOD.filter((file) => !file.startsWith('sql/')).concat('sql/README.md'))).toEqual([
      'missing sql/*.sql (the migrations)',
    ]);
  });

  it('refuse a source map whose source is not shipped, and accept one whose source is', () => {
    const maps: Record<string, string> = {
      'dist/index.js.map': JSON.stringify({ version: 3, sources: ['../src/index.ts'], mappings: '' }),
      'dist/engine/a.js.map': JSON.stringify({ version: 3, sourceRoot: '../../src/', sources: ['engine/a.ts'], mappings: '' }),
      'dist/broken.js.map': 'not json',
    };
    const read = (path: string) => maps[path]!;
    expect(packProblems([...GOOD, 'dist/index.js.map'], read)).toEqual([
      'dist/index.js.map: maps src/index.ts, which is not in the package',
    ]);
    expect(packProblems([...GOOD, 'dist/index.js.map', 'src/index.ts'], read)).toEqual([]);
    expect(packProblems([...GOOD, 'dist/engine/a.js.map'], read)).toEqual([
      'dist/engine/a.js.map: maps src/engine/a.ts, which is not in the package',
    ]);
    expect(packProblems([...GOOD, 'dist/broken.js.map'], read)).toEqual(['dist/broken.js.map: a source map whose sources cannot be read']);
  });

  it('find the relative links of Markdown, not the ones in code or to the web', () => {
    const markdown = [
      'See [concepts](docs/concepts.md#dispatch), ![a run](docs/img/run.png "the console") and [sql](sql/README.md).',
      'Not [the web](https://example.com/x.md), [an anchor](#install), `[code](not/a/link.md)` or:',
      '```ts',
      'const x = [a](b/c.md);',
      '```',
      '[folder](docs/) [up](./LICENSE)',
    ].join('\n');
    expect(relativeLinks(markdown)).toEqual(['docs/concepts.md', 'docs/img/run.png', 'sql/README.md', 'docs/', './LICENSE']);
    expect(brokenReadmeLinks(markdown, GOOD)).toEqual(['docs/img/run.png']);
  });
});

describe('the package as `npm pack` lists it', () => {
  const files = packedFiles();

  it('ships the docs, the migrations, LICENSE and README.md', () => {
    expect(files).toEqual(expect.arrayContaining(['LICENSE', 'README.md', 'package.json', 'docs/concepts.md', 'sql/README.md']));
    expect(files.filter((file) => /^sql\/[^/]+\.sql$/.test(file)).length).toBeGreaterThan(0);
    expect(readFileSync(join(ROOT, 'LICENSE'), 'utf8')).toContain('Apache License\n                           Version 2.0, January 2004');
  });

  it('every relative link in README.md points at a file in the package', () => {
    const readme = readFileSync(join(ROOT, 'README.md'), 'utf8');
    expect(relativeLinks(readme).length).toBeGreaterThan(5);
    expect(brokenReadmeLinks(readme, files)).toEqual([]);
  });

  // CI builds before it tests (npm ci runs prepare); locally dist/ exists only after `npm run build`.
  it.skipIf(!existsSync(join(ROOT, 'dist/index.js')))('holds the built entry point and no source map without its source', () => {
    expect(packProblems(files)).toEqual([]);
  });
});
