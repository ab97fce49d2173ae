import { spawn } from 'node:child_process';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { runCliMain } from '../../src/cli/run.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface CliResult {
  code: number | null;
  stdout: string;
  stderr: string;
}

/**
 * Runs the `runledger` command in this process (runCliMain, src/cli/run.ts) against a
 * database, as `runCliProcess` does in a new one: its output captured as text (so never
 * cut to a width, as when piped), `env` over this process's environment with COLUMNS=200,
 * `stdin` as its standard input when given (otherwise it has none). worker, ui and dev run
 * until a signal and end their process: they need runCliProcess.
 */
export async function runCli(databaseUrl: string, args: string[], env: Record<string, string> = {}, stdin?: string): Promise<CliResult> {
  let stdout = '';
  let stderr = '';
  const code = await runCliMain(args, {
    stdout: { write: (text: string) => (stdout += text) },
    stderr: { write: (text: string) => (stderr += text) },
    ...(stdin === undefined ? {} : { stdin: Readable.from([Buffer.from(stdin)]) }),
    env: { ...process.env, DATABASE_URL: databaseUrl, COLUMNS: '200', ...env },
  });
  return { code, stdout, stderr };
}

/**
 * Runs the `runledger` command as a user does (`node --import tsx src/cli/main.ts ...`)
 * against a database, its output piped (so never cut to a width), with `stdin` written
 * to its standard input when given (otherwise it has none). For what only a process
 * shows: its exit code as the shell sees it, an exit that something left open cannot hold up.
 */
export function runCliProcess(databaseUrl: string, args: string[], env: Record<string, string> = {}, stdin?: string): Promise<CliResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', ...args], {
      cwd: ROOT,
      env: { ...process.env, DATABASE_URL: databaseUrl, COLUMNS: '200', ...env },
      stdio: [stdin === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
    });
    if (stdin !== undefined) child.stdin!.end(stdin);
    let stdout = '';
    let stderr = '';
    child.stdout!.on('data', (chunk) => (stdout += chunk));
    child.stderr!.on('data', (chunk) => (stderr += chunk));
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}
