/**
 * Upgrade with runs in flight (issue 18's drill), with the previous release's real code:
 * its `src/`, `sql/` and fixtures are extracted from git (PREVIOUS_RELEASE) into a
 * temporary folder and run by their own worker process.
 *
 * 1. The previous release migrates an empty database; its worker takes 40 runs: some
 *    finish, some are in a slow step when the upgrade lands, some wait for a signal.
 * 2. This build migrates the same database while that worker runs, so the previous
 *    release's worker must keep working on the new schema (a migration that breaks its
 *    calls fails here): it finishes its running runs and a run started after the upgrade.
 * 3. A worker of this build starts, the old one is stopped with SIGTERM, the waiting
 *    runs are signalled, and every run ends SUCCEEDED: each reserve and ship written
 *    exactly once (orders), none lost.
 * 4. Three migrators of this build at once on a second database left by the previous
 *    release: all three succeed (the losers wait for the winner's lock and find nothing to do).
 *
 * The previous release is the commit that last changed sql/released.sha256 (cutting a release
 * lists its files there, sql/README.md), so the drill follows each release by itself:
 * between releases it upgrades across every migration written since, and at a release it
 * runs the released build's workers beside this build's. Without that commit in the git
 * history (a tarball) the test is skipped with the reason printed as a warning.
 */
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { createEngine, loadMigrations } from '../src/index.js';
import { withDatabase } from '../src/testing/index.js';
import { FIXTURE_TABLES } from './fixtures/workflows.js';
import { waitFor } from './helpers/database.js';
import { spawnWorker, type WorkerProcess } from './helpers/worker-process.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const UPGRADE_WORKER = fileURLToPath(new URL('./fixtures/upgrade-worker.ts', import.meta.url));

/** The commit of the last release: the last to change sql/released.sha256. */
function previousRelease(): { commit: string } | { missing: string } {
  try {
    const commit = execFileSync('git', ['-C', ROOT, 'log', '-1', '--format=%H', '--', 'sql/released.sha256'], {
      encoding: 'utf8',
      stdio: ['ignore', 'pipe', 'ignore'],
    }).trim();
    return commit ? { commit } : { missing: 'no commit in this checkout changed sql/released.sha256' };
  } catch (error) {
    return { missing: `no git history here (${(error as Error).message.split('\n')[0]})` };
  }
}

const release = previousRelease();
const missing = 'missing' in release ? release.missing : undefined;
const PREVIOUS_RELEASE = 'commit' in release ? release.commit : '';
if (missing) console.warn(`UPGRADE DRILL SKIPPED: ${missing} (a tarball); run it in a git clone`);

const adminUrl = inject('adminUrl');
const databases: string[] = [];
const workers: WorkerProcess[] = [];
let previous: string; // the extracted previous release
let previousEntry: string;

async function admin(sql: string): Promise<void> {
  const client = new pg.Client({ connectionString: adminUrl });
  await client.connect();
  try {
    await client.query(sql);
  } finally {
    await client.end();
  }
}

/** An empty database (not the suite's migrated template), dropped after the file. */
async function emptyDatabase(name: string): Promise<string> {
  const database = `${name}_${process.pid}`;
  await admin(`drop database if exists ${database} with (force)`);
  await admin(`create database ${database}`);
  databases.push(database);
  return withDatabase(adminUrl, database);
}

/** The previous release's migrate(), in its own process, as that release's users ran it. */
function migrateWithPreviousRelease(url: string): void {
  execFileSync(process.execPath, ['--import', 'tsx', join(previous, 'migrate.ts')], {
    cwd: previous,
    env: { ...process.env, DATABASE_URL: url },
    stdio: 'pipe',
  });
}

async function appliedMigrations(pool: pg.Pool): Promise<number[]> {
  const rows = (await pool.query<{ version: number }>('select version from runledger.migrations order by version')).rows;
  return rows.map((row) => row.version);
}

beforeAll(() => {
  if (missing) return;
  previous = mkdtempSync(join(tmpdir(), 'runledger-previous-'));
  const archive = join(previous, 'release.tar');
  execFileSync('git', ['-C', ROOT, 'archive', '-o', archive, PREVIOUS_RELEASE, 'src', 'sql', 'package.json', 'tsconfig.json']);
  execFileSync('tar', ['-x', '-f', archive, '-C', previous]);
  symlinkSync(join(ROOT, 'node_modules'), join(previous, 'node_modules'));
  writeFileSync(
    join(previous, 'migrate.ts'),
    `import { createEngine } from './src/index.js';\n` +
      `const engine = createEngine({ connectionString: process.env.DATABASE_URL!, log: () => {} });\n` +
      `await engine.migrate();\nawait engine.close();\n`,
  );
  previousEntry = new URL(`file://${join(previous, 'src/index.ts')}`).href;
});

afterAll(async () => {
  for (const worker of workers) worker.kill('SIGKILL');
  await Promise.all(workers.map((worker) => worker.exited));
  for (const database of databases) await admin(`drop database if exists ${database} with (force)`);
  if (previous) rmSync(previous, { recursive: true, force: true });
});

describe.skipIf(Boolean(missing))('upgrade with runs in flight', () => {
  it("the previous release's runs and worker carry on across this build's migrations, and end once each", async () => {
    const url = await emptyDatabase('upgrade');
    migrateWithPreviousRelease(url);
    const pool = new pg.Pool({ connectionString: url, max: 4 });
    try {
      const before = await appliedMigrations(pool);
      const ours = loadMigrations().map((m) => m.version);
      const added = ours.filter((version) => !before.includes(version));
      expect(before.every((version) => ours.includes(version))).toBe(true);
      await pool.query(FIXTURE_TABLES);

      const oldWorker = await spawnWorker({ DATABASE_URL: url, RUNLEDGER_ENTRY: previousEntry, LEASE_MS: '1500' }, UPGRADE_WORKER);
      workers.push(oldWorker);
      const oldPid = oldWorker.pid;
      const start = async (ms: number, wait: boolean) =>
        (await pool.query('select runledger.start_run($1, $2) as id', ['upgrade-order', JSON.stringify({ ms, wait })])).rows[0]
          .id as string;
      const quick = await Promise.all(Array.from({ length: 20 }, () => start(0, false)));
      const slow = await Promise.all(Array.from({ length: 10 }, () => start(4000, false)));
      const waiting = await Promise.all(Array.from({ length: 10 }, () => start(0, true)));
      const all = [...quick, ...slow, ...waiting];

      const countIn = async (ids: string[], status: string) =>
        Number(
          (await pool.query('select count(*)::int as n from runledger.runs where run_id = any($1) and status = $2', [ids, status])).rows[0]
            .n,
        );
      await waitFor('the quick runs to finish on the previous release', async () => (await countIn(quick, 'SUCCEEDED')) === 20);
      await waitFor('the waiting runs to wait', async () => (await countIn(waiting, 'WAITING')) === 10);
      await waitFor('the slow runs to be in their slow step', async () => {
        const rows = await pool.query(
          `select count(distinct run_id)::int as n from step_executions where step = 'work' and run_id = any($1)`,
          [slow],
        );
        return rows.rows[0].n === 10;
      });

      // This build's migrate, while the previous release's worker holds 10 runs mid-step.
      const engine = createEngine({ connectionString: url, log: () => {} });
      try {
        await engine.migrate();
        const after = await appliedMigrations(pool);
        expect(after).toEqual(ours);
        console.log(`upgrade drill: migrations ${added.join(', ') || '(none new)'} applied under a running previous-release worker`);

        // The old worker, on the new schema: its slow runs finish, and it takes a run started now.
        await waitFor('the slow runs to finish on the previous release', async () => (await countIn(slow, 'SUCCEEDED')) === 10, 60_000);
        const late = await start(0, false);
        all.push(late);
        await waitFor('a run started after the upgrade to finish', async () => (await countIn([late], 'SUCCEEDED')) === 1);
        const lateBy = (await pool.query('select output from runledger.runs where run_id = $1', [late])).rows[0].output;
        expect(lateBy.pid).toBe(oldPid);

        // Replace the old worker; signal the waiting runs; they end on the new one.
        const newWorker = await spawnWorker({ DATABASE_URL: url, LEASE_MS: '1500' }, UPGRADE_WORKER);
        workers.push(newWorker);
        oldWorker.kill('SIGTERM');
        expect((await oldWorker.exited).code).toBe(0);
        for (const [i, runId] of waiting.entries()) {
          expect(await engine.signal(runId, 'go', { by: `operator-${i}` })).toBe(true);
        }
        await waitFor('every run to complete', async () => (await countIn(all, 'SUCCEEDED')) === all.length, 60_000);
        const shippedByNew = await pool.query(
          `select count(*)::int as n from runledger.runs where run_id = any($1) and (output->>'pid')::int = $2`,
          [waiting, newWorker.pid],
        );
        expect(shippedByNew.rows[0].n).toBe(waiting.length);
        newWorker.kill('SIGTERM');
        expect((await newWorker.exited).code).toBe(0);

        const effects = await pool.query<{ run_id: string; items: string[] }>(
          'select run_id, array_agg(item order by item) as items from orders group by run_id',
        );
        expect(effects.rows).toHaveLength(all.length);
        for (const row of effects.rows) {
          expect(row.items).toHaveLength(2);
          expect(row.items[0]).toBe('reserved');
          expect(row.items[1]).toMatch(/^shipped by /);
        }
        const shippers = await pool.query(`select output->>'shippedBy' as by from runledger.runs where run_id = any($1) order by 1`, [
          waiting,
        ]);
        expect(shippers.rows.map((row) => row.by)).toEqual(waiting.map((_, i) => `operator-${i}`).sort());
        const failed = await pool.query(`select count(*)::int as n from runledger.runs where status <> 'SUCCEEDED'`);
        expect(failed.rows[0].n).toBe(0);
      } finally {
        await engine.close();
      }
    } finally {
      await pool.end();
    }
  }, 180_000);

  it("three of this build's migrators at once on a database the previous release migrated: each migration applied once", async () => {
    const url = await emptyDatabase('upgrade_race');
    migrateWithPreviousRelease(url);
    const engines = Array.from({ length: 3 }, () => createEngine({ connectionString: url, log: () => {} }));
    try {
      const outcomes = await Promise.allSettled(engines.map((engine) => engine.migrate()));
      expect(outcomes.map((outcome) => outcome.status)).toEqual(['fulfilled', 'fulfilled', 'fulfilled']);
      const pool = engines[0]!.pool;
      expect(await appliedMigrations(pool)).toEqual(loadMigrations().map((m) => m.version));
      // Each migration's objects exist once: a second application would have failed on them (or on the key).
      const checksums = await pool.query<{ n: number }>('select count(*)::int as n from runledger.migrations where checksum is null');
      expect(checksums.rows[0]!.n).toBe(0);
    } finally {
      await Promise.all(engines.map((engine) => engine.close()));
    }
  }, 120_000);
});
