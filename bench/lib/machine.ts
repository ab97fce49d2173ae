import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cpus, totalmem } from 'node:os';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import { withAdmin } from './db.js';
import { config } from './config.js';
import { BENCH_DIR } from './spawn.js';

const require = createRequire(import.meta.url);

function version(pkg: string): string {
  if (pkg === 'runledger') return JSON.parse(readFileSync(join(BENCH_DIR, '..', 'package.json'), 'utf8')).version;
  try {
    return (require(`${pkg}/package.json`) as { version: string }).version;
  } catch {
    const entry = require.resolve(pkg);
    return JSON.parse(readFileSync(entry.replace(/(node_modules\/(@[^/]+\/)?[^/]+)\/.*/, '$1/package.json'), 'utf8')).version;
  }
}

function git(args: string[]): string | undefined {
  try {
    return execFileSync('git', args, { cwd: BENCH_DIR, encoding: 'utf8', stdio: ['ignore', 'pipe', 'ignore'] }).trim();
  } catch {
    return undefined;
  }
}

export async function machineInfo(adminUrl: string, server: string) {
  const pgInfo = await withAdmin(adminUrl, async (c) => {
    const setting = async (name: string) => (await c.query(`select current_setting('${name}') as v`)).rows[0].v as string;
    return {
      version: (await c.query('select version() as v')).rows[0].v as string,
      server,
      fsync: await setting('fsync'),
      synchronous_commit: await setting('synchronous_commit'),
      shared_buffers: await setting('shared_buffers'),
      max_connections: await setting('max_connections'),
      wal_level: await setting('wal_level'),
      shared_preload_libraries: await setting('shared_preload_libraries'),
      // The collation the benchmark databases get: BENCH_DB_LOCALE's, else the server's default (template1's).
      database_collation:
        config.dbLocale ?? ((await c.query(`select datcollate as v from pg_database where datname = 'template1'`)).rows[0].v as string),
    };
  });
  const dirty = git(['status', '--porcelain', '--', '../src']);
  return {
    nproc: cpus().length,
    cpu: cpus()[0]?.model ?? 'unknown',
    memoryGiB: Math.round((totalmem() / 2 ** 30) * 10) / 10,
    node: process.version,
    postgres: pgInfo,
    versions: {
      // BENCH_RUNLEDGER_REV names what was measured when bench runs outside a git checkout (e.g. a `git archive` snapshot).
      runledger: `${version('runledger')} (${process.env.BENCH_RUNLEDGER_REV ?? git(['rev-parse', '--short', 'HEAD']) ?? 'no git'}${dirty ? ', src modified' : ''})`,
      '@dbos-inc/dbos-sdk': version('@dbos-inc/dbos-sdk'),
      'graphile-worker': version('graphile-worker'),
      'pg-boss': version('pg-boss'),
      pg: version('pg'),
    },
  };
}
