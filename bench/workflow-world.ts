/**
 * Workflow SDK Worlds side by side on one PostgreSQL: runledger/workflow-world, Vercel's
 * @workflow/world-postgres and the SDK default @workflow/world-local (files + in-memory queue).
 *
 *   cd bench && npm install && npx tsx workflow-world.ts
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres REPS=2 npx tsx workflow-world.ts
 *
 * Each system runs in the SDK's own test app (@workflow/world-testing's server.mjs, which calls
 * world.start(): the World's worker lives in the app process and delivers to the app's
 * /.well-known/workflow/v1/flow), on a fresh database of its own (world-local: a fresh data
 * directory). The workload is the app's sequentialStepsWorkflow(10): three sequential steps,
 * returns 20. Every run is started by POST /invoke and watched by GET /runs/:id every POLL_MS,
 * the same for every system. Per system and repetition, one app process, in this order:
 *
 *   1. closed loop: CALLERS callers, each invoking a run and polling it to completion, WARMUP
 *      runs unmeasured, then RUNS measured: runs/s and p50/p95 invoke-to-completion;
 *   2. burst: BURST invocations sent at once; time until all have completed (runs/s);
 *   3. history: more bursts until HISTORY_BURSTS bursts in all (no ANALYZE), then (1) again;
 *   4. the app process's peak RSS (VmHWM) at the end of each phase, and its CPU per run.
 *
 * Systems take turns in reversed order on every other repetition; the summary is the median
 * over repetitions. Knobs (environment, whole numbers): REPS (2), CALLERS (16), WARMUP (16),
 * RUNS (160), BURST (200), HISTORY_BURSTS (4), POLL_MS (25), PHASE_TIMEOUT_S (600). The defaults
 * take about 24 minutes on 2 cores: the SDK's app spends about 200 ms of CPU per run, so the
 * sizes of the task (WARMUP=40 RUNS=400 BURST=500 HISTORY_BURSTS=10) would take about two hours.
 * SYSTEMS=runledger,world-postgres,world-local picks systems; RUNLEDGER_WORLD is runledger's World
 * module (default 'runledger/workflow-world', i.e. ../dist: `npm run build` first; or a path to
 * another build's dist/workflow-world/index.js). Raw figures go to results/<date>-workflow-world.json;
 * SUMMARY_FROM=<that file> prints its summary again without measuring.
 */
import { spawn, execFileSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { cpus, loadavg, tmpdir } from 'node:os';
import { dirname, isAbsolute, join, relative, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';

const BENCH = dirname(fileURLToPath(import.meta.url));
const SERVER = join(BENCH, 'node_modules/@workflow/world-testing/dist/src/server.mjs');
const WORKLOAD = { file: 'workflows/inline-execution.ts', workflow: 'sequentialStepsWorkflow', args: [10] };
const ALL_SYSTEMS = ['runledger', 'world-postgres', 'world-local'] as const;
type System = (typeof ALL_SYSTEMS)[number];

function whole(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const value = Number(raw);
  if (!Number.isSafeInteger(value) || value < 1) {
    console.error(`${name} must be a whole number >= 1, got ${JSON.stringify(raw)}`);
    process.exit(2);
  }
  return value;
}

function settings() {
  const adminUrl = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/postgres';
  try {
    if (!new URL(adminUrl).protocol.startsWith('postgres')) throw new Error();
  } catch {
    console.error(`DATABASE_URL must be a postgres:// URL, got ${JSON.stringify(adminUrl)}`);
    process.exit(2);
  }
  const systems = (process.env.SYSTEMS ?? ALL_SYSTEMS.join(',')).split(',').map((s) => s.trim());
  const unknown = systems.filter((s) => !(ALL_SYSTEMS as readonly string[]).includes(s));
  if (unknown.length > 0 || systems.length === 0) {
    console.error(`SYSTEMS must be a comma-separated subset of ${ALL_SYSTEMS.join(',')}, got ${JSON.stringify(process.env.SYSTEMS)}`);
    process.exit(2);
  }
  const s = {
    adminUrl,
    systems: systems as System[],
    reps: whole('REPS', 2),
    callers: whole('CALLERS', 16),
    warmup: whole('WARMUP', 16),
    runs: whole('RUNS', 160),
    burst: whole('BURST', 200),
    historyBursts: whole('HISTORY_BURSTS', 4),
    pollMs: whole('POLL_MS', 25),
    phaseTimeoutMs: whole('PHASE_TIMEOUT_S', 600) * 1000,
    runledgerWorld: process.env.RUNLEDGER_WORLD || 'runledger/workflow-world',
  };
  return s;
}
const cfg = settings();

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
function median(xs: number[]): number {
  const sorted = [...xs].sort((a, b) => a - b);
  const mid = sorted.length / 2;
  return sorted.length % 2 === 1 ? sorted[Math.floor(mid)] : (sorted[mid - 1] + sorted[mid]) / 2; // NaN when empty
}
/** The nearest-rank quantile. */
function quantile(xs: number[], q: number): number {
  const sorted = [...xs].sort((a, b) => a - b);
  return sorted.length === 0 ? NaN : sorted[Math.min(sorted.length - 1, Math.ceil(q * sorted.length) - 1)];
}

async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: cfg.adminUrl });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/** The World's module as WORKFLOW_TARGET_WORLD: a package name, or a path relative to the app's cwd (BENCH). */
function worldSpecifier(system: System): string {
  if (system === 'world-postgres') return '@workflow/world-postgres';
  if (system === 'world-local') return '@workflow/world-local';
  const world = cfg.runledgerWorld;
  if (!world.includes('/') || (!world.startsWith('.') && !isAbsolute(world))) return world; // a package name
  const rel = relative(BENCH, resolve(BENCH, world));
  return rel.startsWith('.') ? rel : `./${rel}`;
}

interface App {
  proc: ChildProcess;
  base: string;
  log: () => string;
}

/** Starts the SDK's app server on `system`'s World and waits for its control line (world.start() done). */
async function startApp(system: System, env: Record<string, string>): Promise<App> {
  const childEnv: Record<string, string | undefined> = {
    ...process.env,
    ...env,
    WORKFLOW_TARGET_WORLD: worldSpecifier(system),
    CONTROL_FD: '3',
  };
  delete childEnv.PORT;
  const proc = spawn(process.execPath, [SERVER], { cwd: BENCH, env: childEnv, stdio: ['ignore', 'pipe', 'pipe', 'pipe'] });
  let output = '';
  const keep = (chunk: Buffer) => (output = (output + chunk.toString()).slice(-20_000));
  proc.stdout!.on('data', keep);
  proc.stderr!.on('data', keep);
  const exited = new Promise<never>((_, reject) =>
    proc.once('exit', (code, signal) => reject(new Error(`app server exited (${code ?? signal}):\n${output.slice(-3000)}`))),
  );
  const listening = (async () => {
    let control = '';
    for await (const chunk of proc.stdio[3] as NodeJS.ReadableStream) {
      control += chunk.toString();
      if (control.includes('\n')) break;
    }
    return JSON.parse(control.split('\n')[0]).info.port as number;
  })();
  const port = await Promise.race([listening, exited]);
  exited.catch(() => undefined);
  return { proc, base: `http://127.0.0.1:${port}`, log: () => output };
}

async function stopApp(app: App): Promise<void> {
  if (app.proc.exitCode !== null || app.proc.signalCode !== null) return;
  const gone = new Promise((r) => app.proc.once('exit', r));
  app.proc.kill('SIGTERM');
  const timer = setTimeout(() => app.proc.kill('SIGKILL'), 5000);
  await gone;
  clearTimeout(timer);
}

const TICKS_PER_S = Number(execFileSync('getconf', ['CLK_TCK'], { encoding: 'utf8' }).trim()) || 100;
/** The process's user + system CPU so far, in ms (/proc/<pid>/stat fields 14 and 15). */
function cpuMs(pid: number): number {
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1].split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / TICKS_PER_S;
}

function peakRssMiB(pid: number): number {
  const match = /VmHWM:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return match ? Math.round(Number(match[1]) / 102.4) / 10 : NaN;
}

async function invoke(app: App): Promise<string> {
  const response = await fetch(`${app.base}/invoke`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(WORKLOAD),
  });
  if (!response.ok) throw new Error(`POST /invoke: ${response.status} ${await response.text()}`);
  return ((await response.json()) as { runId: string }).runId;
}

/** True once the run completed; throws if it ended otherwise. */
async function completed(app: App, runId: string): Promise<boolean> {
  const response = await fetch(`${app.base}/runs/${runId}`);
  if (!response.ok) throw new Error(`GET /runs/${runId}: ${response.status} ${await response.text()}`);
  const { status } = (await response.json()) as { status: string };
  if (status === 'failed' || status === 'cancelled') throw new Error(`run ${runId} ended ${status}`);
  return status === 'completed';
}

function deadline(what: string): () => void {
  const until = performance.now() + cfg.phaseTimeoutMs;
  return () => {
    if (performance.now() > until) throw new Error(`${what} did not finish within PHASE_TIMEOUT_S=${cfg.phaseTimeoutMs / 1000}`);
  };
}

/** CALLERS callers share `count` runs; each invokes one, polls it to completion, takes the next. */
async function closedLoop(app: App, count: number): Promise<{ runsPerS: number; p50Ms: number; p95Ms: number; cpuMsPerRun: number }> {
  const latencies: number[] = [];
  const check = deadline('closed loop');
  let next = 0;
  const cpu0 = cpuMs(app.proc.pid!);
  const started = performance.now();
  const caller = async () => {
    while (next < count) {
      next++;
      const t0 = performance.now();
      const runId = await invoke(app);
      do {
        await sleep(cfg.pollMs);
        check();
      } while (!(await completed(app, runId)));
      latencies.push(performance.now() - t0);
    }
  };
  await Promise.all(Array.from({ length: cfg.callers }, caller));
  const seconds = (performance.now() - started) / 1000;
  const cpuMsPerRun = (cpuMs(app.proc.pid!) - cpu0) / count;
  return { runsPerS: count / seconds, p50Ms: quantile(latencies, 0.5), p95Ms: quantile(latencies, 0.95), cpuMsPerRun };
}

/**
 * BURST invocations at once; then the oldest unfinished runs are polled, CALLERS at a time,
 * sleeping POLL_MS whenever none of them had completed. Returns the seconds from the first
 * invocation until the last run was seen completed, and until all invocations were answered.
 */
async function burst(app: App): Promise<{ seconds: number; invokeSeconds: number; cpuMsPerRun: number }> {
  const check = deadline('burst');
  const cpu0 = cpuMs(app.proc.pid!);
  const started = performance.now();
  const pending = await Promise.all(Array.from({ length: cfg.burst }, () => invoke(app)));
  const invokeSeconds = (performance.now() - started) / 1000;
  while (pending.length > 0) {
    const head = pending.slice(0, cfg.callers);
    const done = await Promise.all(head.map((runId) => completed(app, runId)));
    const left = head.filter((_, i) => !done[i]);
    pending.splice(0, head.length, ...left);
    if (left.length === head.length) {
      check();
      await sleep(cfg.pollMs);
    }
  }
  return { seconds: (performance.now() - started) / 1000, invokeSeconds, cpuMsPerRun: (cpuMs(app.proc.pid!) - cpu0) / cfg.burst };
}

interface Result {
  system: System;
  rep: number;
  error?: string;
  fresh?: { runsPerS: number; p50Ms: number; p95Ms: number; cpuMsPerRun: number; rssMiB: number };
  burst?: { runsPerS: number; seconds: number; invokeSeconds: number; cpuMsPerRun: number; rssMiB: number };
  /** Seconds of every burst (the first is the measured one), for how bursts slow with history. */
  burstSeconds?: number[];
  history?: { runsPerS: number; p50Ms: number; p95Ms: number; cpuMsPerRun: number; rssMiB: number; runsBefore: number };
}

async function measure(system: System, rep: number): Promise<Result> {
  const result: Result = { system, rep };
  const database = `bench_wfw_${system.replace('-', '_')}_${process.pid}`;
  const url = new URL(cfg.adminUrl);
  url.pathname = `/${database}`;
  const dataDir = mkdtempSync(join(tmpdir(), 'bench-wfw-local-'));
  const env: Record<string, string> = { WORKFLOW_LOCAL_DATA_DIR: dataDir };
  let app: App | undefined;
  try {
    if (system !== 'world-local') {
      await admin(`drop database if exists ${database} with (force)`);
      await admin(`create database ${database}`);
      Object.assign(env, { DATABASE_URL: url.toString(), WORKFLOW_RUNLEDGER_URL: url.toString(), WORKFLOW_POSTGRES_URL: url.toString() });
    }
    // world-postgres wants its tables (drizzle migrations, graphile-worker's schema) made first; runledger migrates itself.
    if (system === 'world-postgres')
      execFileSync(process.execPath, [join(BENCH, 'node_modules/@workflow/world-postgres/bin/setup.js')], {
        env: { ...process.env, ...env },
        stdio: 'pipe',
      });
    app = await startApp(system, env);
    const pid = app.proc.pid!;
    await closedLoop(app, cfg.warmup);
    result.fresh = { ...(await closedLoop(app, cfg.runs)), rssMiB: peakRssMiB(pid) };
    console.log(
      `  ${system} rep ${rep}: closed loop ${result.fresh.runsPerS.toFixed(1)} runs/s, p50 ${result.fresh.p50Ms.toFixed(0)} ms, app CPU ${result.fresh.cpuMsPerRun.toFixed(0)} ms/run`,
    );
    const first = await burst(app);
    result.burst = { runsPerS: cfg.burst / first.seconds, ...first, rssMiB: peakRssMiB(pid) };
    result.burstSeconds = [first.seconds];
    console.log(
      `  ${system} rep ${rep}: burst ${result.burst.runsPerS.toFixed(1)} runs/s (${first.seconds.toFixed(1)} s), app CPU ${first.cpuMsPerRun.toFixed(0)} ms/run`,
    );
    for (let i = 1; i < cfg.historyBursts; i++) result.burstSeconds.push((await burst(app)).seconds);
    const runsBefore = cfg.warmup + cfg.runs + cfg.historyBursts * cfg.burst;
    await closedLoop(app, cfg.warmup);
    result.history = { ...(await closedLoop(app, cfg.runs)), rssMiB: peakRssMiB(pid), runsBefore: runsBefore + cfg.warmup };
    console.log(
      `  ${system} rep ${rep}: with history ${result.history.runsPerS.toFixed(1)} runs/s, p50 ${result.history.p50Ms.toFixed(0)} ms`,
    );
  } catch (error) {
    result.error = error instanceof Error ? error.message : String(error);
    console.log(`  ${system} rep ${rep} FAILED: ${result.error}\n${app?.log().slice(-2000) ?? ''}`);
  } finally {
    if (app) await stopApp(app);
    if (system !== 'world-local') await admin(`drop database if exists ${database} with (force)`).catch(() => undefined);
    rmSync(dataDir, { recursive: true, force: true });
  }
  return result;
}

type Figure = [label: string, pick: (r: Result) => number | undefined, digits: number];
const FIGURES: Figure[] = [
  ['closed loop, runs/s', (r) => r.fresh?.runsPerS, 1],
  ['closed loop p50, ms', (r) => r.fresh?.p50Ms, 0],
  ['closed loop p95, ms', (r) => r.fresh?.p95Ms, 0],
  ['closed loop, app CPU ms per run', (r) => r.fresh?.cpuMsPerRun, 0],
  ['burst, runs/s', (r) => r.burst?.runsPerS, 1],
  ['burst, s until all completed', (r) => r.burst?.seconds, 2],
  ['burst, s until all invocations were answered', (r) => r.burst?.invokeSeconds, 2],
  ['burst, app CPU ms per run', (r) => r.burst?.cpuMsPerRun, 0],
  [
    'last history burst, runs/s',
    (r) => (r.burst && r.burstSeconds ? (r.burst.runsPerS * r.burst.seconds) / r.burstSeconds.at(-1)! : undefined),
    1,
  ],
  ['with history: closed loop, runs/s', (r) => r.history?.runsPerS, 1],
  ['with history: closed loop p50, ms', (r) => r.history?.p50Ms, 0],
  ['with history: closed loop p95, ms', (r) => r.history?.p95Ms, 0],
  ['with history: app CPU ms per run', (r) => r.history?.cpuMsPerRun, 0],
  ['history ÷ fresh, closed-loop runs/s', (r) => (r.history && r.fresh ? r.history.runsPerS / r.fresh.runsPerS : undefined), 2],
  ['peak RSS after closed loop, MiB', (r) => r.fresh?.rssMiB, 0],
  ['peak RSS after burst, MiB', (r) => r.burst?.rssMiB, 0],
  ['peak RSS after history, MiB', (r) => r.history?.rssMiB, 0],
];

function summarize(systems: System[], results: Result[]): string {
  const med = (system: System, pick: Figure[1]) => {
    const xs = results.filter((r) => r.system === system && !r.error).map(pick);
    return median(xs.filter((x): x is number => x !== undefined && Number.isFinite(x)));
  };
  const ratioCols = systems.includes('runledger') ? systems.filter((s) => s !== 'runledger') : [];
  const head = ['figure (median of reps)', ...systems, ...ratioCols.map((s) => `runledger ÷ ${s}`)];
  const lines = [`| ${head.join(' | ')} |`, `|${head.map(() => ' --- ').join('|')}|`];
  for (const [label, pick, digits] of FIGURES) {
    const values = systems.map((s) => med(s, pick));
    const ratios = ratioCols.map((s) => med('runledger', pick) / med(s, pick));
    lines.push(`| ${label} | ${[...values.map((v) => v.toFixed(digits)), ...ratios.map((v) => v.toFixed(2))].join(' | ')} |`);
  }
  const failed = results.filter((r) => r.error);
  for (const r of failed) lines.push(`\n${r.system} rep ${r.rep} failed: ${r.error?.split('\n')[0]}`);
  return lines.join('\n');
}

async function main() {
  // SUMMARY_FROM=results/<file>.json prints the summary of an earlier run again.
  if (process.env.SUMMARY_FROM) {
    const saved = JSON.parse(readFileSync(process.env.SUMMARY_FROM, 'utf8')) as { settings: { systems: System[] }; results: Result[] };
    console.log(summarize(saved.settings.systems, saved.results));
    return;
  }
  console.log(
    `${cfg.systems.join(', ')}; ${cfg.reps} reps; ${cfg.callers} callers, ${cfg.warmup} + ${cfg.runs} runs; bursts of ${cfg.burst} ×${cfg.historyBursts}; ` +
      `poll ${cfg.pollMs} ms; ${cpus().length} cores, Node ${process.version}; runledger World: ${worldSpecifier('runledger')}; ` +
      `load average ${loadavg()[0].toFixed(2)}`,
  );
  const loadBefore = loadavg();
  const results: Result[] = [];
  for (let rep = 1; rep <= cfg.reps; rep++) {
    const order = rep % 2 === 1 ? cfg.systems : [...cfg.systems].reverse();
    for (const system of order) results.push(await measure(system, rep));
  }
  const table = summarize(cfg.systems, results);
  console.log(
    `\n${table}\n\nload average (1, 5, 15 min) before: ${loadBefore.map((x) => x.toFixed(2)).join(', ')}; after: ${loadavg()
      .map((x) => x.toFixed(2))
      .join(', ')}`,
  );
  const out = join(BENCH, 'results', `${new Date().toISOString().slice(0, 10)}-workflow-world.json`);
  writeFileSync(
    out,
    JSON.stringify({ settings: { ...cfg, adminUrl: undefined }, loadBefore, loadAfter: loadavg(), results }, null, 2) + '\n',
  );
  console.log(`\nraw figures: ${relative(BENCH, out)}`);
}

await main();
