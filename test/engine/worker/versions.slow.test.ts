import { fileURLToPath } from 'node:url';
import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';
import { runCli } from '../../helpers/cli.js';

/**
 * Versions across deploys, with real worker processes: a run waiting under version 1
 * outlives its worker; with only a version-2 worker live it is stranded (listed, never
 * failed); a version-1 worker started again finishes it on version-1 code.
 */
const t = useTestEngine();
const { db } = t;
// Registered before stoppedAfterEach so that it runs after it (afterEach hooks run in reverse):
// the workers a test killed count as stopped for the next one, whose checks of the live
// workers (migrate_run's "no live worker serves ...") must not see them for two lease lengths.
afterEach(async () => {
  await db.pool.query('update runledger.workers set stopped_at = runledger.now() where stopped_at is null');
});
const { processes } = stoppedAfterEach();
const SCRIPT = fileURLToPath(new URL('../../fixtures/version-worker.ts', import.meta.url));

async function versionWorker(version: string, migration?: 'keep' | 'throw', failpoint?: string): Promise<WorkerProcess> {
  const w = await spawnWorker(
    {
      DATABASE_URL: db.url,
      VERSION: version,
      ...(migration ? { MIGRATION: migration } : {}),
      ...(failpoint ? { FAILPOINT: failpoint } : {}),
    },
    SCRIPT,
  );
  processes.push(w);
  onTestFailed(() => console.error(`--- worker v${version} ${w.pid} ---\n${w.output().slice(-3000)}`));
  return w;
}
const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const stranded = async () =>
  (await db.pool.query('select run_id, workflow_version, status, served_versions from runledger.stranded_runs order by created_at')).rows;

const cli = (args: string[]) => runCli(db.url, args);

/** Starts a version-1 run from SQL and waits for its approval request. */
async function startWaitingRun(): Promise<{ runId: string; request: string }> {
  const { rows } = await db.pool.query(`select runledger.start_run('deploy', '{}', '{"version": "1"}') as run_id`);
  const runId = rows[0].run_id as string;
  const request = await waitFor('the approval request', async () => {
    const r = await db.pool.query(`select request_id from runledger.approvals where run_id = $1 and decision is null`, [runId]);
    return r.rows[0]?.request_id as string | undefined;
  });
  return { runId, request };
}

/** A version-1 run waiting for its approval, with version 1's worker stopped gracefully afterwards. */
async function waitingRunOfStoppedVersion1(): Promise<{ runId: string; request: string }> {
  const v1 = await versionWorker('1');
  const waiting = await startWaitingRun();
  v1.kill('SIGTERM');
  expect((await v1.exited).code).toBe(0);
  processes.splice(processes.indexOf(v1), 1);
  return waiting;
}

describe('a run that outlives its version', () => {
  it('is stranded while only version 2 is served, moves to PENDING on approval without failing, and finishes on version 1 code', async () => {
    const v1 = await versionWorker('1');
    const { runId, request } = await startWaitingRun();
    // The manifest the version registered is recorded on the run (started from SQL).
    expect((await runRow(runId)).version_manifest).toMatchObject({
      runtime: expect.stringMatching(/^runledger@/),
      checkpointSchema: 1,
      workflow: 'deploy@1',
      manifest: { agent: 'a1', prompt: 'p1' },
      started_from: 'sql',
    });
    expect(await stranded()).toEqual([]);

    // The deploy: version 1's worker stops gracefully, version 2's starts.
    v1.kill('SIGTERM');
    expect((await v1.exited).code).toBe(0);
    processes.splice(processes.indexOf(v1), 1);
    await versionWorker('2');
    expect(await stranded()).toEqual([{ run_id: runId, workflow_version: '1', status: 'WAITING', served_versions: ['2'] }]);
    const stats = await db.pool.query(
      `select workflow_version, active, live_workers from runledger.version_stats where workflow_name = 'deploy'`,
    );
    expect(stats.rows).toEqual([{ workflow_version: '1', active: '1', live_workers: '0' }]);

    // The approval arrives after the deploy: the run becomes runnable, and waits for a worker of its version.
    await db.pool.query(`select runledger.decide_approval($1, true, 'ops', 'go')`, [request]);
    await waitFor('woken', async () => ((await runRow(runId)).status === 'PENDING' ? true : undefined));
    // Version 2 works meanwhile (its runs finish), and never takes the version-1 run.
    const v2run = (await db.pool.query(`select runledger.start_run('deploy', '{}', '{"version": "2"}') as run_id`)).rows[0].run_id;
    await waitFor('the version-2 run waits for approval', async () =>
      (await db.pool.query(`select 1 from runledger.approvals where run_id = $1`, [v2run])).rowCount ? true : undefined,
    );
    expect(await runRow(runId)).toMatchObject({ status: 'PENDING', fencing_token: '1', termination_reason: null });
    expect((await stranded()).map((r) => [r.run_id, r.status])).toEqual([[runId, 'PENDING']]);
    const listed = await cli(['runs', '--stranded']);
    expect(listed.code).toBe(0);
    expect(listed.stdout).toContain(runId);
    expect(listed.stdout).toContain('deploy@1');
    const workers = await cli(['workers']);
    expect(workers.stdout).toContain('warning: 1 run(s) of deploy@1 wait for a worker');
    const versions = await cli(['versions']);
    expect(versions.stdout).toMatch(/deploy@1 .*0 \(stranded\)/);
    const doctor = await cli(['doctor']);
    expect(doctor.code).toBe(1);
    expect(doctor.stdout).toContain('warning  stranded runs: 1 of deploy@1 (live workers serve 2)');
    expect(doctor.stdout).toMatch(/ok +workers: 1 live/);

    // Version 1 comes back (a rollback, or a drain worker): it finishes the run on its own code.
    await versionWorker('1');
    await waitFor('finished', async () => ((await runRow(runId)).status === 'SUCCEEDED' ? true : undefined));
    expect((await runRow(runId)).output).toBe('shipped on v1');
    expect(await stranded()).toEqual([]);
    const healthy = await cli(['doctor', '--json']);
    expect(healthy.code).toBe(0);
    expect(JSON.parse(healthy.stdout).map((f: { check: string; ok: boolean }) => [f.check, f.ok])).toEqual([
      ['schema', true],
      ['workers', true],
      ['stranded runs', true],
      ['migrations', true],
      ['dead letter', true],
      ['unknown operations', true],
      ['held transactions', true],
    ]);
  });
});

const events = async (runId: string, kind: string) =>
  (await db.pool.query('select detail from runledger.events where run_id = $1 and kind = $2 order by event_id', [runId, kind])).rows.map(
    (r) => r.detail,
  );

describe('migrating a run to the new version', () => {
  it('moves a waiting version-1 run to version 2 through its registered migration; it finishes on version-2 code with both manifests recorded', async () => {
    const { runId, request } = await waitingRunOfStoppedVersion1();
    // Without a version-2 worker that has the migration, migrate_run is refused and nothing changes.
    const refused = await cli(['migrate-run', runId, '--to', '2']);
    expect(refused.code).toBe(1);
    expect(refused.stderr).toContain('UNKNOWN_WORKFLOW');
    expect(refused.stderr).toContain('no live worker serves deploy@2');
    await versionWorker('2', 'keep');
    expect((await stranded()).map((r) => r.run_id)).toEqual([runId]);

    const migrated = await cli(['migrate-run', runId, '--to', '2']);
    expect(migrated.stderr).toBe('');
    expect(migrated.code).toBe(0);
    expect(migrated.stdout).toContain(`${runId}  migrated to version 2, now WAITING`);
    const row = await runRow(runId);
    expect(row).toMatchObject({ workflow_version: '2', status: 'WAITING', migrate_to: null, input: { migrated: true } });
    expect(row.version_manifest).toMatchObject({ workflow: 'deploy@2', manifest: { agent: 'a2' }, migrated_from: '1' });
    const [event] = await events(runId, 'migrated');
    expect(event).toMatchObject({
      from_version: '1',
      to_version: '2',
      previous_status: 'WAITING',
      status: 'WAITING',
      manifest_before: { workflow: 'deploy@1', manifest: { agent: 'a1' } },
      manifest_after: { workflow: 'deploy@2', manifest: { agent: 'a2' } },
      input_changed: true,
      checkpoints_kept: 2,
    });
    expect(await events(runId, 'migration_requested')).toHaveLength(1);
    expect(await stranded()).toEqual([]);

    // The approval arrives: version 2's code finishes the run, replaying the migrated checkpoints.
    await db.pool.query(`select runledger.decide_approval($1, true, 'ops', 'go')`, [request]);
    await waitFor('finished', async () => ((await runRow(runId)).status === 'SUCCEEDED' ? true : undefined));
    expect((await runRow(runId)).output).toBe('shipped on v2 after a migration');
    const steps = await db.pool.query('select seq, name, status, output from runledger.steps where run_id = $1 order by seq', [runId]);
    expect(steps.rows.map((s) => [s.seq, s.name, s.status])).toEqual([
      [0, 'prepare', 'SUCCEEDED'],
      [1, 'ship', 'SUCCEEDED'],
      [2, 'ship', 'SUCCEEDED'],
    ]);
    expect(steps.rows[0].output).toBe('prepared on v1 (migrated)');
    const shown = await cli(['show', runId]);
    expect(shown.stdout).toMatch(/migrated +.*"from_version":"1"/);
  });

  it('a worker killed between the migration write and its COMMIT leaves the run on version 1, still marked; the next worker migrates it once', async () => {
    const { runId, request } = await waitingRunOfStoppedVersion1();
    const before = (await db.pool.query('select * from runledger.steps where run_id = $1 order by seq', [runId])).rows;
    const doomed = await versionWorker('2', 'keep', 'before-migration-commit');
    const marked = await cli(['migrate-run', runId, '--to', '2', '--no-wait']);
    expect(marked.code).toBe(0);
    expect((await doomed.exited).signal).toBe('SIGKILL');
    processes.splice(processes.indexOf(doomed), 1);
    expect(await runRow(runId)).toMatchObject({ workflow_version: '1', migrate_to: '2', status: 'WAITING', input: {} });
    expect((await db.pool.query('select * from runledger.steps where run_id = $1 order by seq', [runId])).rows).toEqual(before);
    expect(await events(runId, 'migrated')).toEqual([]);

    await versionWorker('2', 'keep');
    await waitFor('migrated', async () => ((await runRow(runId)).workflow_version === '2' ? true : undefined));
    expect(await events(runId, 'migrated')).toHaveLength(1);
    await db.pool.query(`select runledger.decide_approval($1, true, 'ops', 'go')`, [request]);
    await waitFor('finished', async () => ((await runRow(runId)).status === 'SUCCEEDED' ? true : undefined));
    expect((await runRow(runId)).output).toBe('shipped on v2 after a migration');
  });

  it('records a migrate that throws as a failed migration and leaves the run as it was', async () => {
    const { runId } = await waitingRunOfStoppedVersion1();
    await versionWorker('2', 'throw');
    const before = await db.pool.query('select * from runledger.steps where run_id = $1 order by seq', [runId]);
    const result = await cli(['migrate-run', runId, '--to', '2']);
    expect(result.code).toBe(1);
    expect(result.stdout).toContain('not migrated');
    expect(result.stdout).toContain('the ship step changed its contract');
    expect(await runRow(runId)).toMatchObject({ workflow_version: '1', status: 'WAITING', migrate_to: null, input: {} });
    expect((await db.pool.query('select * from runledger.steps where run_id = $1 order by seq', [runId])).rows).toEqual(before.rows);
    const [failed] = await events(runId, 'migration_failed');
    expect(failed).toMatchObject({ from_version: '1', to_version: '2', error: { code: 'MIGRATION_FAILED' } });
    expect(await events(runId, 'migrated')).toEqual([]);
    // Still stranded, still waiting: nothing failed the run.
    expect((await stranded()).map((r) => [r.run_id, r.status])).toEqual([[runId, 'WAITING']]);
  });
});

describe('the manifest', () => {
  it('is stored on each run with the runtime and checkpoint schema, shown by getRun; a bad one is refused at definition', async () => {
    const wf = t.engine.workflow({ name: 'manifested', queue: 'manifest', manifest: { tools: { git: 'v3' } } }, async () => 'ok');
    const handle = await t.engine.start(wf, undefined);
    expect((await t.engine.getRun(handle.runId))?.versionManifest).toEqual({
      runtime: expect.stringMatching(/^runledger@/),
      checkpointSchema: 1,
      workflow: 'manifested@1',
      manifest: { tools: { git: 'v3' } },
    });
    expect(() => t.engine.workflow({ name: 'bad-manifest-1', manifest: [] as never }, async () => 1)).toThrow(
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('manifest must be an object') }),
    );
    expect(() => t.engine.workflow({ name: 'bad-manifest-2', manifest: { n: 10n } as never }, async () => 1)).toThrow(
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining("can't be stored as JSON") }),
    );
    expect(() => t.engine.workflow({ name: 'bad-manifest-3', manifest: { big: 'x'.repeat(20_000) } }, async () => 1)).toThrow(
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('over the limit') }),
    );
  });
});
