/**
 * A worker process for the drills: `node --import tsx test/drills/drill-worker.ts`.
 * Environment: DATABASE_URL (one host, or several with target_session_attrs=read-write),
 * CONCURRENCY, LEASE_MS. Every log line of the engine goes to stderr, so the drill can
 * count them per outage. Prints "ready <workerId>"; SIGTERM stops it gracefully (exit 0).
 */
import { createEngine } from '../../src/index.js';
import { defineDrillWorkflows } from './drill-workflows.js';

const engine = createEngine({
  connectionString: process.env.DATABASE_URL!,
  log: (level, message, meta) => {
    process.stderr.write(`[worker ${process.pid}] ${level}: ${message}${meta ? ` ${JSON.stringify(meta).slice(0, 300)}` : ''}\n`);
  },
});
defineDrillWorkflows(engine);
const worker = await engine.runWorker({
  concurrency: Number(process.env.CONCURRENCY ?? 16),
  leaseMs: Number(process.env.LEASE_MS ?? 3000),
  pollIntervalMs: 200,
});
process.stdout.write(`ready ${worker.workerId}\n`);

process.on('SIGTERM', () => {
  void engine.close().then(() => process.exit(0));
});
