// The World under a crash test: runledger/workflow-world on an engine whose worker SIGKILLs its
// own process at the crash point CRASH_AT names (the engine's test-only crashAt option), with
// a one-second lease so that another server's worker takes its deliveries over quickly.
import { createEngine } from '../../../dist/index.js';
import { createWorld as createRunledgerWorld } from '../../../dist/workflow-world/index.js';

export function createWorld() {
  const crashAt = process.env.CRASH_AT ? JSON.parse(process.env.CRASH_AT) : undefined;
  const engine = createEngine({ connectionString: process.env.DATABASE_URL, crashAt });
  return createRunledgerWorld({ engine, leaseMs: Number(process.env.LEASE_MS ?? 1000) });
}
