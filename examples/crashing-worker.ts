/**
 * A worker process that dies for real: `npm run demo` spawns it, and it kills
 * itself with SIGKILL (no cleanup, no graceful release, like `kill -9` or a lost
 * machine) right after the payment provider accepted the refund of order
 * CRASH_ORDER_ID, before that step's checkpoint is written.
 *
 * Environment: DATABASE_URL, CRASH_ORDER_ID. Prints "ready <workerId>" once it serves runs.
 */
import { createEngine } from '../src/index.js';
import { defineRefundWorkflow } from './refund-workflow.js';

const engine = createEngine({ connectionString: process.env.DATABASE_URL! });
defineRefundWorkflow(engine, {
  afterProviderCall: (orderId) => {
    if (orderId === process.env.CRASH_ORDER_ID) process.kill(process.pid, 'SIGKILL');
  },
});
// A short lease so that the surviving worker takes the run over about a second after the crash.
const worker = await engine.runWorker({ concurrency: 1, leaseMs: 1000, pollIntervalMs: 200 });
process.stdout.write(`ready ${worker.workerId}\n`);
