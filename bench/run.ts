/**
 * The benchmark: runledger against DBOS, graphile-worker and pg-boss on ONE
 * PostgreSQL (embedded by default, or DATABASE_URL), each system on a fresh
 * database per workload and repetition, each measurement in a child process.
 *   cd bench && npm ci && npm start          # full run
 *   BENCH_QUICK=1 npm start                  # smoke run (small sizes, 1 repetition)
 * Results: bench/results/<YYYY-MM-DD>.md and .json (-<BENCH_NAME> and -quick suffixes when set).
 * Never run by `npm test`.
 */
import { existsSync } from 'node:fs';
import { loadavg } from 'node:os';
import { join } from 'node:path';
import { startEmbeddedPostgres } from 'runledger/dev';
import { config } from './lib/config.js';
import { createDatabase, dropDatabase, withAdmin } from './lib/db.js';
import { machineInfo } from './lib/machine.js';
import { HISTORY_DESCRIPTION, familyOf } from './lib/history.js';
import { buildRows, cell, historyRows, markdownTable, ratio, sizesLine, writeResults, type Row } from './lib/report.js';
import { BENCH_DIR, spawnTs, waitForExit, waitForLine } from './lib/spawn.js';
import { median } from './lib/stats.js';
import { SYSTEMS } from './systems/index.js';
import { pgLimit } from './workloads/pg-limit.js';
import type { Measurement } from './workloads/types.js';
import { WORKLOADS } from './workloads/index.js';
import { WAITING_STATUS, waitingNotImplemented } from './workloads/waiting.js';

if (!existsSync(join(BENCH_DIR, '..', 'dist', 'index.js'))) {
  console.error('runledger is not built: run `npm ci && npm run build` at the top level first');
  process.exit(1);
}

const selected = (name: string) => !config.workloads || config.workloads.includes(name);
const systems = SYSTEMS.filter((s) => !config.systems || config.systems.includes(s.id));
const workloads = WORKLOADS.filter((w) => selected(w.name));
const started = new Date();
const log = (message: string) => console.log(`[${((Date.now() - started.getTime()) / 1000).toFixed(0).padStart(5)} s] ${message}`);

const startEmbedded = () => startEmbeddedPostgres({ dataDir: join(BENCH_DIR, '..', '.runledger', 'bench-pg') });
let embedded = config.databaseUrl ? undefined : await startEmbedded();
// The embedded server is the harness's own: it gets pg_stat_statements (server time by statement) unless
// BENCH_PGSS=0. A server given by DATABASE_URL is never reconfigured: without the library its figures are n/a.
if (embedded && process.env.BENCH_PGSS !== '0') {
  const loaded = await withAdmin(
    embedded.connectionString,
    async (c) => (await c.query(`select current_setting('shared_preload_libraries') as v`)).rows[0].v as string,
  );
  if (!loaded.split(',').some((l) => l.trim() === 'pg_stat_statements')) {
    await withAdmin(embedded.connectionString, (c) => c.query(`alter system set shared_preload_libraries = 'pg_stat_statements'`));
    await embedded.stop();
    embedded = await startEmbedded();
  }
}
const adminUrl = config.databaseUrl ?? embedded!.connectionString;
const stopServer = async () => void (await embedded?.stop().catch(() => undefined));
process.once('SIGINT', () => void stopServer().then(() => process.exit(130)));

try {
  const machine = await machineInfo(
    adminUrl,
    embedded ? 'embedded (runledger startEmbeddedPostgres, ../.runledger/bench-pg)' : 'DATABASE_URL',
  );
  log(
    `${machine.nproc} cores, ${machine.memoryGiB} GiB, ${machine.postgres.version.split(' on ')[0]}, Node ${machine.node}; ${sizesLine()}`,
  );

  // pg_limit: what this server commits with one INSERT per transaction.
  const pgbench: Record<string, number[]> = { '8': [], '1': [] };
  let pgbenchPath = '';
  if (selected('pg_limit')) {
    for (let rep = 1; rep <= config.reps; rep++) {
      for (const clients of [8, 1]) {
        const url = await createDatabase(adminUrl, 'bench_pg_limit');
        try {
          const r = await pgLimit(url, clients);
          pgbenchPath = r.pgbench;
          pgbench[String(clients)]!.push(r.commitsPerSec);
          log(`pg_limit rep ${rep}: pgbench ${clients} client(s): ${r.commitsPerSec.toFixed(0)} commits/s`);
        } finally {
          await dropDatabase(adminUrl, 'bench_pg_limit');
        }
      }
    }
  }

  // Every other workload: reps × systems, interleaved so drift hits every system alike.
  const results: Record<string, Record<string, Measurement[]>> = {};
  for (const workload of workloads) {
    results[workload.name] = {};
    for (let rep = 1; rep <= config.reps; rep++) {
      for (const system of systems.filter((s) => workload.runsOn(s))) {
        const earlier = results[workload.name]![system.id] ?? [];
        if (workload.settledBy && earlier.some((m) => workload.settledBy!(m))) continue;
        const load1 = loadavg()[0]!;
        const database = `bench_${workload.name}_${system.id.replace(/-/g, '_')}`;
        const url = await createDatabase(adminUrl, database);
        const child = spawnTs('child.ts', {
          BENCH_TASK: JSON.stringify({ workload: workload.name, system: system.id, url, adminUrl, database }),
        });
        let measurement: Measurement;
        try {
          measurement = JSON.parse(await waitForLine(child, 'RESULT', 30 * 60_000)) as Measurement;
        } catch (error) {
          measurement = { error: (error as Error).message };
        }
        if (!(await waitForExit(child, 30_000))) child.kill('SIGKILL');
        await dropDatabase(adminUrl, database);
        measurement.load1Before = Math.round(load1 * 100) / 100;
        (results[workload.name]![system.id] ??= []).push(measurement);
        log(`${workload.name} rep ${rep} ${system.label}: ${JSON.stringify(measurement)}`);
      }
    }
  }

  // Report.
  const rows: Row[] = historyRows(buildRows(workloads, systems, results), workloads, systems, results);
  const pg8 = median(pgbench['8']!);
  const pg1 = median(pgbench['1']!);
  if (pg8 !== undefined) {
    const fraction = (workload: string, metric: string, label: string) => {
      const source = rows.find((r) => r.workload === workload && r.metric === metric);
      if (!source) return;
      const cells: Row['cells'] = {};
      for (const s of systems) {
        const v = source.cells[s.id]?.value;
        cells[s.id] = v === undefined ? { text: '—' } : { value: v / pg8, text: `${((v / pg8) * 100).toFixed(1)}%` };
      }
      rows.push({ workload: 'pg_limit', metric: label, better: 'higher', cells });
    };
    fraction('queue', 'drain (jobs/s)', 'queue jobs/s ÷ pgbench 8-client commits/s');
    fraction('workflow3', 'steps/s', 'workflow3 steps/s ÷ pgbench 8-client commits/s');
    fraction('txstep', 'transaction steps/s', 'txstep steps/s ÷ pgbench 8-client commits/s');
  }
  const waitingRow: Row = {
    workload: 'waiting',
    metric: '100,000 waiting runs: RSS, bytes/run, resume rate',
    better: 'higher',
    cells: Object.fromEntries(systems.map((s) => [s.id, { text: s.id === 'runledger' ? WAITING_STATUS : '—' }])),
  };
  if (selected('waiting')) rows.push(waitingRow);

  const loads = Object.values(results)
    .flatMap((bySystem) =>
      Object.values(bySystem)
        .flat()
        .map((m) => m.load1Before),
    )
    .filter((v): v is number => typeof v === 'number');
  const loadLine = loads.length
    ? `1-minute load average just before each measurement: median ${median(loads)!.toFixed(2)}, max ${Math.max(...loads).toFixed(2)} on ${machine.nproc} cores (anything well above 1 means something else was running).`
    : '';
  const pgssLoaded = machine.postgres.shared_preload_libraries.split(',').some((l: string) => l.trim() === 'pg_stat_statements');
  const statementsLine = pgssLoaded
    ? embedded
      ? 'The embedded server was started with shared_preload_libraries = pg_stat_statements (every system alike).'
      : 'This server loads pg_stat_statements.'
    : 'This server does not load pg_stat_statements (shared_preload_libraries is empty or lacks it) and was not reconfigured: n/a.';
  const topStatements = workloads.flatMap((w) =>
    systems.flatMap((s) => {
      const reps = results[w.name]?.[s.id] ?? [];
      const texts = Object.entries(reps[Math.floor(reps.length / 2)] ?? {}).filter(
        ([k, v]) => /(^t|T)op$/.test(k) && typeof v === 'string',
      );
      return texts.map(([k, v]) => `- ${w.name}${k === 'top' ? '' : ` (${k.replace(/Top$/, '')})`}, ${s.label}: ${v}`);
    }),
  );
  const date = started.toISOString().slice(0, 10);
  const name = [date, config.name, config.quick ? 'quick' : undefined].filter(Boolean).join('-');
  const capNote = `\\* the drain hit the ${config.drainCapSeconds} s cap (BENCH_DRAIN_CAP_S): the rate is completed jobs over the capped time.`;
  const markdown = [
    `# runledger benchmark, ${date}${config.quick ? ' (quick mode: small sizes, not for quoting)' : ''}`,
    '',
    `Command: \`cd bench && ${config.quick ? 'BENCH_QUICK=1 ' : ''}npm start\`${config.databaseUrl ? ' with DATABASE_URL' : ''}. Each figure is the median of ${config.reps} repetition(s); each repetition runs in its own process on a fresh database.`,
    '',
    '## Machine',
    '',
    `| | |`,
    `| --- | --- |`,
    `| cores (nproc) | ${machine.nproc} (${machine.cpu}) |`,
    `| memory | ${machine.memoryGiB} GiB |`,
    `| PostgreSQL | ${machine.postgres.version} — ${machine.postgres.server}; fsync ${machine.postgres.fsync}, synchronous_commit ${machine.postgres.synchronous_commit}, shared_buffers ${machine.postgres.shared_buffers}; databases created with collation ${machine.postgres.database_collation} |`,
    `| Node | ${machine.node} |`,
    `| load | ${loadLine} |`,
    ...Object.entries(machine.versions).map(([k, v]) => `| ${k} | ${v} |`),
    '',
    `pgbench (${pgbenchPath || 'not run'}; one INSERT per transaction, ${config.pgbenchSeconds} s, prepared): **${pg8 === undefined ? '—' : pg8.toFixed(0)} commits/s with 8 clients, ${pg1 === undefined ? '—' : pg1.toFixed(0)} with 1 client**.`,
    '',
    '## Results',
    '',
    `Sizes: ${sizesLine()}. ↓ = lower is better; the ratio columns are runledger ÷ peer for every metric (above 1 means runledger is higher: better for ↑ rows, worse for ↓ rows).`,
    '',
    markdownTable(rows, systems),
    '',
    capNote,
    '',
    ...(topStatements.length
      ? [
          '## Top statements',
          '',
          'Per workload and system, from the middle repetition: share of server time, calls, mean time, statement.',
          '',
          ...topStatements,
          '',
        ]
      : []),
    '## Systems',
    '',
    ...systems.map((s) => `- **${s.label}**: ${s.settings}.`),
    `- Every system gets the same pool size (${config.poolMax}) and concurrency (${config.concurrency}); durability is PostgreSQL's default (no synchronous_commit=off, no UNLOGGED tables).`,
    '',
    '## Workloads',
    '',
    ...workloads.map((w) => `- **${w.name}**: ${w.description}`),
    ...(workloads.some((w) => w.name.endsWith('_history'))
      ? [
          '- **History** (the _history workloads), per system, in its own tables (bench/lib/history.ts has the SQL):',
          ...[...new Set(systems.map((s) => familyOf(s.id)))].map((f) => `  - ${f}: ${HISTORY_DESCRIPTION[f]}.`),
          '- **history ÷ fresh** rows: the median with history over the median of the fresh workload, per system (above 1: higher with history).',
        ]
      : []),
    `- **pg_limit**: pgbench, custom script of one INSERT per transaction, 8 clients (-j 2) and 1 client, ${config.pgbenchSeconds} s each.`,
    `- **waiting**: ${WAITING_STATUS}.`,
    `- Server time by statement (the "% of server time" rows): pg_stat_statements (track = top) over the measured window, reset for the benchmark database at its start; the share of the database's total statement execution time taken by the top statement and the top three. ${statementsLine}`,
    "- Round trips are every `pg` Client.query call made by the worker process during the drain (all copies of `pg` are patched: runledger loads its own from ../node_modules). Commits are the database's pg_stat_database.xact_commit delta over the drain, read from another database after every connection closed, minus the harness's own probe statements; every autocommit statement counts as one commit, read-only ones included.",
    '',
  ].join('\n');
  const json = {
    date: started.toISOString(),
    quick: config.quick,
    config,
    machine,
    systems: systems.map((s) => ({ id: s.id, label: s.label, settings: s.settings })),
    pgbench: { path: pgbenchPath, commitsPerSec8: pgbench['8'], commitsPerSec1: pgbench['1'], median8: pg8, median1: pg1 },
    waiting: waitingNotImplemented(),
    results,
    table: rows.map((r) => ({
      workload: r.workload,
      metric: r.metric,
      better: r.better,
      values: Object.fromEntries(Object.entries(r.cells).map(([k, c]) => [k, c.value ?? c.text])),
      ratios: r.noRatio
        ? {}
        : Object.fromEntries(
            systems.filter((s) => s.id !== 'runledger').map((s) => [s.id, ratio(r.cells.runledger?.value, r.cells[s.id]?.value)]),
          ),
    })),
  };
  const files = writeResults(name, markdown, json);
  console.log(`\n${markdownTable(rows, systems)}\n${capNote}\n`);
  log(`wrote ${files.md} and ${files.json}`);
} finally {
  await stopServer();
}
