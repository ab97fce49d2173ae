import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';

const WORKER_SCRIPT = fileURLToPath(new URL('../fixtures/worker-process.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

export interface WorkerProcess {
  child: ChildProcess;
  pid: number;
  /** Resolves with the exit code / signal once the process is gone. */
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
  kill(signal?: NodeJS.Signals): void;
  output(): string;
}

export interface SpawnOptions {
  /** Arguments after the script (for src/cli/main.ts: the command and its options). */
  args?: string[];
  /** What the process prints once it serves runs; default "ready ". */
  ready?: string;
}

/** The `runledger` command line, as spawnWorker's script: `spawnWorker(env, CLI_SCRIPT, { args: ['worker', ...] })`. */
export const CLI_SCRIPT = fileURLToPath(new URL('../../src/cli/main.ts', import.meta.url));

/**
 * Spawns test/fixtures/worker-process.ts (or another fixture `script` that prints "ready",
 * or options.ready) and resolves once it printed it.
 */
export async function spawnWorker(env: Record<string, string>, script = WORKER_SCRIPT, options: SpawnOptions = {}): Promise<WorkerProcess> {
  const ready = options.ready ?? 'ready ';
  const child = spawn(process.execPath, ['--import', 'tsx', script, ...(options.args ?? [])], {
    cwd: ROOT,
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout!.on('data', (chunk) => (output += chunk));
  child.stderr!.on('data', (chunk) => (output += chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  await new Promise<void>((resolve, reject) => {
    const onData = () => {
      if (output.includes(ready)) {
        child.stdout!.off('data', onData);
        resolve();
      }
    };
    child.stdout!.on('data', onData);
    void exited.then(({ code, signal }) => reject(new Error(`worker exited before ready (code ${code}, signal ${signal}):\n${output}`)));
  });
  return {
    child,
    pid: child.pid!,
    exited,
    kill: (signal = 'SIGKILL') => void child.kill(signal),
    output: () => output,
  };
}
