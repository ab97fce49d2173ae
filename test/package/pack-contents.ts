/**
 * What `npm pack` puts in the tarball, and the rules it must keep: the entry point and its
 * declarations, the migrations, the LICENSE and the README; no source map without the source it
 * names; every relative link of the README pointing at a file in the tarball (the docs ship in it).
 *
 * `npx tsx test/package/pack-contents.ts` checks the tree as built (CI runs it after the build) and
 * exits 1 with one line per problem; test/package/pack-contents.test.ts tests the rules themselves.
 */
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { dirname, join, normalize, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '../..');

/**
 * The paths `npm pack --dry-run --json` lists. `--ignore-scripts` keeps it from running `prepare`
 * (a build): it lists what is on disk, so build first to see dist/.
 */
export function packedFiles(root = ROOT): string[] {
  const out = execFileSync('npm', ['pack', '--dry-run', '--json', '--ignore-scripts'], {
    cwd: root,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const [pack] = JSON.parse(out) as Array<{ files: Array<{ path: string }> }>;
  return pack!.files.map((file) => file.path);
}

/**
 * What the tarball must hold and must not: one line per problem, none when it is right.
 * `readFile` reads a packed file by its package path (a .map, to see which sources it names).
 */
export function packProblems(files: readonly string[], readFile = (path: string) => readFileSync(join(ROOT, path), 'utf8')): string[] {
  const have = new Set(files);
  const problems: string[] = [];
  for (const required of ['dist/index.js', 'dist/index.d.ts', 'LICENSE', 'README.md', 'package.json']) {
    if (!have.has(required)) problems.push(`missing ${required}`);
  }
  if (!files.some((file) => /^sql\/[^/]+\.sql$/.test(file))) problems.push('missing sql/*.sql (the migrations)');
  for (const file of files.filter((path) => path.endsWith('.map'))) {
    const sources = mapSources(file, readFile);
    if (sources === undefined) {
      problems.push(`${file}: a source map whose sources cannot be read`);
      continue;
    }
    for (const source of sources) {
      if (!have.has(source)) problems.push(`${file}: maps ${source}, which is not in the package`);
    }
  }
  return problems;
}

/** The package paths a shipped map points at; undefined when it is not a map. */
function mapSources(file: string, readFile: (path: string) => string): string[] | undefined {
  try {
    const map = JSON.parse(readFile(file)) as { sources?: unknown; sourceRoot?: unknown };
    if (!Array.isArray(map.sources)) return undefined;
    const root = typeof map.sourceRoot === 'string' ? map.sourceRoot : '';
    return map.sources.map((source) => normalize(join(dirname(file), root, String(source))));
  } catch {
    return undefined;
  }
}

/** Every relative link target of a Markdown text (`[text](target)` and `![alt](target)`), without its #anchor. */
export function relativeLinks(markdown: string): string[] {
  const links: string[] = [];
  // Code is not a link: fenced blocks first, then inline spans.
  const prose = markdown.replace(/^(```|~~~)[^\n]*\n[\s\S]*?^\1[^\n]*$/gm, '').replace(/`[^`\n]*`/g, '');
  for (const match of prose.matchAll(/\]\(\s*<?([^)\s>]+)>?(?:\s+"[^"]*")?\s*\)/g)) {
    const target = match[1]!;
    if (/^[a-z][a-z0-9+.-]*:/i.test(target) || target.startsWith('#') || target.startsWith('//')) continue;
    const path = decodeURIComponent(target.split('#')[0]!.split('?')[0]!);
    if (path !== '') links.push(path);
  }
  return links;
}

/** README links that would not resolve in the unpacked package (the README sits at its root). */
export function brokenReadmeLinks(readme: string, files: readonly string[]): string[] {
  const have = new Set(files);
  const folders = new Set(
    files.flatMap((file) =>
      file
        .split('/')
        .slice(0, -1)
        .map((_, i, parts) => parts.slice(0, i + 1).join('/')),
    ),
  );
  return relativeLinks(readme).filter((link) => {
    const path = normalize(link).replace(/\/$/, '');
    return !have.has(path) && !folders.has(path);
  });
}

if (process.argv[1] && resolve(process.argv[1]) === fileURLToPath(import.meta.url)) {
  const files = packedFiles();
  const problems = [
    ...packProblems(files),
    ...brokenReadmeLinks(readFileSync(join(ROOT, 'README.md'), 'utf8'), files).map(
      (link) => `README.md links ${link}, which is not in the package`,
    ),
  ];
  for (const problem of problems) console.error(`npm pack: ${problem}`);
  if (problems.length > 0) process.exit(1);
  console.log(
    `npm pack: ${files.length} files, with dist/index.js, dist/index.d.ts, sql/*.sql, LICENSE and README.md; no map without its source; every README link resolves`,
  );
}
