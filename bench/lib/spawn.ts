import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

export const BENCH_DIR = fileURLToPath(new URL('..', import.meta.url));

/** Starts `node --import tsx <script>` in bench/ with extra environment. */
export function spawnTs(script: string, env: Record<string, string>, stdio: 'pipe' | 'inherit' = 'pipe'): ChildProcess {
  return spawn(process.execPath, ['--no-deprecation', '--import', 'tsx', script], {
    cwd: BENCH_DIR,
    env: { ...process.env, ...env },
    stdio: ['ignore', stdio, 'inherit'],
  });
}

/** Resolves with the first stdout line starting with `prefix` (rest of the line), rejects if the process exits first. */
export function waitForLine(child: ChildProcess, prefix: string, timeoutMs: number): Promise<string> {
  return new Promise((resolve, reject) => {
    let buffer = '';
    const timer = setTimeout(() => finish(new Error(`no "${prefix}" line within ${timeoutMs} ms`)), timeoutMs);
    const onData = (chunk: Buffer) => {
      buffer += chunk.toString();
      let newline: number;
      while ((newline = buffer.indexOf('\n')) >= 0) {
        const line = buffer.slice(0, newline);
        buffer = buffer.slice(newline + 1);
        if (line.startsWith(prefix)) return finish(undefined, line.slice(prefix.length).trim());
        if (line.trim()) process.stderr.write(`    | ${line}\n`);
      }
    };
    const onExit = (code: number | null, signal: string | null) => finish(new Error(`exited (${code ?? signal}) before "${prefix}"`));
    const finish = (error?: Error, value?: string) => {
      clearTimeout(timer);
      child.stdout?.off('data', onData);
      child.off('exit', onExit);
      if (error) reject(error);
      else resolve(value!);
      // keep draining stdout so the child never blocks on a full pipe
      child.stdout?.on('data', () => undefined);
    };
    child.stdout?.on('data', onData);
    child.on('exit', onExit);
  });
}

export function waitForExit(child: ChildProcess, timeoutMs: number): Promise<boolean> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve(true);
  return new Promise((resolve) => {
    const timer = setTimeout(() => resolve(false), timeoutMs);
    child.once('exit', () => {
      clearTimeout(timer);
      resolve(true);
    });
  });
}
