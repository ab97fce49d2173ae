import { afterEach } from 'vitest';
import type { Engine, Worker } from '../../src/index.js';
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

/**
 * A starter of in-process workers on one queue of the file's engine (lease 2 s, poll
 * 100 ms, concurrency 4), each stopped after its test.
 */
export function queueWorkers(engine: () => Engine, queue: string): () => Promise<Worker> {
  const { workers } = stoppedAfterEach();
  return async () => {
    const worker = await engine().runWorker({ queues: [queue], concurrency: 4, leaseMs: 2_000, pollIntervalMs: 100 });
    workers.push(worker);
    return worker;
  };
}
