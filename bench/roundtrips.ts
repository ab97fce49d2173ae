/**
 * Counts what one workflow step costs: client round trips (every query the
 * engine's and graphile-worker's pools send) and commits (pg_stat_database
 * xact_commit) per checkpointed step, for N three-step workflows at concurrency 16.
 *
 *   npx tsx bench/roundtrips.ts            # embedded PostgreSQL
 *   DATABASE_URL=postgres://... npx tsx bench/roundtrips.ts
 *
 * Not a test: it prints figures, it asserts nothing.
 */
import { createRequire } from 'node:module';
import type PgModule from 'pg';
// The pg that ../src uses (bench/ has its own copy in bench/node_modules for the peers).
const pg = createRequire(new URL('../src/index.ts', import.meta.url))('pg') as typeof PgModule;
import { createEngine } from '../src/index.js';
import { startEmbeddedPostgres } from '../src/dev/index.js';

const RUNS = Number(process.env.RUNS ?? 2_000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);

let queries = 0;
const originalQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function countedQuery(this: pg.Client, ...args: unknown[]) {
  queries++;
  return (originalQuery as (...a: unknown[]) => unknown).apply(this, args);
} as typeof pg.Client.prototype.query;

const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres({ dataDir: '.runledger/bench-pg' });
const adminUrl = process.env.DATABASE_URL ?? embedded!.connectionString;
const database = `rl_roundtrips_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;

const engine = createEngine({ connectionString: url.toString(), poolMax: CONCURRENCY + 4 });
await engine.migrate();
await engine.pool.query('create table business (run_id text primary key, n int)');
const wf = engine.workflow({ name: 'three' }, async (ctx, input: { n: number }) => {
  const a = await ctx.step('a', () => input.n);
  await ctx.transaction('b', async (trx) => {
    await trx.insertInto('business').values({ run_id: ctx.runId, n: a }).execute();
  });
  return ctx.step('c', () => a + 1);
});

// Warm-up: prepared statements, pool connections.
{
  const warm = await engine.runWorker({ concurrency: CONCURRENCY, pollIntervalMs: 1_000 });
  await Promise.all(Array.from({ length: 32 }, async (_, n) => (await engine.start(wf, { n })).result()));
  await warm.stop();
}

const probe = new pg.Client({ connectionString: url.toString() });
await probe.connect();
let adminQueries = 0;
const adminQuery = (text: string, values?: unknown[]) => {
  adminQueries++;
  return probe.query(text, values);
};
const commits = async () => {
  await new Promise((resolve) => setTimeout(resolve, 1_500)); // stats are flushed about once a second
  const r = await adminQuery('select xact_commit::bigint as c from pg_stat_database where datname = $1', [database]);
  return Number(r.rows[0].c);
};

// Phase 1: enqueue, 16 starts in flight at a time.
const t0 = performance.now();
for (let n = 0; n < RUNS; n += CONCURRENCY) {
  await Promise.all(Array.from({ length: Math.min(CONCURRENCY, RUNS - n) }, (_, i) => engine.start(wf, { n: n + i })));
}
const enqueueMs = performance.now() - t0;

// Phase 2: drain with one worker; only the worker's queries are counted.
const commitsBefore = await commits();
const queriesBefore = queries;
const adminBefore = adminQueries;
const t1 = performance.now();
const worker = await engine.runWorker({ concurrency: CONCURRENCY, pollIntervalMs: 1_000 });
for (;;) {
  const r = await adminQuery(`select count(*)::int as n from runledger.runs where status = 'SUCCEEDED'`);
  if (r.rows[0].n >= RUNS + 32) break;
  await new Promise((resolve) => setTimeout(resolve, 20));
}
const drainMs = performance.now() - t1;
await worker.stop();
const commitsUsed = (await commits()) - commitsBefore - (adminQueries - adminBefore);
const queriesUsed = queries - queriesBefore - (adminQueries - adminBefore);

const steps = RUNS * 3;
const perSecond = (count: number, ms: number) => (count / (ms / 1000)).toFixed(0);
console.log(`runs: ${RUNS} three-step workflows (step, transaction step, step), concurrency ${CONCURRENCY}`);
console.log(`enqueue: ${perSecond(RUNS, enqueueMs)} starts/s`);
console.log(`drain:   ${perSecond(RUNS, drainMs)} workflows/s, ${perSecond(steps, drainMs)} steps/s (worker start included)`);
console.log(
  `worker round trips: ${(queriesUsed / steps).toFixed(2)} per step (${(queriesUsed / RUNS).toFixed(2)} per workflow: dispatch, claim, 3 checkpoints, completion, heartbeats)`,
);
console.log(`worker commits:     ${(commitsUsed / steps).toFixed(2)} per step (${(commitsUsed / RUNS).toFixed(2)} per workflow)`);

await probe.end();
await engine.close();
await admin.query(`drop database ${database} with (force)`);
await admin.end();
await embedded?.stop();
