import { describe, expect, it } from 'vitest';
import type { NoProgressEvidence } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';

/** Progress signals with the no-progress policy (onNoProgress once, then NO_PROGRESS), and verified completion. */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'agents');
const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const stepNames = async (runId: string) =>
  (await db.pool.query('select name from runledger.steps where run_id = $1 order by seq', [runId])).rows.map((r) => r.name as string);

describe('progress signals and the no-progress policy', () => {
  it('rounds that bring nothing new end the run NO_PROGRESS at the limit, with the rounds as evidence', async () => {
    const wf = t.engine.workflow({ name: 'stuck', queue: 'agents', limits: { noProgress: 3 } }, async (ctx) => {
      await ctx.progress({ observation: 'file listing', plan: 'read the code' });
      for (let i = 0; i < 10; i++) await ctx.progress({ observation: 'file listing' }); // the same thing again
      return 'never';
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'NO_PROGRESS' } });
    const run = await runRow(handle.runId);
    expect(run.termination_evidence).toEqual({ kind: 'progress', rounds: 3, limit: 3, positions: [1, 2, 3], after_on_no_progress: false });
    expect(await stepNames(handle.runId)).toEqual(['@progress', '@progress', '@progress', '@progress']);
  });

  it('new observations, artifacts, plans or states reset the count', async () => {
    const results: Array<{ progressed: boolean; roundsWithoutProgress: number }> = [];
    const wf = t.engine.workflow({ name: 'learning', queue: 'agents', limits: { noProgress: 2 } }, async (ctx) => {
      results.push(await ctx.progress({ observation: 'a' }));
      results.push(await ctx.progress({ observation: 'a' }));
      results.push(await ctx.progress({ observation: 'a', artifact: 'diff-1' }));
      results.push(await ctx.progress({ observation: 'a', plan: 'a' })); // a plan 'a' is not the observation 'a'
      results.push(await ctx.progress({ state: { step: 2 } }));
      return 'done';
    });
    await worker();
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toBe('done');
    expect(results).toEqual([
      { progressed: true, roundsWithoutProgress: 0 },
      { progressed: false, roundsWithoutProgress: 1 },
      { progressed: true, roundsWithoutProgress: 0 },
      { progressed: true, roundsWithoutProgress: 0 },
      { progressed: true, roundsWithoutProgress: 0 },
    ]);
  });

  it('onNoProgress is called once at the limit; the run ends NO_PROGRESS only if the next rounds bring nothing new either', async () => {
    const calls: NoProgressEvidence[] = [];
    const wf = t.engine.workflow(
      {
        name: 'replan',
        queue: 'agents',
        limits: { noProgress: 2 },
        onNoProgress: async (ctx, evidence) => {
          calls.push(evidence);
          await ctx.step('replan', () => 'fewer tools');
        },
      },
      async (ctx) => {
        await ctx.progress({ observation: 'x' });
        for (let i = 0; i < 10; i++) await ctx.progress({ observation: 'x' });
        return 'never';
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'NO_PROGRESS' } });
    expect(calls).toEqual([{ rounds: 2, limit: 2, positions: [1, 2] }]);
    const run = await runRow(handle.runId);
    expect(run.termination_evidence).toMatchObject({ rounds: 2, after_on_no_progress: true, positions: [5, 6] });
    expect(await stepNames(handle.runId)).toEqual([
      '@progress',
      '@progress',
      '@progress',
      'replan',
      '@no-progress',
      '@progress',
      '@progress',
    ]);
  });

  it('a re-plan that brings progress lets the run go on and succeed', async () => {
    let replans = 0;
    const wf = t.engine.workflow(
      {
        name: 'replan-works',
        queue: 'agents',
        limits: { noProgress: 2 },
        onNoProgress: () => void replans++,
      },
      async (ctx) => {
        for (let i = 0; i < 3; i++) await ctx.progress({ observation: 'same' });
        for (let i = 0; i < 4; i++) await ctx.progress({ observation: `new ${i}` });
        return 'solved';
      },
    );
    await worker();
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toBe('solved');
    expect(replans).toBe(1);
  });

  it('bad signals are refused with a coded error', async () => {
    const errors: unknown[] = [];
    const wf = t.engine.workflow({ name: 'bad-progress', queue: 'agents' }, async (ctx) => {
      for (const bad of [{ mood: 'good' }, {}, 'text']) {
        try {
          await ctx.progress(bad as never);
        } catch (error) {
          errors.push(error);
        }
      }
      return 'ok';
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('ok');
    expect(errors.map((e) => (e as { code: string }).code)).toEqual(['CONFIG', 'CONFIG', 'CONFIG']);
    expect(await stepNames(handle.runId)).toEqual([]);
  });
});

describe('verified completion', () => {
  it('SUCCEEDED only after verify passes, with its evidence in the termination record', async () => {
    const wf = t.engine.workflow(
      {
        name: 'verified',
        queue: 'agents',
        verify: async (output, ctx) => {
          const tests = await ctx.step('run-tests', () => ({ passed: 12, failed: 0 }));
          return tests.failed === 0 && output === 'patched' ? { ok: true, evidence: { tests } } : { ok: false, reason: 'tests fail' };
        },
      },
      async (ctx) => {
        await ctx.step('edit', () => 'ok');
        return 'patched';
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('patched');
    const run = await runRow(handle.runId);
    expect(run.termination_reason).toBe('COMPLETED');
    expect(run.termination_evidence.verification).toEqual({ tests: { passed: 12, failed: 0 } });
    expect(await stepNames(handle.runId)).toEqual(['edit', 'run-tests', '@verify']);
  });

  it('a refused output ends the run FAILED with reason UNVERIFIED and the reason as evidence', async () => {
    const wf = t.engine.workflow(
      { name: 'unverified', queue: 'agents', verify: () => ({ ok: false, reason: '3 tests fail', evidence: { failed: 3 } }) },
      async () => 'claims it is done',
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'UNVERIFIED' } });
    const run = await runRow(handle.runId);
    expect(run.status).toBe('FAILED');
    expect(run.output).toBeNull();
    expect(run.termination_evidence).toEqual({ reason: '3 tests fail', evidence: { failed: 3 } });
    expect(run.error).toMatchObject({ code: 'UNVERIFIED' });
    const events = await db.pool.query(`select kind from runledger.events where run_id = $1 order by event_id desc limit 1`, [
      handle.runId,
    ]);
    expect(events.rows[0].kind).toBe('unverified');
  });

  it('a verify that answers something else, or throws, fails the run (FAILED) with the coded error', async () => {
    const bad = t.engine.workflow({ name: 'bad-verdict', queue: 'agents', verify: () => ({ fine: true }) as never }, async () => 1);
    const throws = t.engine.workflow(
      {
        name: 'verify-throws',
        queue: 'agents',
        verify: () => {
          throw new Error('checker crashed');
        },
      },
      async () => 1,
    );
    await worker();
    const a = await t.engine.start(bad, undefined);
    const b = await t.engine.start(throws, undefined);
    await expect(a.result()).rejects.toMatchObject({ details: { terminationReason: 'FAILED' } });
    await expect(b.result()).rejects.toMatchObject({ details: { terminationReason: 'FAILED' } });
    expect((await runRow(a.runId)).error).toMatchObject({ code: 'INVALID_VERDICT' });
    expect((await runRow(b.runId)).error).toMatchObject({ message: 'checker crashed' });
  });
});
