/**
 * The start path of this build against an earlier one, measured alternately in one run on
 * one server (not part of `npm start`): a ratio across days on this shared 2-core machine
 * mixes in its swings (the same start path measured 6,236 and 11,259 starts/s on two days).
 *
 *   git worktree add /tmp/baseline <commit> && (cd /tmp/baseline && npm ci && npm run build)
 *   npm run build && cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres \
 *     BASELINE=/tmp/baseline REPS=5 npx tsx start-vs-build.ts
 *
 * After one uncounted measurement of each build, each repetition measures both, the
 * baseline first in odd repetitions and this build first in even ones, each in a fresh database
 * `rl_start_vs_build` with no worker: migrate, register the one-step workflow `bench` by one
 * engine.start, then time one statement of N (default 20,000) `runledger.start_run` calls over
 * generate_series, and, where the build has it, N runs by engine.startMany in batches of
 * 1,000. It prints each figure, the medians and this build ÷ the baseline. Every run is
 * counted afterwards: a path that left out a run fails the measurement.
 */
import { existsSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { freshProfileDatabase, positiveInteger, profileSettings } from './lib/profile-db.js';
import { median, perSecond } from './lib/stats.js';

const { url, count } = profileSettings(20_000);
const baseline = process.env.BASELINE;
if (!baseline) throw new Error('BASELINE is required: the root of a checkout of the earlier build, built (npm ci && npm run build)');
const reps = positiveInteger('REPS', process.env.REPS, 5);
const current = resolve(fileURLToPath(import.meta.url), '..', '..');

interface Build {
  label: string;
  createEngine: (options: Record<string, unknown>) => Engine;
}
interface Engine {
  migrate(): Promise<unknown>;
  workflow(options: { name: string }, body: (ctx: Ctx, input: { n: number }) => Promise<unknown>): unknown;
  start(workflow: unknown, input: { n: number }): Promise<unknown>;
  startMany?: (workflow: unknown, inputs: { n: number }[]) => Promise<unknown[]>;
  pool: { query(text: string, values?: unknown[]): Promise<{ rows: Record<string, unknown>[] }> };
  close(): Promise<void>;
}
interface Ctx {
  step(name: string, fn: () => Promise<unknown>): Promise<unknown>;
}

async function load(root: string, label: string): Promise<Build> {
  const entry = join(root, 'dist', 'index.js');
  if (!existsSync(entry)) throw new Error(`${label}: ${entry} does not exist (run npm ci && npm run build in ${root})`);
  const module = (await import(pathToFileURL(entry).href)) as { createEngine: Build['createEngine'] };
  return { label, createEngine: module.createEngine };
}

async function measure(build: Build): Promise<{ single: number; startMany: number | undefined }> {
  const dbUrl = await freshProfileDatabase(url, 'rl_start_vs_build');
  const engine = build.createEngine({ connectionString: dbUrl, log: () => {} });
  try {
    await engine.migrate();
    const workflow = engine.workflow({ name: 'bench' }, async (ctx, input) => ctx.step('only', async () => input.n));
    await engine.start(workflow, { n: -1 });
    const t0 = performance.now();
    const { rows } = await engine.pool.query(
      `select count(runledger.start_run('bench', jsonb_build_object('n', i)))::int as n from generate_series(1, $1::int) i`,
      [count],
    );
    const single = perSecond(count, performance.now() - t0);
    if (rows[0]!.n !== count) throw new Error(`${build.label}: start_run started ${String(rows[0]!.n)} of ${count}`);
    let startMany: number | undefined;
    if (engine.startMany) {
      const t1 = performance.now();
      for (let done = 0; done < count; done += 1_000) {
        const size = Math.min(1_000, count - done);
        const handles = await engine.startMany(
          workflow,
          Array.from({ length: size }, (_, i) => ({ n: done + i })),
        );
        if (handles.length !== size) throw new Error(`${build.label}: startMany returned ${handles.length} handles for ${size}`);
      }
      startMany = perSecond(count, performance.now() - t1);
    }
    const total = await engine.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'bench'`);
    const expected = 1 + count + (startMany === undefined ? 0 : count);
    if (total.rows[0]!.n !== expected) throw new Error(`${build.label}: ${String(total.rows[0]!.n)} runs, expected ${expected}`);
    return { single, startMany };
  } finally {
    await engine.close();
  }
}

const builds = [await load(resolve(baseline), `baseline (${baseline})`), await load(current, 'this build')];
const figures = new Map<string, { single: number[]; startMany: number[] }>(builds.map((b) => [b.label, { single: [], startMany: [] }]));
// A first measurement in the process runs cold (module loading, the JIT, the new database's
// caches) and would count against whichever build went first: one of each, not counted.
for (const build of builds) await measure(build);
for (let rep = 1; rep <= reps; rep++) {
  // ABBA: neither build always goes first.
  for (const build of rep % 2 ? builds : [...builds].reverse()) {
    const result = await measure(build);
    const list = figures.get(build.label)!;
    list.single.push(result.single);
    if (result.startMany !== undefined) list.startMany.push(result.startMany);
    console.log(
      `rep ${rep} ${build.label}: start_run ${result.single.toFixed(0)}/s` +
        (result.startMany === undefined ? '' : `, startMany ${result.startMany.toFixed(0)}/s`),
    );
  }
}
const [before, after] = builds.map((b) => figures.get(b.label)!);
const ratio = (a: number[], b: number[]) => (a.length && b.length ? (median(a)! / median(b)!).toFixed(2) : 'n/a');
const show = (list: number[]) => (list.length ? `${median(list)!.toFixed(0)}/s (${list.map((v) => v.toFixed(0)).join(' · ')})` : 'n/a');
console.log(
  `start_run × ${count} in one statement: baseline ${show(before!.single)}, this build ${show(after!.single)}, ratio ${ratio(after!.single, before!.single)}`,
);
console.log(`startMany, batches of 1,000: baseline ${show(before!.startMany)}, this build ${show(after!.startMany)}`);
