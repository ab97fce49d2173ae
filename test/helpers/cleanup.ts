import { afterEach } from 'vitest';
import type { Worker } from '../../src/index.js';
import type { WorkerProcess } from './worker-process.js';

/**
 * Worker processes and in-process workers a test starts, stopped after each test
 * (processes are SIGCONTed, in case a test paused one, then SIGKILLed).
 */
export function stoppedAfterEach(): { processes: WorkerProcess[]; workers: Worker[] } {
  const tracked = { processes: [] as WorkerProcess[], workers: [] as Worker[] };
  afterEach(async () => {
    for (const process of tracked.processes.splice(0)) {
      process.child.kill('SIGCONT');
      process.kill('SIGKILL');
      await process.exited;
    }
    for (const worker of tracked.workers.splice(0)) await worker.stop();
  });
  return tracked;
}
