/**
 * The web console's run list at 1,000,000 runs: how long its pages take through HTTP.
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx bench/console-list.ts
 *   RUNS=200000 npx tsx bench/console-list.ts          # embedded PostgreSQL, fewer runs
 *
 * Fills a fresh database with RUNS runs in one INSERT ... SELECT from generate_series (the
 * columns start_run writes, plus what finishing writes: a realistic mix of 20 workflows,
 * 5 queues, 50 concurrency keys, ~90% SUCCEEDED, 5% FAILED, 3% WAITING, 1.5% PENDING,
 * 0.4% CANCELLED, 0.1% DEAD_LETTER), VACUUM ANALYZEs it, starts the console on it and
 * times each page (the median of REPEAT requests, after one warm-up) and each query alone.
 * Not a test: it prints a table (and bench/results/console-list-<date>.json); the database is dropped.
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import pg from 'pg';
import { createEngine } from '../src/index.js';
import { startEmbeddedPostgres } from '../src/dev/index.js';
import { startConsole } from '../src/console/server.js';
import { listRuns, statusCounts, type RunFilters } from '../src/console/queries.js';

const RUNS = Number(process.env.RUNS ?? 1_000_000);
const REPEAT = Number(process.env.REPEAT ?? 9);

const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres({ dataDir: '.runledger/bench-pg' });
const adminUrl = process.env.DATABASE_URL ?? embedded!.connectionString;
const database = 'console_bench';
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
await admin.query(`drop database if exists ${database}`);
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const results: Array<{ what: string; ms: number; rows?: number }> = [];

try {
  const engine = createEngine({ connectionString: url.toString(), log: () => {} });
  await engine.migrate();
  await engine.close();
  const pool = new pg.Pool({ connectionString: url.toString(), max: 6 });
  let t0 = performance.now();
  // Ids sort like ULIDs: a fixed prefix, then the row number, so a higher number is a newer run.
  await pool.query(
    `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, concurrency_key, status, input, output, error,
                                 wait_kind, wait_key, started_at, finished_at, termination_reason, terminated_at, fencing_token,
                                 created_at, updated_at)
     select id, 'workflow-' || (g % 20), '1', 'queue-' || (g % 5), 'tenant-' || (g % 50), st,
            jsonb_build_object('order', g), case when st = 'SUCCEEDED' then '{"ok":true}'::jsonb end,
            case when st in ('FAILED', 'DEAD_LETTER') then '{"name":"Error","message":"boom"}'::jsonb end,
            case when st = 'WAITING' then 'signal' end, case when st = 'WAITING' then 'go' end,
            case when st <> 'PENDING' then at end,
            case when st in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'DEAD_LETTER') then at + interval '2 seconds' end,
            case st when 'SUCCEEDED' then 'COMPLETED' when 'FAILED' then 'FAILED' when 'CANCELLED' then 'CANCELLED'
                    when 'DEAD_LETTER' then 'MAX_RECOVERY_ATTEMPTS' end,
            case when st in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'DEAD_LETTER') then at + interval '2 seconds' end,
            1, at, at
       from (select g, '01KB' || lpad(g::text, 22, '0') as id,
                    timestamptz '2026-01-01' + g * interval '1 second' as at,
                    (case when g % 1000 = 7 then 'DEAD_LETTER' when g % 1000 < 4 then 'CANCELLED'
                          when g % 100 < 5 then 'FAILED' when g % 100 < 8 then 'WAITING'
                          when g % 200 < 19 and g % 100 >= 8 then 'PENDING' else 'SUCCEEDED' end)::runledger.run_status as st
               from generate_series(1, $1::int) g) s`,
    [RUNS],
  );
  const insertS = (performance.now() - t0) / 1000;
  t0 = performance.now();
  await pool.query('vacuum analyze runledger.runs');
  const vacuumS = (performance.now() - t0) / 1000;
  const counts = await pool.query('select status, count(*)::int as n from runledger.runs group by 1 order by 1');
  console.log(`inserted ${RUNS} runs in ${insertS.toFixed(1)} s, vacuum analyze ${vacuumS.toFixed(1)} s:`, counts.rows);

  const ids = await pool.query<{ deep: string; part: string }>(
    `select (select run_id from runledger.runs order by run_id desc offset ${Math.floor(RUNS * 0.9)} limit 1) as deep,
            substr((select run_id from runledger.runs order by run_id desc offset 12345 limit 1), 14) as part`,
  );
  const { deep, part } = ids.rows[0]!;
  const whole = `01KB${String(RUNS - 500).padStart(22, '0')}`;

  const running = await startConsole({ pool, port: 0 });
  const pages: Array<[string, string]> = [
    ['first page, no filter', '/runs'],
    ['deep keyset page (90% down)', `/runs?before=${deep}`],
    ['status FAILED', '/runs?status=FAILED'],
    ['status DEAD_LETTER (0.1%)', '/runs?status=DEAD_LETTER'],
    ['status WAITING, deep page', `/runs?status=WAITING&before=${deep}`],
    ['workflow workflow-7', '/runs?workflow=workflow-7'],
    ['workflow + status FAILED', '/runs?workflow=workflow-7&status=FAILED'],
    ['queue queue-3 (no index)', '/runs?queue=queue-3'],
    ['concurrency key tenant-9 (no index)', '/runs?key=tenant-9'],
    ['run id search, a part of one id', `/runs?q=${part}`],
    ['run id search, a whole id', `/runs?q=${whole}`],
  ];
  for (const [what, path] of pages) {
    const times: number[] = [];
    let bytes = 0;
    for (let i = 0; i <= REPEAT; i++) {
      const start = performance.now();
      const response = await fetch(`${running.url}${path}`);
      const text = await response.text();
      if (response.status !== 200) throw new Error(`${path}: HTTP ${response.status}`);
      bytes = text.length;
      if (i > 0) times.push(performance.now() - start); // the first request warms the cache and the plan
    }
    results.push({ what: `page: ${what}`, ms: median(times) });
    console.log(`${what.padEnd(40)} ${median(times).toFixed(1).padStart(8)} ms  (${(bytes / 1024).toFixed(0)} KiB)`);
  }
  // The two queries behind a page, alone: the list and the counts per status.
  const alone = async (what: string, fn: () => Promise<unknown>) => {
    const times: number[] = [];
    for (let i = 0; i <= REPEAT; i++) {
      const start = performance.now();
      await fn();
      if (i > 0) times.push(performance.now() - start);
    }
    results.push({ what, ms: median(times) });
    console.log(`${what.padEnd(40)} ${median(times).toFixed(1).padStart(8)} ms`);
  };
  const none: RunFilters = { status: [] };
  await alone('query: list, first page', () => listRuns(pool, none, {}));
  await alone('query: counts per status, no filter', () => statusCounts(pool, none));
  await alone('query: counts per status, workflow', () => statusCounts(pool, { status: [], workflow: 'workflow-7' }));
  await alone('query: counts per status, queue', () => statusCounts(pool, { status: [], queue: 'queue-3' }));
  await running.close();
  await pool.end();
  mkdirSync('bench/results', { recursive: true });
  const file = `bench/results/console-list-${new Date().toISOString().slice(0, 10)}.json`;
  const server = (await admin.query<{ server_version: string }>('show server_version')).rows[0]!.server_version;
  writeFileSync(file, JSON.stringify({ runs: RUNS, repeat: REPEAT, postgres: server, insertS, results }, null, 2));
  console.log(`wrote ${file} (PostgreSQL ${server})`);
} finally {
  await admin.query(`drop database if exists ${database} with (force)`);
  await admin.end();
  await embedded?.stop();
}
