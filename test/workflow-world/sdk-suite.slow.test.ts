import { spawn } from 'node:child_process';
import { existsSync, readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { stripVTControlCharacters } from 'node:util';
import { describe, expect, inject, it } from 'vitest';

/**
 * The Workflow SDK's own judge of a World: @workflow/world-testing 5.0.0-beta.35's
 * createTestSuite, unmodified, against runledger/workflow-world (test/workflow-world/suite).
 * It is a package of its own, since its peer is vitest 4 and this suite's is vitest 3: this
 * file installs it on first use (npm ci, from its lock file), builds dist/ when the World's
 * source is newer, and runs it on this suite's PostgreSQL server, where it makes a database of
 * its own. Its servers are real processes: each test starts the SDK's app server, which loads
 * the built World by WORKFLOW_TARGET_WORLD and runs a runledger worker; beside the SDK's suite,
 * crash.test.mjs SIGKILLs such servers mid-delivery and while a run sleeps.
 */
const ROOT = resolve(import.meta.dirname, '../..');
const SUITE = join(ROOT, 'test/workflow-world/suite');
const BUILT = join(ROOT, 'dist/workflow-world/index.js');

function run(
  command: string,
  args: string[],
  cwd: string,
  env: NodeJS.ProcessEnv = process.env,
): Promise<{ code: number | null; output: string }> {
  return new Promise((done, fail) => {
    const child = spawn(command, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
    child.on('error', fail);
    child.on('close', (code) => done({ code, output }));
  });
}

/** The newest modification time of the TypeScript under src/. */
function newestSource(): number {
  const files = readdirSync(join(ROOT, 'src'), { recursive: true }) as string[];
  return Math.max(...files.filter((file) => file.endsWith('.ts')).map((file) => statSync(join(ROOT, 'src', file)).mtimeMs));
}

describe('@workflow/world-testing against runledger/workflow-world', () => {
  it('passes 12 of 12, and the runs it made are runledger runs; SIGKILLed servers lose nothing (crash.test.mjs)', async () => {
    if (!existsSync(join(SUITE, 'node_modules/@workflow/world-testing'))) {
      const install = await run('npm', ['ci', '--no-audit', '--no-fund'], SUITE);
      expect(install.code, install.output).toBe(0);
    }
    if (!existsSync(BUILT) || statSync(BUILT).mtimeMs < newestSource()) {
      const build = await run('npm', ['run', 'build'], ROOT);
      expect(build.code, build.output).toBe(0);
    }
    const suite = await run('npx', ['vitest', 'run'], SUITE, { ...process.env, DATABASE_URL: inject('adminUrl') });
    const plain = stripVTControlCharacters(suite.output);
    expect(suite.code, plain).toBe(0);
    // The SDK's 12 and the two crash tests (crash.test.mjs); vitest's closing line: "Tests  14 passed (14)".
    expect(plain).toMatch(/suite\.test\.mjs \(12 tests\)/);
    expect(plain).toMatch(/crash\.test\.mjs \(2 tests\)/);
    expect(plain).toMatch(/Tests\s+14 passed \(14\)/);
    expect(plain).toContain('runledger.workflow_world_runs after the suite');
  }, 600_000);
});
