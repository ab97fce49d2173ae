import { describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';
import { runCli } from '../helpers/cli.js';

/**
 * Patches (ctx.patched / ctx.deprecatePatch) and non-determinism that explains itself: the
 * evidence names the position, both steps and both versions; retry after a fix,
 * migrate_run and fork_run onto another version bring the run back.
 */
const t = useTestEngine();
const { db } = t;
const startPatchWorker = queueWorkers(() => t.engine, 'patches');
const startShiftWorker = queueWorkers(() => t.engine, 'shifting');

const runRow = async (runId: string) =>
  (
    await db.pool.query(
      'select workflow_version, status, termination_reason, termination_evidence, output from runledger.runs where run_id = $1',
      [runId],
    )
  ).rows[0];
const stepNames = async (runId: string) =>
  (await db.pool.query('select name from runledger.steps where run_id = $1 order by seq', [runId])).rows.map((r) => r.name as string);
const statusIs = (runId: string, status: string) => async () => ((await runRow(runId)).status === status ? true : undefined);

describe('ctx.patched', () => {
  it('is taken by runs that reach it after the deploy and not by runs that passed it before; deprecatePatch replays both', async () => {
    let code: 'old' | 'patched' | 'deprecated' = 'old';
    const executed: string[] = [];
    const wf = t.engine.workflow({ name: 'patchy', queue: 'patches' }, async (ctx) => {
      await ctx.step('a', () => 1);
      let path: string;
      if (code === 'old') {
        path = await ctx.step('old', () => (executed.push('old'), 'old'));
      } else if (code === 'patched') {
        path = (await ctx.patched('fix-1'))
          ? await ctx.step('new', () => (executed.push('new'), 'new'))
          : await ctx.step('old', () => (executed.push('old'), 'old'));
        // A second call in the same execution gives the same answer and takes no position.
        expect(await ctx.patched('fix-1')).toBe(path === 'new');
      } else {
        await ctx.deprecatePatch('fix-1');
        path = await ctx.step('new', () => (executed.push('new'), 'new'));
      }
      await ctx.waitForSignal('go');
      return path;
    });
    await startPatchWorker();
    const old = (await t.engine.start(wf, undefined)).runId;
    await waitFor('old run waits', statusIs(old, 'WAITING'));

    code = 'patched'; // the deploy
    const taken = (await t.engine.start(wf, undefined)).runId;
    await waitFor('patched run waits', statusIs(taken, 'WAITING'));
    expect(await stepNames(old)).toEqual(['a', 'old', 'go']);
    expect(await stepNames(taken)).toEqual(['a', '@patch:fix-1', 'new', 'go']);
    const patches = async () =>
      (
        await db.pool.query(
          'select patch, runs_taken, replayable_taken, replayable_before from runledger.patches where workflow_name = $1',
          ['patchy'],
        )
      ).rows;
    expect(await patches()).toEqual([{ patch: 'fix-1', runs_taken: '1', replayable_taken: '1', replayable_before: '1' }]);

    // The old run replays on the patched code: patched is false where its history has another step.
    await t.engine.signal(old, 'go');
    await waitFor('old run finished', statusIs(old, 'SUCCEEDED'));
    expect((await runRow(old)).output).toBe('old');
    expect(await patches()).toEqual([{ patch: 'fix-1', runs_taken: '1', replayable_taken: '1', replayable_before: '0' }]);

    // No old run is left: the old branch goes. The run that took the patch replays past its marker.
    code = 'deprecated';
    const fresh = (await t.engine.start(wf, undefined)).runId;
    await waitFor('new run waits', statusIs(fresh, 'WAITING'));
    expect(await stepNames(fresh)).toEqual(['a', 'new', 'go']);
    await t.engine.signal(taken, 'go');
    await t.engine.signal(fresh, 'go');
    await waitFor('both finished', async () =>
      (await runRow(taken)).status === 'SUCCEEDED' && (await runRow(fresh)).status === 'SUCCEEDED' ? true : undefined,
    );
    expect([(await runRow(taken)).output, (await runRow(fresh)).output]).toEqual(['new', 'new']);
    // Each branch ran once per run that took it, never again on replay.
    expect(executed.sort()).toEqual(['new', 'new', 'old']);
    expect(await patches()).toEqual([{ patch: 'fix-1', runs_taken: '1', replayable_taken: '0', replayable_before: '0' }]);
  });

  it('refuses a bad patch id', async () => {
    const wf = t.engine.workflow({ name: 'bad-patch', queue: 'patches' }, async (ctx) => ctx.patched('no spaces allowed'));
    await startPatchWorker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    expect((await t.engine.getRun(handle.runId))?.error).toMatchObject({ code: 'CONFIG', message: expect.stringContaining('patch id') });
  });
});

describe('a non-determinism', () => {
  it('names the position, the recorded step, the step the code asked for and both versions; fork onto version 2 or migrate_run bring the run back', async () => {
    let renamed = false;
    const define = (version: string, migrations?: Record<string, () => { continueFrom: number }>) =>
      t.engine.workflow(
        { name: 'shifting', version, queue: 'shifting', manifest: { prompt: `p${version}` }, ...(migrations ? { migrations } : {}) },
        async (ctx) => {
          await ctx.step('load', () => 'loaded');
          await ctx.waitForSignal('go');
          await ctx.step(version === '1' && renamed ? 'charge-card' : 'charge', () => `charged on v${version}`);
          return `done on v${version}`;
        },
      );
    define('1');
    // Version 2 continues a version-1 run from its first two checkpoints.
    define('2', { '1': () => ({ continueFrom: 2 }) });
    await startShiftWorker();
    // A run records its history, then version 1's code changes under it.
    const second = (await db.pool.query(`select runledger.start_run('shifting', '{}', '{"version": "1"}') as run_id`)).rows[0]
      .run_id as string;
    await waitFor('waits', statusIs(second, 'WAITING'));
    await t.engine.signal(second, 'go');
    await waitFor('charged', async () => ((await stepNames(second)).length === 3 ? true : undefined));
    await waitFor('finished', statusIs(second, 'SUCCEEDED'));
    renamed = true;
    // Replaying the recorded history on the changed code: fork from the end, so every step replays.
    const replay = await t.engine.fork(second, { fromStep: 3 });
    await waitFor('dead-lettered', statusIs(replay.runId, 'DEAD_LETTER'));
    const row = await runRow(replay.runId);
    expect(row.termination_reason).toBe('NON_DETERMINISM');
    expect(row.termination_evidence).toMatchObject({
      seq: 2,
      expected: 'charge',
      actual: 'charge-card',
      expectedKind: 'step',
      actualKind: 'step',
      run_manifest: { workflow: 'shifting@1', manifest: { prompt: 'p1' } },
      code_manifest: { workflow: 'shifting@1', manifest: { prompt: 'p1' } },
    });
    const shown = await runCli(db.url, ['show', replay.runId]);
    expect(shown.stdout).toMatch(/mismatch +at step 2 the history holds step "charge" but the code asked for/);
    expect(shown.stdout).toContain('recorded by shifting@1, the code is shifting@1');

    // Fork onto version 2: the fork reuses the first two checkpoints and finishes on version 2's code.
    const forked = await t.engine.fork(replay.runId, { fromStep: 2, version: '2' });
    await waitFor('fork finished', statusIs(forked.runId, 'SUCCEEDED'));
    expect(await runRow(forked.runId)).toMatchObject({ workflow_version: '2', output: 'done on v2' });
    await expect(t.engine.fork(replay.runId, { fromStep: 2, version: '9' })).rejects.toMatchObject({
      code: 'UNKNOWN_WORKFLOW',
      message: expect.stringContaining('has no version'),
    });

    // Or migrate the dead-lettered run itself: it comes back PENDING on version 2 and finishes there.
    const moved = await t.engine.migrateRun(replay.runId, '2');
    expect(moved).toMatchObject({ outcome: 'migrated', fromVersion: '1', toVersion: '2' });
    await waitFor('migrated run finished', statusIs(replay.runId, 'SUCCEEDED'));
    expect(await runRow(replay.runId)).toMatchObject({ workflow_version: '2', output: 'done on v2', termination_reason: 'COMPLETED' });
    expect(await stepNames(replay.runId)).toEqual(['load', 'go', 'charge']);
    const migrated = await db.pool.query(`select detail from runledger.events where run_id = $1 and kind = 'migrated'`, [replay.runId]);
    expect(migrated.rows[0].detail).toMatchObject({
      previous_status: 'DEAD_LETTER',
      status: 'PENDING',
      termination_reason: 'NON_DETERMINISM',
    });
  });
});
