/**
 * The repository the coding agent works on, and the per-run workspace it edits. A
 * workspace is a directory of this process (`<tmp>/runledger-coding-agent/<pid>/<run>`):
 * a worker that takes the run over after a crash has none, and rebuilds it from the
 * base files and the diff the run recorded as an artifact. The workspace is a cache;
 * the run's history is the truth.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { runCommand } from '../../src/index.js';

/** The project at the pull request's base: `price()` truncates where it should round. */
export const BASE_FILES: Record<string, string> = {
  'src/price.js': `export function price(cents, vatPercent) {
  return Math.floor(cents * (1 + vatPercent / 100));
}
`,
  'test/price.test.js': `import assert from 'node:assert/strict';
import { price } from '../src/price.js';
assert.equal(price(1000, 19), 1190);
assert.equal(price(999, 19), 1189); // 1188.81 rounds to 1189
assert.equal(price(1, 50), 2); // 1.5 rounds up
console.log('3 tests passed');
`,
  'package.json': '{ "type": "module" }\n',
};

/** One edit of the workspace, as recorded in the diff artifact. */
export interface FileChange {
  path: string;
  before: string;
  after: string;
}

/** The workspace of run `runId` in worker process `pid` (default: this one). */
export function workspaceDir(runId: string, pid = String(process.pid)): string {
  return join(tmpdir(), 'runledger-coding-agent', pid, runId);
}

/** Removes the run's workspace from every process's directory (the environment's reclaim: a crashed worker's copy too). */
export function removeWorkspaces(runId: string): number {
  const root = join(tmpdir(), 'runledger-coding-agent');
  let removed = 0;
  for (const pid of existsSync(root) ? readdirSync(root) : []) {
    const dir = join(root, pid, runId);
    if (existsSync(dir)) {
      rmSync(dir, { recursive: true, force: true });
      removed++;
    }
  }
  return removed;
}

/** The run's workspace in this process; created from the base files plus `changes` where it is missing. */
export function ensureWorkspace(runId: string, changes: FileChange[]): { dir: string; rebuilt: boolean } {
  const dir = workspaceDir(runId);
  if (existsSync(join(dir, '.ready'))) return { dir, rebuilt: false };
  rmSync(dir, { recursive: true, force: true });
  for (const [path, text] of Object.entries(BASE_FILES)) writeFile(dir, path, text);
  for (const change of changes) writeFile(dir, change.path, change.after);
  writeFileSync(join(dir, '.ready'), '');
  return { dir, rebuilt: true };
}

export function readWorkspaceFile(dir: string, path: string): string {
  return readFileSync(join(dir, path), 'utf8');
}

export function writeFile(dir: string, path: string, text: string): void {
  if (path.includes('..')) throw new Error(`path ${path} leaves the workspace`);
  mkdirSync(dirname(join(dir, path)), { recursive: true });
  writeFileSync(join(dir, path), text);
}

/**
 * Runs the project's tests in the workspace: `{ passed, output }`. Through runCommand (what
 * ctx.exec runs): the test process gets a process group of its own, killed with the run when
 * it is cancelled (the step's signal), when it runs past 20 s, or when this worker dies.
 */
export async function runTests(dir: string, signal: AbortSignal): Promise<{ passed: boolean; output: string }> {
  const result = await runCommand(
    { command: process.execPath, args: ['test/price.test.js'], cwd: dir, timeout: '20s' },
    { signal, name: 'tests' },
  );
  const output = `${result.stdoutTail}${result.stderrTail}`.trim().split('\n').slice(-3).join('\n');
  return { passed: result.exitCode === 0, output };
}

/** A unified-looking diff of the changes, for people (the artifact keeps the structured form too). */
export function renderDiff(changes: FileChange[]): string {
  return changes
    .map((c) => {
      const before = c.before.split('\n').map((l) => `-${l}`);
      const after = c.after.split('\n').map((l) => `+${l}`);
      return [`--- a/${c.path}`, `+++ b/${c.path}`, ...before, ...after].join('\n');
    })
    .join('\n');
}
