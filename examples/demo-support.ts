/** Plumbing for the demos (examples/demo.ts and the agent demos): the database, worker processes, the report. */
import { spawn } from 'node:child_process';
import { createHash } from 'node:crypto';
import { resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { createEngine, loadMigrations, TERMINAL_STATES, type Engine, type RunRecord } from '../src/index.js';
import { startEmbeddedPostgres } from '../src/dev/index.js';

export const DEMO_DATABASE = 'runledger_demo';
const EMBEDDED_DIR = '.runledger/demo-pg';

export interface DemoDatabase {
  url: string;
  embedded: boolean;
  stop(): Promise<void>;
}

/**
 * The demo's own database, `runledger_demo`, on the server in DATABASE_URL (the role
 * must be allowed to create databases, as for `npm test`) or else on an embedded
 * server kept in .runledger/demo-pg (so a second demo starts in seconds). The
 * database it is given is never written to.
 */
export async function openDatabase(): Promise<DemoDatabase> {
  if (process.env.DATABASE_URL) {
    const url = await prepareDemoDatabase(process.env.DATABASE_URL, undefined);
    return { url, embedded: false, stop: async () => {} };
  }
  console.log(`DATABASE_URL is not set: starting an embedded PostgreSQL in ${EMBEDDED_DIR} ...`);
  const server = await startEmbeddedPostgres({ dataDir: EMBEDDED_DIR });
  if (server.dataDir !== resolve(EMBEDDED_DIR)) {
    console.log(`(running as root, and the postgres user cannot enter this checkout: the data is kept in ${server.dataDir})`);
  }
  try {
    const url = await prepareDemoDatabase(server.connectionString, server.dataDir);
    return { url, embedded: true, stop: () => server.stop() };
  } catch (error) {
    await server.stop();
    throw error;
  }
}

/**
 * Creates and migrates runledger_demo. A database left by an older build of runledger
 * (whose migration files have changed since) is dropped and created again: it is the
 * demo's own, and `migrate` alone cannot repair a schema whose files were rewritten.
 */
async function prepareDemoDatabase(serverUrl: string, embeddedDir: string | undefined): Promise<string> {
  const url = withDatabase(serverUrl, DEMO_DATABASE);
  const build = createHash('sha256')
    .update(
      loadMigrations()
        .map((m) => m.text)
        .join('\n'),
    )
    .digest('hex')
    .slice(0, 16);
  const recreate = async (why: string) => {
    console.log(`The database ${DEMO_DATABASE} ${why}: dropping and creating it again.`);
    await admin(serverUrl, [`drop database if exists ${DEMO_DATABASE} with (force)`, `create database ${DEMO_DATABASE}`]);
  };
  try {
    await admin(serverUrl, [`create database ${DEMO_DATABASE}`], { ignore: '42P04' }); // duplicate_database: reuse it
    const found = await schemaBuild(url);
    if (found.hasSchema && found.build !== build) await recreate('holds a runledger schema from an older build');
    try {
      await migrateDemo(url, build);
    } catch (error) {
      await recreate(`could not be migrated (${(error as Error).message})`);
      await migrateDemo(url, build);
    }
  } catch (error) {
    const fix = embeddedDir
      ? `Delete the folder ${embeddedDir} (rm -rf ${embeddedDir}) and run \`npm run demo\` again.`
      : `Check that the role in DATABASE_URL may create databases, or drop the database ${DEMO_DATABASE} on that server and run the demo again.`;
    throw new Error(`could not prepare the demo database ${DEMO_DATABASE}: ${(error as Error).message}\n${fix}`, { cause: error });
  }
  return url;
}

async function admin(serverUrl: string, statements: string[], options: { ignore?: string } = {}): Promise<void> {
  const client = new pg.Client({ connectionString: serverUrl });
  await client.connect();
  try {
    for (const statement of statements) {
      await client.query(statement).catch((error: { code?: string }) => {
        if (error.code !== options.ignore) throw error;
      });
    }
  } finally {
    await client.end();
  }
}

/** Whether the runledger schema exists, and which build (fingerprint of sql/*.sql) the demo migrated it with. */
async function schemaBuild(url: string): Promise<{ hasSchema: boolean; build: string | undefined }> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const { rows } = await client.query(
      `select to_regnamespace('runledger') is not null as has_schema, to_regclass('public.runledger_demo_build') is not null as has_marker`,
    );
    const build = rows[0].has_marker ? (await client.query('select build from public.runledger_demo_build')).rows[0]?.build : undefined;
    return { hasSchema: rows[0].has_schema, build };
  } finally {
    await client.end();
  }
}

async function migrateDemo(url: string, build: string): Promise<void> {
  const engine = createEngine({ connectionString: url, poolMax: 2, log: () => {} });
  try {
    await engine.migrate();
    await engine.pool.query('create table if not exists public.runledger_demo_build (build text not null)');
    await engine.pool.query('delete from public.runledger_demo_build');
    await engine.pool.query('insert into public.runledger_demo_build (build) values ($1)', [build]);
  } finally {
    await engine.close();
  }
}

function withDatabase(url: string, database: string): string {
  const parsed = new URL(url);
  parsed.pathname = `/${database}`;
  return parsed.toString();
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

/** Polls `check` until it returns a value (not undefined); for states the demo waits to show. */
export async function waitFor<T>(what: string, check: () => Promise<T | undefined>, timeoutMs = 20_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`still waiting for ${what} after ${timeoutMs} ms`);
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
  const events = await engine.pool.query(
    `select kind, detail->>'worker' as worker from runledger.events where run_id = $1 order by event_id`,
    [runId],
  );
  console.log(`     history: ${events.rows.map((e) => e.kind + claimer(e.worker)).join(' -> ')}`);
}

/** The same runs seen from psql; `url` is printed with its password because the embedded server's is a fixed local one. */
export function printPsqlHelp(url: string, runIds: string[], embedded: boolean): void {
  console.log('\nLook at the same runs from psql:');
  console.log(`  psql '${url}'`);
  for (const runId of runIds) console.log(`  select * from runledger.run_timeline where run_id = '${runId}' order by at;`);
  console.log('  select * from runledger.active;');
  console.log('  select request_id, action, decision, decided_by, decided_at, note from runledger.approvals order by requested_at;');
  console.log('  select termination_reason, count(*) from runledger.runs group by 1;');
  console.log('  select * from shop.refunds order by created_at desc limit 10;');
  console.log('  select * from payment_provider.refunds order by calls desc limit 10;');
  if (embedded) {
    console.log('\nThe embedded server stops when the demo exits; to paste the commands above while it runs,');
    console.log('start the demo with `npm run demo -- --keep` (it waits for Ctrl-C), or set DATABASE_URL.');
  }
}

export interface DemoWorker {
  pid: number;
  /** Resolves with the signal that ended the process, or its exit code. */
  exited: Promise<string>;
  output(): string;
  kill(): void;
}

/** Spawns a demo's worker script (`node --import tsx <script>`) with `env` and resolves once it printed "ready". */
export async function spawnDemoWorker(script: string, env: Record<string, string>): Promise<DemoWorker> {
  const child = spawn(process.execPath, ['--import', 'tsx', script], {
    env: { ...process.env, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (c) => (output += c));
  child.stderr.on('data', (c) => (output += c));
  const exited = new Promise<string>((resolve) => child.on('exit', (code, signal) => resolve(signal ?? String(code))));
  await waitFor(`worker ${child.pid} ready`, async () => (output.includes('ready ') ? true : undefined));
  return { pid: child.pid!, exited, output: () => output, kill: () => child.kill('SIGKILL') };
}

/** The run's first undecided approval request, once it is asked. */
export async function approvalAsked(engine: Engine, runId: string): Promise<{ request_id: string; action: string; evidence: unknown }> {
  return waitFor('the approval request', async () => {
    const { rows } = await engine.pool.query(
      `select request_id, action, evidence from runledger.approvals where run_id = $1 and decision is null`,
      [runId],
    );
    return rows[0] as { request_id: string; action: string; evidence: unknown } | undefined;
  });
}

/** How a demo worker that should kill itself ended: 'SIGKILL', its exit code, or a note after 60 s (its output is printed then). */
export async function killedWorker(worker: DemoWorker): Promise<string> {
  const how = await Promise.race([
    worker.exited,
    new Promise<string>((resolve) => setTimeout(() => resolve('still running after 60 s'), 60_000).unref()),
  ]);
  if (how !== 'SIGKILL') console.log(worker.output().slice(-2000));
  return how;
}

/** A run's operation `name` from the ledger: status, key and the operation events it went through. */
export async function operationHistory(
  engine: Engine,
  runId: string,
  name: string,
): Promise<{ status: string; idempotency_key: string; history: string } | undefined> {
  const { rows } = await engine.pool.query(
    `select o.status, o.idempotency_key,
            (select string_agg(e.kind, ' -> ' order by e.event_id) from runledger.events e
              where e.run_id = o.run_id and e.kind like 'operation%' and e.detail->>'operation_id' = o.operation_id) as history
       from runledger.operations o where o.run_id = $1 and o.name = $2`,
    [runId, name],
  );
  return rows[0];
}
