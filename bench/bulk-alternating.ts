/**
 * Bulk enqueue, batch by batch in alternation: one batch of BATCH jobs of each system and
 * path in turn, ROUNDS times, each system on a database of its own on the same server, and
 * the median time per batch of each. Why beside bulk_enqueue: that workload times 20,000
 * jobs per system one after the other, half a second each, and on a shared machine a slow
 * second lands on one system only (repetitions of the same build spread by 30 % and more).
 * Here a slow moment hits the batches of every system around it, and the median of many
 * batches drops it. The tables grow alike (ROUNDS × BATCH rows each), as a user's do.
 *
 *   npx tsx bulk-alternating.ts                                  # embedded PostgreSQL
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres ROUNDS=200 npx tsx bulk-alternating.ts
 *
 * Prints a markdown table: median ms per batch, jobs/s from it, and each runledger path's
 * ratio to the peers' path of the same kind.
 */
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { startEmbeddedPostgres } from 'runledger/dev';
import { createDatabase, dropDatabase } from './lib/db.js';
import { PLANS } from './lib/plans.js';
import { median } from './lib/stats.js';
import { systemById } from './systems/index.js';
import type { BulkPaths } from './systems/types.js';

const ROUNDS = Number(process.env.ROUNDS ?? 200);
const BATCH = Number(process.env.BATCH ?? 1_000);
const SYSTEM_IDS = (process.env.SYSTEMS ?? 'runledger,graphile-worker,pg-boss').split(',');
for (const [name, value] of [
  ['ROUNDS', ROUNDS],
  ['BATCH', BATCH],
] as const) {
  if (!Number.isInteger(value) || value < 1) throw new Error(`${name} must be a whole number >= 1, got ${value}`);
}

const here = fileURLToPath(new URL('.', import.meta.url));
const embedded = process.env.DATABASE_URL
  ? undefined
  : await startEmbeddedPostgres({ dataDir: join(here, '..', '.runledger', 'bench-pg') });
const adminUrl = process.env.DATABASE_URL ?? embedded!.connectionString;
const plan = PLANS.one;

interface Lane {
  label: string;
  kind: 'api' | 'sqlBatch';
  run: (inputs: number[]) => Promise<number>;
  ms: number[];
}

const opened: Array<{ bulk: BulkPaths; database: string }> = [];
const lanes: Lane[] = [];
try {
  for (const id of SYSTEM_IDS) {
    const system = systemById(id);
    const database = `bulk_alt_${id.replace(/[^a-z0-9]/g, '_')}_${process.pid}`;
    const url = await createDatabase(adminUrl, database);
    await system.setup(url, plan);
    const bulk = await system.bulk!(url, plan, 4);
    opened.push({ bulk, database });
    for (const kind of ['api', 'sqlBatch'] as const) {
      const run = bulk[kind];
      if (run) lanes.push({ label: `${system.label} ${kind === 'api' ? 'client batch call' : 'SQL batch function'}`, kind, run, ms: [] });
    }
  }
  let next = 0;
  const inputs = () => Array.from({ length: BATCH }, () => next++);
  // One untimed batch each first: connections, cached plans, the workflow registered.
  for (const lane of lanes) await lane.run(inputs());
  for (let round = 0; round < ROUNDS; round++) {
    for (const lane of lanes) {
      const t0 = performance.now();
      const n = await lane.run(inputs());
      lane.ms.push(performance.now() - t0);
      if (n !== BATCH) throw new Error(`${lane.label}: ${n} jobs enqueued, expected ${BATCH}`);
    }
    if ((round + 1) % 50 === 0) process.stderr.write(`[bulk-alternating] ${round + 1}/${ROUNDS} rounds\n`);
  }
} finally {
  for (const { bulk, database } of opened) {
    await bulk.close().catch(() => undefined);
    await dropDatabase(adminUrl, database);
  }
  await embedded?.stop();
}

/** Every lane ran ROUNDS >= 1 batches, so each has a median. */
const medianMs = (lane: Lane) => median(lane.ms)!;
const ours = (kind: Lane['kind']) => lanes.find((l) => l.kind === kind && l.label.startsWith('runledger'));
console.log(
  `| batches of ${BATCH.toLocaleString('en')}, ${ROUNDS} rounds in alternation | median ms per batch | jobs/s | runledger ÷ this |`,
);
console.log('| --- | ---: | ---: | ---: |');
for (const lane of lanes) {
  const ms = medianMs(lane);
  const mine = ours(lane.kind);
  const ratio = mine && mine !== lane ? (ms / medianMs(mine)).toFixed(2) : '';
  console.log(`| ${lane.label} | ${ms.toFixed(2)} | ${Math.round((BATCH / ms) * 1000).toLocaleString('en')} | ${ratio} |`);
}
