/**
 * Workers on several hosts: 1, 2 and 4 worker processes, each standing for a host with
 * its own TCP forwarder to PostgreSQL (bench/multihost-worker.ts), drain RUNS runs of a
 * 3-step workflow started by one SQL statement on a database that already holds history,
 * REPEATS times per host count. Reports runs/s, the ratio to one host, and the server's
 * and the hosts' share of the machine, so the point where the database saturates shows.
 *
 *   npm run build
 *   cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx multihost.ts
 *
 * Imports the build (../dist). Not a test: it prints figures and writes a report.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import type PgModule from 'pg';
import { createEngine } from '../dist/index.js';

const pg = createRequire(new URL('../dist/index.js', import.meta.url))('pg') as typeof PgModule;
const RUNS = Number(process.env.RUNS ?? 6000);
const HISTORY = Number(process.env.HISTORY ?? 20000);
const REPEATS = Number(process.env.REPEATS ?? 2);
const HOSTS = (process.env.HOSTS ?? '1,2,4').split(',').map(Number);
const CONCURRENCY = Number(process.env.MH_CONCURRENCY ?? 16);
const date = new Date().toISOString().slice(0, 10);
const REPORT = process.env.REPORT ?? new URL(`./results/${date}-multihost.md`, import.meta.url).pathname;
const adminUrl = process.env.DATABASE_URL;
if (!adminUrl) throw new Error('DATABASE_URL is required');

const database = `rl_multihost_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
admin.on('error', () => {});
const pgVersion = (await admin.query('select version() as v')).rows[0].v as string;
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;
const pool = new pg.Pool({ connectionString: url.toString(), max: 4 });
pool.on('error', () => {}); // an idle connection ended by the final drop database ... with (force)

function startHost(name: string): Promise<{ child: ChildProcess; cpuMs: () => Promise<number> }> {
  const child = spawn(process.execPath, ['--import', 'tsx', new URL('./multihost-worker.ts', import.meta.url).pathname], {
    env: { ...process.env, MH_TARGET: url.toString(), MH_HOST: name, MH_CONCURRENCY: String(CONCURRENCY) },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  return new Promise((resolve, reject) => {
    child.stdout!.on('data', (chunk: Buffer) => {
      if (chunk.toString().includes('READY')) resolve({ child, cpuMs: () => processCpuMs(child.pid!) });
    });
    child.once('exit', (code) => reject(new Error(`host ${name} exited ${code}`)));
  });
}

/** utime + stime of a process, from /proc (Linux), in ms. */
async function processCpuMs(pid: number): Promise<number> {
  const { readFileSync } = await import('node:fs');
  const fields = readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ');
  return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100;
}

async function count(status: string): Promise<number> {
  return Number(
    (await pool.query('select count(*)::int as n from runledger.runs where status = $1::runledger.run_status', [status])).rows[0].n,
  );
}

const rows: Array<{ hosts: number; rep: number; runsPerSec: number; hostCpuPerRunMs: number }> = [];
try {
  const setup = createEngine({ connectionString: url.toString(), log: () => {} });
  await setup.migrate();
  await setup.close();

  // History: a database that has already run HISTORY workflows, statistics as autovacuum left them.
  // (The first host also registers the workflow, which start_run from SQL needs.)
  {
    const host = await startHost('history');
    await pool.query(`select runledger.start_run('mh-order', jsonb_build_object('n', g)) from generate_series(1, $1) g`, [HISTORY]);
    while ((await count('SUCCEEDED')) < HISTORY) await new Promise((r) => setTimeout(r, 200));
    host.child.kill('SIGTERM');
    await new Promise((r) => host.child.once('exit', r));
  }

  for (const hosts of HOSTS) {
    for (let rep = 1; rep <= REPEATS; rep++) {
      const before = await count('SUCCEEDED');
      const started = await Promise.all(Array.from({ length: hosts }, (_, i) => startHost(`host-${i + 1}`)));
      const cpuBefore = await Promise.all(started.map((h) => h.cpuMs()));
      const t0 = performance.now();
      await pool.query(`select runledger.start_run('mh-order', jsonb_build_object('n', g)) from generate_series(1, $1) g`, [RUNS]);
      while ((await count('SUCCEEDED')) < before + RUNS) await new Promise((r) => setTimeout(r, 50));
      const seconds = (performance.now() - t0) / 1000;
      const cpuAfter = await Promise.all(started.map((h) => h.cpuMs()));
      const hostCpu = cpuAfter.reduce((sum, ms, i) => sum + ms - cpuBefore[i]!, 0);
      rows.push({ hosts, rep, runsPerSec: RUNS / seconds, hostCpuPerRunMs: hostCpu / RUNS });
      console.log(`${hosts} host(s), rep ${rep}: ${(RUNS / seconds).toFixed(0)} runs/s, host CPU ${(hostCpu / RUNS).toFixed(2)} ms/run`);
      for (const h of started) h.child.kill('SIGTERM');
      await Promise.all(started.map((h) => new Promise((r) => h.child.once('exit', r))));
    }
  }
} finally {
  await pool.end();
  await admin.query(`drop database if exists ${database} with (force)`);
  await admin.end();
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const base = median(rows.filter((r) => r.hosts === HOSTS[0]).map((r) => r.runsPerSec));
const lines = [
  `# Workers on several hosts (${date})`,
  '',
  `${RUNS} runs of a 3-step workflow per measurement, started by one \`start_run ... from generate_series\` statement once the hosts`,
  `serve, on a database that already ran ${HISTORY} of them. Each host is a worker process (concurrency ${CONCURRENCY}) reaching`,
  'PostgreSQL through a TCP forwarder of its own. Median of the repetitions; ratio to one host.',
  '',
  '| hosts | runs/s (each repetition) | median | ratio | worker CPU per run (ms, all hosts) |',
  '| ---: | --- | ---: | ---: | ---: |',
  ...HOSTS.map((hosts) => {
    const mine = rows.filter((r) => r.hosts === hosts);
    const m = median(mine.map((r) => r.runsPerSec));
    return `| ${hosts} | ${mine.map((r) => r.runsPerSec.toFixed(0)).join(', ')} | ${m.toFixed(0)} | ${(m / base).toFixed(2)}× | ${median(mine.map((r) => r.hostCpuPerRunMs)).toFixed(2)} |`;
  }),
  '',
  `Machine: ${cpus().length} cores (${cpus()[0]?.model ?? 'unknown'}), load average at the end ${loadavg()
    .map((l) => l.toFixed(2))
    .join(' ')}; the hosts, their forwarders and PostgreSQL share these cores.`,
  `Server: ${pgVersion}.`,
];
writeFileSync(REPORT, `${lines.join('\n')}\n`);
console.log(lines.join('\n'));
