/**
 * A worker process for the coding-agent demo. With CRASH_AFTER_MERGE=1 it SIGKILLs
 * itself right after the git provider accepted the merge and before the operation's
 * outcome is checkpointed (the engine's crashAt point, a test facility), as a machine
 * lost at the worst moment would.
 *
 * Environment: DATABASE_URL, PROVIDER_URL, CRASH_AFTER_MERGE. Prints "ready <workerId>".
 */
import { createEngine } from '../../src/index.js';
import { defineCodingAgent } from './agent.js';

const engine = createEngine({
  connectionString: process.env.DATABASE_URL!,
  crashAt: process.env.CRASH_AFTER_MERGE === '1' ? [{ when: 'after-call', step: 'tool:merge_pr', action: 'kill' }] : [],
  log: (level, message) => level !== 'info' && process.stderr.write(`[worker ${process.pid}] ${message}\n`),
});
defineCodingAgent(engine, { providerUrl: process.env.PROVIDER_URL! });
// A short lease, so that the next worker takes the run over about a second after a crash.
const worker = await engine.runWorker({ concurrency: 2, leaseMs: 1000, pollIntervalMs: 200 });
process.stdout.write(`ready ${worker.workerId}\n`);
process.on('SIGTERM', () => void engine.close().then(() => process.exit(0)));
