/**
 * Admission overhead: drain rate of one-step runs with no queue limits versus a
 * queue with a concurrency limit and TENANTS tenants (concurrency keys; default 100), same
 * machine, same run, median of REPS repetitions (the two drains of each take turns going
 * first), and the median of each repetition's own ratio; and the WAL each drain writes per run.
 *
 *   npx tsx bench/admission.ts            # embedded PostgreSQL
 *   RUNS=5000 REPS=3 DATABASE_URL=... npx tsx bench/admission.ts
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import pg from 'pg';
import { createEngine } from '../src/index.js';
import { startEmbeddedPostgres } from '../src/dev/index.js';

const RUNS = Number(process.env.RUNS ?? 5_000);
const REPS = Number(process.env.REPS ?? 3);
const CONCURRENCY = 16;
const TENANTS = Number(process.env.TENANTS ?? 100);
if (!Number.isInteger(TENANTS) || TENANTS < 1) throw new Error(`TENANTS must be a whole number >= 1, got ${process.env.TENANTS}`);

const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres({ dataDir: '.runledger/bench-pg' });
const adminUrl = process.env.DATABASE_URL ?? embedded!.connectionString;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();

/** Runs per second of one drain, and the WAL it wrote per run (the cluster's: nothing else should run on it). */
async function drain(limited: boolean, rep: number): Promise<{ rate: number; walPerRun: number }> {
  const database = `rl_admission_${limited ? 'limited' : 'free'}_${rep}_${process.pid}`;
  await admin.query(`create database ${database}`);
  // PROFILE=1: the time spent in each SQL function during the drain, printed after it.
  if (process.env.PROFILE) await admin.query(`alter database ${database} set track_functions = 'all'`);
  const url = new URL(adminUrl);
  url.pathname = `/${database}`;
  const engine = createEngine({ connectionString: url.toString(), poolMax: CONCURRENCY + 6, log: () => {} });
  try {
    await engine.migrate();
    const wf = engine.workflow({ name: 'one-step', queue: 'work' }, async (ctx, input: { n: number }) => ctx.step('only', () => input.n));
    await engine.start(wf, { n: -1 }).then((h) => h.runId); // registers the workflow; finished by the worker below
    if (limited) await engine.setQueue('work', { concurrency: CONCURRENCY, perKeyConcurrency: 4 });
    await engine.pool.query(
      `select runledger.start_run('one-step', jsonb_build_object('n', g), jsonb_build_object('concurrency_key', 'tenant-' || (g % $2::int))) from generate_series(1, $1::int) g`,
      [RUNS, TENANTS],
    );
    if (process.env.PROFILE) await engine.pool.query('select pg_stat_reset()'); // only the drain is profiled
    const wal0 = (await engine.pool.query<{ lsn: string }>('select pg_current_wal_insert_lsn()::text as lsn')).rows[0]!.lsn;
    const t0 = performance.now();
    const worker = await engine.runWorker({
      concurrency: CONCURRENCY,
      pollIntervalMs: 1_000,
      ...(process.env.FETCH_BATCH ? { fetchBatchSize: Number(process.env.FETCH_BATCH) } : {}),
    });
    for (;;) {
      const r = await engine.pool.query(`select count(*)::int as n from runledger.runs where status = 'SUCCEEDED'`);
      if (r.rows[0].n >= RUNS + 1) break;
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    const seconds = (performance.now() - t0) / 1000;
    const wal = await engine.pool.query<{ bytes: string }>(
      'select pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::pg_lsn)::text as bytes',
      [wal0],
    );
    await worker.stop();
    if (process.env.PROFILE) {
      await new Promise((resolve) => setTimeout(resolve, 700)); // statistics reach the collector
      const top = await engine.pool.query(
        `select funcname, calls, round(total_time::numeric) as total_ms, round(self_time::numeric) as self_ms
           from pg_stat_user_functions order by self_time desc limit 12`,
      );
      console.error(`${limited ? 'limited' : 'free'} queue, ${RUNS} runs in ${seconds.toFixed(2)} s:`);
      console.error(
        top.rows.map((r) => `  ${r.funcname.padEnd(26)} calls ${r.calls}  total ${r.total_ms} ms  self ${r.self_ms} ms`).join('\n'),
      );
    }
    return { rate: RUNS / seconds, walPerRun: Number(wal.rows[0]!.bytes) / RUNS };
  } finally {
    await engine.close();
    await admin.query(`drop database ${database} with (force)`);
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const free: number[] = [];
const limited: number[] = [];
const walFree: number[] = [];
const walLimited: number[] = [];
// The two drains of a repetition take turns going first (free, limited; then limited,
// free; ...): a drain that follows another one's database drop, or a slow moment of the
// machine, then falls on each kind alike. Each repetition's own ratio is kept too, and their
// median is the steadier figure: a slow minute moves both drains of one repetition.
const pairRatios: number[] = [];
for (let rep = 0; rep < REPS; rep++) {
  const order = rep % 2 === 0 ? [false, true] : [true, false];
  const rates: Record<string, number> = {};
  for (const isLimited of order) {
    const d = await drain(isLimited, rep);
    rates[String(isLimited)] = d.rate;
    (isLimited ? limited : free).push(d.rate);
    (isLimited ? walLimited : walFree).push(d.walPerRun);
  }
  pairRatios.push(rates['true']! / rates['false']!);
}
const result = {
  date: new Date().toISOString(),
  runs: RUNS,
  repetitions: REPS,
  concurrency: CONCURRENCY,
  tenants: TENANTS,
  noLimitsRunsPerSec: Math.round(median(free)),
  limitedRunsPerSec: Math.round(median(limited)),
  ratioLimitedToFree: Number((median(limited) / median(free)).toFixed(2)),
  // The median of each repetition's limited / free (the two drains run back to back).
  medianRatioOfPairs: Number(median(pairRatios).toFixed(2)),
  // WAL written during the drain per run (the worker's writes; median).
  walBytesPerRun: { noLimits: Math.round(median(walFree)), limited: Math.round(median(walLimited)) },
  samples: { free: free.map(Math.round), limited: limited.map(Math.round), pairRatios: pairRatios.map((r) => Number(r.toFixed(2))) },
};
console.log(JSON.stringify(result, null, 2));
mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
const name = `admission-${result.date.slice(0, 10)}${TENANTS === 100 ? '' : `-${TENANTS}-tenants`}.json`;
writeFileSync(new URL(`./results/${name}`, import.meta.url), `${JSON.stringify(result, null, 2)}\n`);
await admin.end();
await embedded?.stop();
