/** Plumbing for examples/demo.ts: the database, the crashing child process, the report. */
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { startEmbeddedPostgres, TERMINAL_STATES, type Engine, type RunRecord } from '../src/index.js';

export interface DemoDatabase {
  url: string;
  embedded: boolean;
  stop(): Promise<void>;
}

/** DATABASE_URL as given, else an embedded server kept in .runledger/demo-pg (so a second demo starts in seconds). */
export async function openDatabase(): Promise<DemoDatabase> {
  if (process.env.DATABASE_URL) return { url: process.env.DATABASE_URL, embedded: false, stop: async () => {} };
  console.log('DATABASE_URL is not set: starting an embedded PostgreSQL in .runledger/demo-pg ...');
  const server = await startEmbeddedPostgres({ dataDir: '.runledger/demo-pg' });
  try {
    const admin = new pg.Client({ connectionString: server.connectionString });
    await admin.connect();
    try {
      const exists = await admin.query(`select 1 from pg_database where datname = 'runledger_demo'`);
      if (exists.rowCount === 0) await admin.query('create database runledger_demo');
    } finally {
      await admin.end();
    }
  } catch (error) {
    await server.stop();
    throw error;
  }
  return { url: server.urlFor('runledger_demo'), embedded: true, stop: () => server.stop() };
}

const CHILD = fileURLToPath(new URL('./crashing-worker.ts', import.meta.url));

export interface CrashingWorker {
  pid: number;
  /** Resolves with the signal that ended the process (SIGKILL is the expected one). */
  exited: Promise<NodeJS.Signals | number | null>;
  kill(): void;
}

/** Spawns examples/crashing-worker.ts and resolves once it serves runs. */
export async function spawnCrashingWorker(url: string, crashOrderId: string): Promise<CrashingWorker> {
  const child = spawn(process.execPath, ['--import', 'tsx', CHILD], {
    env: { ...process.env, DATABASE_URL: url, CRASH_ORDER_ID: crashOrderId },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise<NodeJS.Signals | number | null>((resolve) => child.on('exit', (code, signal) => resolve(signal ?? code)));
  await new Promise<void>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`crashing worker not ready after 20 s:\n${output}`)), 20_000);
    child.stdout.on('data', () => output.includes('ready ') && (clearTimeout(timer), resolve()));
    void exited.then((how) => (clearTimeout(timer), reject(new Error(`crashing worker exited early (${how}):\n${output}`))));
  });
  return { pid: child.pid!, exited, kill: () => void child.kill('SIGKILL') };
}

/** Polls the run row until it is terminal: the demo also waits for runs it did not start through engine.start. */
export async function waitTerminal(engine: Engine, runId: string, timeoutMs = 20_000): Promise<RunRecord> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const run = await engine.getRun(runId);
    if (run && TERMINAL_STATES.has(run.status)) return run;
    if (Date.now() > deadline) throw new Error(`run ${runId} is still ${run?.status} after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

const pad = (value: unknown, width: number) => String(value).padEnd(width);

/** Which process held a claim: worker ids are `<host>-<pid>-<ulid>`. */
function claimer(worker: unknown): string {
  const pid = typeof worker === 'string' ? /-(\d+)-[0-9A-Z]{26}$/.exec(worker)?.[1] : undefined;
  return pid === undefined ? '' : pid === String(process.pid) ? '[this process]' : `[pid ${pid}]`;
}

export async function printRun(engine: Engine, runId: string, title: string): Promise<void> {
  const run = (await engine.getRun(runId))!;
  console.log(`\n${title}\n  run ${run.runId}`);
  console.log(`  ${pad('#', 3)}${pad('step', 21)}${pad('kind', 13)}${pad('status', 11)}${'ms'.padStart(6)}`);
  for (const step of run.steps ?? []) {
    const ms = step.finishedAt.getTime() - step.startedAt.getTime();
    console.log(`  ${pad(step.seq, 3)}${pad(step.name, 21)}${pad(step.kind, 13)}${pad(step.status, 11)}${String(ms).padStart(6)}`);
  }
  const recoveries = run.recoveryAttempts === 1 ? '1 recovery' : `${run.recoveryAttempts} recoveries`;
  console.log(`  => ${run.status}, termination reason ${run.terminationReason}, ${recoveries}`);
  if (run.status === 'SUCCEEDED') console.log(`     output ${JSON.stringify(run.output)}`);
  else console.log(`     error ${(run.error as { message?: string } | null)?.message ?? JSON.stringify(run.error)}`);
  const events = await engine.pool.query(`select kind, detail->>'worker' as worker from runledger.events where run_id = $1 order by event_id`, [runId]);
  console.log(`     history: ${events.rows.map((e) => e.kind + claimer(e.worker)).join(' -> ')}`);
}

/** The same runs seen from psql; `url` is printed with its password because the embedded server's is a fixed local one. */
export function printPsqlHelp(url: string, runIds: string[], embedded: boolean): void {
  console.log('\nLook at the same runs from psql:');
  console.log(`  psql '${url}'`);
  for (const runId of runIds) console.log(`  select * from runledger.run_timeline where run_id = '${runId}' order by at;`);
  console.log('  select * from runledger.active;');
  console.log('  select termination_reason, count(*) from runledger.runs group by 1;');
  console.log('  select * from shop.refunds order by created_at desc limit 10;');
  console.log('  select * from payment_provider.refunds order by calls desc limit 10;');
  if (embedded) {
    console.log('\nThe embedded server stops when the demo exits; to paste the commands above while it runs,');
    console.log('start the demo with `npm run demo -- --keep` (it waits for Ctrl-C), or set DATABASE_URL.');
  }
}
