/**
 * What versions cost: (1) migrating RUNS waiting version-1 runs to version 2 with one
 * migrate_runs call, timed from the call until every run is on version 2 (the worker's
 * migrator applies them one transaction each); (2) ctx.patched per call against a plain
 * ctx.step, in a run that makes CALLS calls of one kind (new runs: each patched records
 * its marker), REPEATS runs per kind, interleaved.
 *
 *   npm run build
 *   cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx versions.ts
 *
 * Imports the build (../dist). Not a test: it prints figures and writes a report, it asserts nothing.
 */
import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import type PgModule from 'pg';
import { createEngine } from '../dist/index.js';

const pg = createRequire(new URL('../dist/index.js', import.meta.url))('pg') as typeof PgModule;
const RUNS = Number(process.env.RUNS ?? 2_000);
const CALLS = Number(process.env.CALLS ?? 1_000);
const REPEATS = Number(process.env.REPEATS ?? 5);
const REPORT = process.env.REPORT ?? new URL('./results/2026-12-02-versions-pg15.md', import.meta.url).pathname;
const adminUrl = process.env.DATABASE_URL;
if (!adminUrl) throw new Error('DATABASE_URL is required');

const database = `rl_versions_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
const pgVersion = (await admin.query('select version() as v')).rows[0].v as string;
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;

const engine = createEngine({ connectionString: url.toString(), log: () => {} });
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
try {
  await engine.migrate();
  const limits = { maxSteps: CALLS * 2 + 10 };
  engine.workflow({ name: 'moving', version: '1', queue: 'moving' }, async (ctx, input: { n: number }) => {
    await ctx.step('a', () => input.n);
    await ctx.waitForSignal('go');
    return ctx.step('b', () => 1);
  });
  engine.workflow(
    { name: 'moving', version: '2', queue: 'moving', migrations: { '1': ({ checkpoints }) => ({ checkpoints }) } },
    async (ctx, input: { n: number }) => {
      await ctx.step('a', () => input.n);
      await ctx.waitForSignal('go');
      return ctx.step('b2', () => 2);
    },
  );
  const kinds = {
    'ctx.step': engine.workflow({ name: 'bench-step', queue: 'calls', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) await ctx.step('s', () => 1);
    }),
    'ctx.patched + ctx.step': engine.workflow({ name: 'bench-patched', queue: 'calls', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) {
        // A distinct id per call, so each call records its marker (what a new run pays once per patch).
        if (await ctx.patched(`p${i}`)) await ctx.step('s', () => 1);
      }
    }),
  };
  const worker = await engine.runWorker({ queues: ['moving', 'calls'], concurrency: 16, pollIntervalMs: 50 });

  // (1) Migration throughput.
  await engine.pool.query(
    `select runledger.start_runs('moving', (select jsonb_agg(jsonb_build_object('n', i)) from generate_series(1, $1) i), '{"version": "1"}')`,
    [RUNS],
  );
  for (;;) {
    const { rows } = await engine.pool.query(`select count(*)::int as n from runledger.runs where status = 'WAITING'`);
    if (rows[0].n === RUNS) break;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
  const started = performance.now();
  const marked = await engine.migrateRuns({ workflow: 'moving', fromVersion: '1', toVersion: '2' });
  const markedMs = performance.now() - started;
  for (;;) {
    const { rows } = await engine.pool.query(
      `select count(*)::int as n from runledger.runs where workflow_version = '2' and migrate_to is null`,
    );
    if (rows[0].n === RUNS) break;
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
  const migrateMs = performance.now() - started;
  console.log(`migrated ${marked.marked.length} waiting runs in ${migrateMs.toFixed(0)} ms (marked in ${markedMs.toFixed(0)} ms)`);

  // (2) ctx.patched per call.
  const times: Record<string, number[]> = Object.fromEntries(Object.keys(kinds).map((k) => [k, []]));
  for (let r = 0; r < REPEATS; r++) {
    for (const [kind, wf] of Object.entries(kinds)) {
      const t0 = performance.now();
      await (await engine.start(wf, undefined)).result({ timeoutMs: 600_000 });
      times[kind]!.push(((performance.now() - t0) * 1000) / CALLS);
    }
  }
  await worker.stop();
  const base = median(times['ctx.step']!);
  const rows = Object.entries(times).map(([kind, xs]) => `| \`${kind}\` | ${median(xs).toFixed(0)} | ${(median(xs) - base).toFixed(0)} |`);
  const report = [
    `# Versions: migration throughput and the cost of ctx.patched (${new Date().toISOString().slice(0, 10)})`,
    '',
    `PostgreSQL: ${pgVersion.split(',')[0]}; ${cpus().length} cores; one worker process, concurrency 16. \`bench/versions.ts\`.`,
    '',
    `## Migrating ${RUNS} waiting runs with one \`migrate_runs\``,
    '',
    `| marked (migrate_runs) | all applied | runs/s |`,
    `| ---: | ---: | ---: |`,
    `| ${markedMs.toFixed(0)} ms | ${migrateMs.toFixed(0)} ms | ${((RUNS * 1000) / migrateMs).toFixed(0)} |`,
    '',
    "Each run is migrated in its own transaction by the worker (lock, the workflow's migrate, rewrite of its checkpoints, event).",
    '',
    `## ctx.patched, per call (median of ${REPEATS} runs of ${CALLS} calls)`,
    '',
    '| call | µs per call | over ctx.step |',
    '| --- | ---: | ---: |',
    ...rows,
    '',
    'In a new run every `patched` records its marker checkpoint (one write); a replay that has the marker, or an old run that takes no position, writes nothing.',
    '',
  ].join('\n');
  writeFileSync(REPORT, report);
  console.log(report);
} finally {
  await engine.close();
  await admin.query(`drop database if exists ${database} with (force)`);
  await admin.end();
}
