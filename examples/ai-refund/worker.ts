/**
 * A worker process for the AI SDK refund demo. With CRASH_AFTER_REFUND=1 it SIGKILLs itself
 * right after the payment provider accepted the refund and before its outcome is
 * checkpointed (the engine's crashAt point, a test facility), as a machine lost at the
 * worst moment would. Environment: DATABASE_URL, PAYMENTS_URL, CRASH_AFTER_REFUND.
 */
import { createEngine } from '../../src/index.js';
import { defineRefundAgent } from './agent.js';

const engine = createEngine({
  connectionString: process.env.DATABASE_URL!,
  crashAt: process.env.CRASH_AFTER_REFUND === '1' ? [{ when: 'after-call', step: 'tool:refund', action: 'kill' }] : [],
  log: (level, message) => level !== 'info' && process.stderr.write(`[worker ${process.pid}] ${message}\n`),
});
defineRefundAgent(engine, process.env.PAYMENTS_URL!);
// A short lease, so that the next worker takes the run over about a second after a crash.
const worker = await engine.runWorker({ concurrency: 2, leaseMs: 1000, pollIntervalMs: 200, queues: ['ai-refund'] });
process.stdout.write(`ready ${worker.workerId}\n`);
process.on('SIGTERM', () => void engine.close().then(() => process.exit(0)));
