/**
 * `runledger dev` as a developer runs it: one process that migrates, runs a worker for the
 * refund example (examples/refund-workflow.ts) and serves the console, until Ctrl-C.
 *
 * - On the file's database (--database-url): refunds started from SQL complete or fail on
 *   its worker, the console's run list shows them, and SIGINT stops everything with exit 0,
 *   the worker recorded as stopped (not lost: it released its lease and said so).
 * - Without any database: it starts an embedded PostgreSQL in the given data folder, the
 *   console answers, and SIGINT stops the server too (its port refuses connections after).
 *   Started again on a dev database another build migrated, it makes that database again.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createConnection } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { waitFor } from '../helpers/database.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));
const t = useTestEngine({ engine: false });
const { db } = t;

interface DevProcess {
  child: ChildProcess;
  output(): string;
  exited: Promise<number | null>;
}

const started: DevProcess[] = [];
afterAll(() => {
  for (const dev of started) if (dev.child.exitCode === null) dev.child.kill('SIGKILL');
});

function startDev(args: string[], env: NodeJS.ProcessEnv): DevProcess {
  const child = spawn(process.execPath, ['--import', 'tsx', 'src/cli/main.ts', 'dev', ...args], {
    cwd: ROOT,
    env: { ...env, COLUMNS: '200' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let text = '';
  child.stdout!.on('data', (chunk) => (text += chunk));
  child.stderr!.on('data', (chunk) => (text += chunk));
  const exited = new Promise<number | null>((done) => child.on('exit', (code) => done(code)));
  const dev = { child, output: () => text, exited };
  started.push(dev);
  return dev;
}

/** The printed line `label   value`, once it is there. */
async function printed(dev: DevProcess, label: string, timeoutMs = 60_000): Promise<string> {
  return waitFor(
    `runledger dev to print "${label}"`,
    async () => {
      if (dev.child.exitCode !== null) throw new Error(`runledger dev exited ${dev.child.exitCode}:\n${dev.output()}`);
      return new RegExp(`^${label} +(\\S.*)$`, 'm').exec(dev.output())?.[1]?.trim();
    },
    timeoutMs,
  );
}

function portOpen(port: number): Promise<boolean> {
  return new Promise((done) => {
    const socket = createConnection({ host: '127.0.0.1', port });
    socket.once('connect', () => {
      socket.destroy();
      done(true);
    });
    socket.once('error', () => done(false));
  });
}

describe('runledger dev', () => {
  it('migrates, runs the module, serves the console with its runs, and stops cleanly on Ctrl-C', async () => {
    const dev = startDev(['--module', 'examples/refund-workflow.ts', '--port', '0', '--token', 'dev-secret'], {
      ...process.env,
      DATABASE_URL: db.url,
    });
    const consoleUrl = await printed(dev, 'console');
    expect(await printed(dev, 'action token')).toBe('dev-secret');
    expect(await printed(dev, 'DATABASE_URL')).toBe(db.url);
    expect(await printed(dev, 'psql')).toBe(`psql '${db.url}'`);
    const workerId = (await printed(dev, 'worker')).split(' ')[0]!;
    expect(await printed(dev, 'worker')).toContain('serving refund');

    // The module created its tables; the demo's two outcomes: a refund paid, one rejected.
    await db.pool.query(`insert into shop.orders (order_id, customer_email, total_cents) values ('ord-dev', 'ana@example.com', 9000)`);
    const paid = (
      await db.pool.query(`select runledger.start_run('refund', '{"orderId":"ord-dev","amountCents":1200,"reason":"late"}') as id`)
    ).rows[0].id as string;
    const rejected = (
      await db.pool.query(`select runledger.start_run('refund', '{"orderId":"ord-none","amountCents":100,"reason":"late"}') as id`)
    ).rows[0].id as string;
    const statuses = await waitFor('both refunds to end', async () => {
      const rows = (await db.pool.query('select run_id, status from runledger.runs where run_id = any($1)', [[paid, rejected]])).rows;
      return rows.length === 2 && rows.every((r) => ['SUCCEEDED', 'FAILED'].includes(r.status))
        ? Object.fromEntries(rows.map((r) => [r.run_id, r.status]))
        : undefined;
    });
    expect(statuses).toEqual({ [paid]: 'SUCCEEDED', [rejected]: 'FAILED' });

    const page = await fetch(consoleUrl);
    expect(page.status).toBe(200);
    const html = await page.text();
    expect(html).toContain(paid);
    expect(html).toContain(rejected);

    dev.child.kill('SIGINT');
    expect(await dev.exited).toBe(0);
    expect(dev.output()).toMatch(/^stopped$/m);
    const worker = (await db.pool.query('select stopped_at from runledger.workers where worker_id = $1', [workerId])).rows[0];
    expect(worker.stopped_at).not.toBeNull();
    await expect(fetch(consoleUrl)).rejects.toThrow();
  });

  it('starts an embedded PostgreSQL when no database is given, and stops it on Ctrl-C', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'runledger-dev-'));
    try {
      const env = { ...process.env };
      delete env.DATABASE_URL;
      const dev = startDev(['--module', 'test/fixtures/cli-workflows.ts', '--port', '0', '--data-dir', dataDir], env);
      const consoleUrl = await printed(dev, 'console', 120_000);
      const url = await printed(dev, 'DATABASE_URL');
      expect(url).toMatch(/^postgres:\/\/postgres:[^@]+@127\.0\.0\.1:\d+\/runledger_dev$/);
      expect(await printed(dev, 'action token')).toMatch(/^[0-9a-f]{32}$/);
      expect((await fetch(consoleUrl)).status).toBe(200);

      const serverDir = await printed(dev, 'data folder');
      const port = Number(new URL(url).port);
      expect(await portOpen(port)).toBe(true);
      // As a build of runledger with other migrations leaves it (0.1.0's, say): one checksum differs.
      const tamper = new pg.Client({ connectionString: url });
      await tamper.connect();
      await tamper.query(`update runledger.migrations set checksum = repeat('0', 64) where version = 2`);
      await tamper.query(`create table public.left_by_the_other_build (id int)`);
      await tamper.end();
      dev.child.kill('SIGINT');
      expect(await dev.exited).toBe(0);
      expect(await portOpen(port)).toBe(false);

      // Started again on that data folder: the dev database is made again and migrated, not refused.
      const again = startDev(['--module', 'test/fixtures/cli-workflows.ts', '--port', '0', '--data-dir', dataDir], env);
      const againConsole = await printed(again, 'console', 120_000);
      expect(again.output()).toMatch(/the dev database was migrated by another build of runledger \(.*0002_runs.*\): making it again/);
      expect((await fetch(againConsole)).status).toBe(200);
      const check = new pg.Client({ connectionString: await printed(again, 'DATABASE_URL') });
      await check.connect();
      try {
        const leftovers = await check.query(`select to_regclass('public.left_by_the_other_build') as t`);
        expect(leftovers.rows[0].t).toBeNull();
        const sums = await check.query(`select count(*)::int as n from runledger.migrations where checksum = repeat('0', 64)`);
        expect(sums.rows[0].n).toBe(0);
      } finally {
        await check.end();
      }
      again.child.kill('SIGINT');
      expect(await again.exited).toBe(0);
      rmSync(serverDir, { recursive: true, force: true });
    } finally {
      rmSync(dataDir, { recursive: true, force: true });
    }
  }, 180_000);
});
