import { spawnSync, type SpawnSyncReturns } from 'node:child_process';
import { chownSync, existsSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { locateBinaries, reachableCopy, userCan, type PostgresUser } from '../../src/dev/binaries.js';

/**
 * PostgreSQL servers a drill starts, stops and kills itself (never the suite's embedded
 * server or the one on 5432): initdb + pg_ctl, trust authentication on 127.0.0.1, data
 * under the system temporary folder. As root, every command runs as the `postgres`
 * user, as src/dev/embedded-postgres.ts does, since PostgreSQL refuses root.
 */
export const DEBIAN_BIN = '/usr/lib/postgresql/15/bin';

export interface BinDir {
  initdb: string;
  pgCtl: string;
  /** Only the Debian packages ship it; undefined for the embedded package. */
  pgBasebackup?: string;
}

export function debianBinaries(): BinDir | undefined {
  if (!['pg_basebackup', 'pg_ctl', 'initdb'].every((file) => existsSync(join(DEBIAN_BIN, file)))) return undefined;
  return { initdb: join(DEBIAN_BIN, 'initdb'), pgCtl: join(DEBIAN_BIN, 'pg_ctl'), pgBasebackup: join(DEBIAN_BIN, 'pg_basebackup') };
}

/** The embedded package's initdb and pg_ctl, copied where the postgres user can reach them when run as root. */
export async function embeddedBinaries(): Promise<BinDir> {
  let binaries = await locateBinaries();
  const user = serverUser();
  if (user && !userCan(user, 'rx', binaries.postgres)) binaries = reachableCopy(binaries);
  const bin = join(binaries.nativeDir, 'bin');
  return { initdb: join(bin, 'initdb'), pgCtl: join(bin, 'pg_ctl') };
}

function serverUser(): PostgresUser | undefined {
  if (process.getuid?.() !== 0) return undefined;
  const uid = spawnSync('id', ['-u', 'postgres'], { encoding: 'utf8' });
  const gid = spawnSync('id', ['-g', 'postgres'], { encoding: 'utf8' });
  if (uid.status !== 0 || gid.status !== 0) {
    spawnSync('useradd', ['--system', '--no-create-home', '--user-group', 'postgres']);
    return serverUser();
  }
  return { uid: Number(uid.stdout.trim()), gid: Number(gid.stdout.trim()) };
}

function run(file: string, args: string[]): SpawnSyncReturns<string> {
  const user = serverUser();
  const result = spawnSync(file, args, {
    encoding: 'utf8',
    env: { ...process.env, LC_MESSAGES: 'C' },
    ...(user ? { uid: user.uid, gid: user.gid } : {}),
    stdio: ['ignore', 'pipe', 'pipe'],
    timeout: 120_000,
  });
  return result;
}

function check(what: string, result: SpawnSyncReturns<string>): void {
  if (result.status !== 0) throw new Error(`${what} failed (${result.status ?? result.error?.message}): ${result.stderr}${result.stdout}`);
}

export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const probe = createServer();
    probe.on('error', reject);
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => (typeof address === 'object' && address ? resolve(address.port) : reject(new Error('no free port'))));
    });
  });
}

const SERVER_OPTIONS = '-c max_connections=200 -c listen_addresses=127.0.0.1 -c unix_socket_directories= -c fsync=on';

export class PgServer {
  readonly dataDir: string;
  constructor(
    readonly bin: BinDir,
    readonly port: number,
    dataDir?: string,
  ) {
    this.dataDir = dataDir ?? PgServer.newDataDir();
  }

  static newDataDir(): string {
    const parent = mkdtempSync(join(tmpdir(), 'runledger-drill-'));
    const user = serverUser();
    if (user) chownSync(parent, user.uid, user.gid);
    return join(parent, 'data');
  }

  static async create(bin: BinDir): Promise<PgServer> {
    const server = new PgServer(bin, await freePort());
    check('initdb', run(bin.initdb, ['-D', server.dataDir, '--auth=trust', '--username=postgres', '--encoding=UTF8', '--locale=C']));
    server.start();
    return server;
  }

  /** A streaming replica of `primary` (pg_basebackup -R), started. */
  static async replicaOf(primary: PgServer): Promise<PgServer> {
    if (!primary.bin.pgBasebackup) throw new Error('pg_basebackup is not available');
    const replica = new PgServer(primary.bin, await freePort());
    check(
      'pg_basebackup',
      run(primary.bin.pgBasebackup, [
        '-h',
        '127.0.0.1',
        '-p',
        String(primary.port),
        '-U',
        'postgres',
        '-D',
        replica.dataDir,
        '-R',
        '-X',
        'stream',
        // A checkpoint at once: the default spreads it over most of checkpoint_timeout (minutes
        // on an idle primary), which was most of the drill's time and, on a loaded machine, ran
        // past the 120 s the call is given.
        '--checkpoint=fast',
      ]),
    );
    replica.start();
    return replica;
  }

  url(database = 'postgres'): string {
    return `postgres://postgres@127.0.0.1:${this.port}/${database}`;
  }

  start(): void {
    check(
      `pg_ctl start (port ${this.port})`,
      run(this.bin.pgCtl, [
        'start',
        '-w',
        '-t',
        '60',
        '-D',
        this.dataDir,
        '-l',
        `${this.dataDir}/../server.log`,
        '-o',
        `-p ${this.port} ${SERVER_OPTIONS}`,
      ]),
    );
  }

  /** `pg_ctl stop -m immediate`: every backend is gone at once, no checkpoint (crash recovery at the next start). */
  stopImmediate(): void {
    check(`pg_ctl stop -m immediate (port ${this.port})`, run(this.bin.pgCtl, ['stop', '-w', '-m', 'immediate', '-D', this.dataDir]));
  }

  promote(): void {
    check(`pg_ctl promote (port ${this.port})`, run(this.bin.pgCtl, ['promote', '-w', '-D', this.dataDir]));
  }

  /** Stops it if running and deletes its data. */
  destroy(): void {
    if (existsSync(join(this.dataDir, 'postmaster.pid'))) run(this.bin.pgCtl, ['stop', '-w', '-m', 'immediate', '-D', this.dataDir]);
    rmSync(join(this.dataDir, '..'), { recursive: true, force: true });
  }
}
