/**
 * The durable-waits benchmark: N runs (default 100,000) parked on ctx.waitForSignal.
 * Measures worker RSS and database bytes per waiting run, then signals them all and
 * measures resumes per second and the peak number of runs RUNNING at once (which
 * must stay within the worker's concurrency).
 *
 *   npx tsx bench/waits-100k.ts                 # embedded PostgreSQL
 *   RUNS=20000 DATABASE_URL=postgres://... npx tsx bench/waits-100k.ts
 *
 * Not a test: it prints figures (and writes bench/results/waits-<date>.json).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import pg from 'pg';
import { createEngine } from '../src/index.js';
import { startEmbeddedPostgres } from '../src/dev/index.js';

const RUNS = Number(process.env.RUNS ?? 100_000);
const CONCURRENCY = Number(process.env.CONCURRENCY ?? 16);
const mib = (bytes: number) => (bytes / 1024 / 1024).toFixed(1);

const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres({ dataDir: '.runledger/bench-pg' });
const adminUrl = process.env.DATABASE_URL ?? embedded!.connectionString;
const database = `rl_waits_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;
const probe = new pg.Client({ connectionString: url.toString() });

const engine = createEngine({ connectionString: url.toString(), poolMax: CONCURRENCY + 6 });
await engine.migrate();
await probe.connect();
const wf = engine.workflow({ name: 'waiter' }, async (ctx, input: { n: number }) => {
  const reply = await ctx.waitForSignal<{ ok: boolean }>('go');
  return ctx.step('after', () => ({ n: input.n, ok: reply?.ok }));
});
await engine.start(wf, { n: -1 }).then((h) => engine.cancel(h.runId)); // registers the workflow

const dbBytes = async () =>
  Number(
    (
      await probe.query(`select sum(pg_total_relation_size(c.oid))::bigint as b from pg_class c join pg_namespace n on n.oid = c.relnamespace
                              where n.nspname in ('runledger', 'graphile_worker') and c.relkind in ('r', 'm')`)
    ).rows[0].b,
  );
const count = async (status: string) =>
  Number((await probe.query(`select count(*) from runledger.runs where status = $1`, [status])).rows[0].count);

const worker = await engine.runWorker({ concurrency: CONCURRENCY, pollIntervalMs: 1_000 });
global.gc?.();
const rssIdle = process.memoryUsage().rss;
const bytesBefore = await dbBytes();

// Start all runs from SQL in batches; the worker takes each to its wait.
const t0 = performance.now();
for (let done = 0; done < RUNS; done += 5_000) {
  const batch = Math.min(5_000, RUNS - done);
  await probe.query(`select runledger.start_run('waiter', jsonb_build_object('n', g)) from generate_series($1::int, $2::int) g`, [
    done,
    done + batch - 1,
  ]);
}
const startedMs = performance.now() - t0;
let rssPeakParking = 0;
while ((await count('WAITING')) < RUNS) {
  rssPeakParking = Math.max(rssPeakParking, process.memoryUsage().rss);
  await new Promise((resolve) => setTimeout(resolve, 250));
}
const parkedMs = performance.now() - t0;
global.gc?.();
const rssWaiting = process.memoryUsage().rss;
await probe.query('vacuum analyze runledger.runs, runledger.steps, runledger.events');
const bytesWaiting = await dbBytes();

// Signal them all at once (one SQL statement), then watch the resume storm.
const t1 = performance.now();
await probe.query(`select runledger.send_signal(run_id, 'go', '{"ok": true}') from runledger.runs where status = 'WAITING'`);
const signalMs = performance.now() - t1;
let peakRunning = 0;
for (;;) {
  const r = await probe.query(
    `select count(*) filter (where status = 'RUNNING') as running, count(*) filter (where status = 'SUCCEEDED') as done from runledger.runs`,
  );
  peakRunning = Math.max(peakRunning, Number(r.rows[0].running));
  if (Number(r.rows[0].done) >= RUNS) break;
  await new Promise((resolve) => setTimeout(resolve, 50));
}
const resumeMs = performance.now() - t1;
await worker.stop();

const result = {
  date: new Date().toISOString(),
  runs: RUNS,
  concurrency: CONCURRENCY,
  startRatePerSec: Math.round(RUNS / (startedMs / 1000)),
  parkRatePerSec: Math.round(RUNS / (parkedMs / 1000)),
  workerRssIdleMiB: Number(mib(rssIdle)),
  workerRssWithAllWaitingMiB: Number(mib(rssWaiting)),
  workerRssPeakWhileParkingMiB: Number(mib(rssPeakParking)),
  dbBytesPerWaitingRun: Math.round((bytesWaiting - bytesBefore) / RUNS),
  signalAllSeconds: Number((signalMs / 1000).toFixed(1)),
  resumesPerSec: Math.round(RUNS / (resumeMs / 1000)),
  peakRunning,
};
console.log(JSON.stringify(result, null, 2));
mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
writeFileSync(new URL(`./results/waits-${result.date.slice(0, 10)}.json`, import.meta.url), `${JSON.stringify(result, null, 2)}\n`);

await probe.end();
await engine.close();
await admin.query(`drop database ${database} with (force)`);
await admin.end();
await embedded?.stop();
