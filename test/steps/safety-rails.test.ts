import { describe, expect, it } from 'vitest';
import { NotInWorkflowError, RunFailedError, StepNotAwaitedError, type WorkflowContext } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';

// Mistakes a new user makes, each caught loudly instead of ending in a silent success or a hang.
const t = useTestEngine();

/** Settles with 'never settled' when `promise` has not settled after `ms`. */
function within<T>(promise: Promise<T>, ms = 1_000): Promise<T | 'never settled'> {
  return Promise.race([promise, new Promise<'never settled'>((resolve) => setTimeout(() => resolve('never settled'), ms).unref())]);
}

describe('a ctx call still in flight when the workflow returns or throws', () => {
  it('a step that is not awaited fails the run with STEP_NOT_AWAITED naming the step and its position', async () => {
    const effects: string[] = [];
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let bodyStarted!: () => void;
    const started = new Promise<void>((resolve) => (bodyStarted = resolve));
    const wf = t.engine.workflow({ name: 'rails-unawaited-step' }, async (ctx) => {
      await ctx.step('first', () => 1);
      await ctx.step('second', () => 2);
      // The bug: no await.
      void ctx.step('forgotten', async () => {
        effects.push('started');
        bodyStarted();
        await gate;
        return 3;
      });
      // Returns once the forgotten step's body has started (a condition, not a fixed sleep:
      // under load the body starts after the previous step's deferred checkpoint is sent).
      await within(started, 5_000);
      return 'done';
    });
    const worker = await t.engine.runWorker({ manual: true });
    try {
      const handle = await t.engine.start(wf, {});
      await worker.drain();
      release();
      const run = await t.engine.getRun(handle.runId);
      expect(run?.status).toBe('FAILED');
      expect(run?.error).toMatchObject({ name: 'StepNotAwaitedError', code: 'STEP_NOT_AWAITED' });
      expect((run?.error as { message: string }).message).toMatch(
        /returned while ctx\.step\("forgotten"\) \(position 2\) was still in flight/,
      );
      expect((run?.error as { calls: unknown }).calls).toEqual([{ call: 'step', name: 'forgotten', position: 2 }]);
      // The steps that were awaited keep their results (the last one's deferred checkpoint included); the forgotten one has none.
      expect(run?.steps?.map((s) => [s.seq, s.name, s.status])).toEqual([
        [0, 'first', 'SUCCEEDED'],
        [1, 'second', 'SUCCEEDED'],
      ]);
      await expect(handle.result({ timeoutMs: 1_000 })).rejects.toThrow(/STEP_NOT_AWAITED|forgotten/);
      // Once the run failed, the forgotten step never records anything.
      await new Promise((resolve) => setTimeout(resolve, 100));
      expect((await t.engine.getRun(handle.runId))?.steps).toHaveLength(2);
      expect(effects).toEqual(['started']); // the user's bug: the effect began, its result is not recorded
    } finally {
      await worker.stop();
    }
  });

  it('a workflow that throws while a wait is in flight fails with STEP_NOT_AWAITED, the thrown error kept as its cause', async () => {
    const wf = t.engine.workflow({ name: 'rails-unawaited-throw' }, async (ctx) => {
      void ctx.sleep('nap', '1h');
      throw new Error('boom');
    });
    const worker = await t.engine.runWorker({ manual: true });
    try {
      const handle = await t.engine.start(wf, {});
      await worker.drain();
      const run = await t.engine.getRun(handle.runId);
      expect(run?.status).toBe('FAILED');
      expect(run?.error).toMatchObject({ code: 'STEP_NOT_AWAITED', calls: [{ call: 'sleep', name: 'nap', position: 0 }] });
      expect((run?.error as { message: string }).message).toMatch(/threw \(boom\) while ctx\.sleep\("nap"\) \(position 0\)/);
      expect((run?.error as { cause: unknown }).cause).toMatchObject({ message: 'boom' });
    } finally {
      await worker.stop();
    }
  });

  it('a step that finished before the return is not in flight, awaited or not: its deferred checkpoint commits with the completion', async () => {
    const wf = t.engine.workflow({ name: 'rails-settled-step' }, async (ctx) => {
      const early = ctx.step('early', () => 1);
      await new Promise((resolve) => setTimeout(resolve, 20));
      void early;
      return 'ok';
    });
    const worker = await t.engine.runWorker({ manual: true });
    try {
      const handle = await t.engine.start(wf, {});
      await worker.drain();
      const run = await t.engine.getRun(handle.runId);
      expect(run?.status).toBe('SUCCEEDED');
      expect(run?.steps?.map((s) => [s.seq, s.name, s.status])).toEqual([[0, 'early', 'SUCCEEDED']]);
    } finally {
      await worker.stop();
    }
  });

  it('StepNotAwaitedError is a coded RunledgerError', () => {
    expect(new StepNotAwaitedError('x', { calls: [] }).code).toBe('STEP_NOT_AWAITED');
  });
});

describe('a ctx used after its run ended', () => {
  it('throws NotInWorkflowError saying the run ended and which call it was; the body never runs', async () => {
    let saved: WorkflowContext | undefined;
    const wf = t.engine.workflow({ name: 'rails-late-ctx' }, async (ctx) => {
      saved = ctx;
      await ctx.step('only', () => 1);
      return 'done';
    });
    const worker = await t.engine.runWorker({ manual: true });
    try {
      const handle = await t.engine.start(wf, {});
      await worker.drain();
      expect((await t.engine.getRun(handle.runId))?.status).toBe('SUCCEEDED');

      let ran = false;
      const late = within(
        saved!.step('late', () => {
          ran = true;
          return 2;
        }),
      );
      await expect(late).rejects.toThrow(NotInWorkflowError);
      await expect(saved!.step('late', () => 2)).rejects.toThrow(
        new RegExp(`ctx\\.step\\("late"\\) was called after run ${handle.runId} ended`),
      );
      expect(ran).toBe(false);
      await expect(within(saved!.sleep('nap', '1s'))).rejects.toMatchObject({ code: 'NOT_IN_WORKFLOW', message: /ctx\.sleep\("nap"\)/ });
      expect(() => saved!.charge(1)).toThrow(NotInWorkflowError);
      expect((await t.engine.getRun(handle.runId))?.steps).toHaveLength(1);
    } finally {
      await worker.stop();
    }
  });
});

describe('a workflow defined after a worker started', () => {
  it('warns at definition, and a result() timeout says that no live worker serves it', async () => {
    const logged: Array<[string, string]> = [];
    const engine = t.newEngine({ log: (level, message) => logged.push([level, message]) });
    engine.workflow({ name: 'rails-early' }, async () => 'early');
    const worker = await engine.runWorker({ manual: true });
    try {
      const late = engine.workflow({ name: 'rails-late', version: '2' }, async () => 'late');
      expect(logged).toContainEqual([
        'warn',
        expect.stringMatching(/rails-late@2 .*running workers .* do not serve it.*start a new worker/),
      ]);

      const handle = await engine.start(late, {});
      await worker.drain();
      const error = await handle.result({ timeoutMs: 200 }).catch((caught: unknown) => caught);
      expect(error).toBeInstanceOf(RunFailedError);
      expect((error as Error).message).toMatch(/still PENDING after 200 ms: no live worker serves rails-late@2/);
    } finally {
      await worker.stop();
    }
  });

  it('a result() timeout of a workflow that a live worker serves says nothing of the kind', async () => {
    const engine = t.newEngine();
    const wf = engine.workflow({ name: 'rails-served' }, async () => 'served');
    const worker = await engine.runWorker({ manual: true });
    try {
      const handle = await engine.start(wf, {});
      const error = await handle.result({ timeoutMs: 100 }).catch((caught: unknown) => caught);
      expect((error as Error).message).toMatch(/still PENDING after 100 ms$/);
      await worker.drain();
      await expect(handle.result({ timeoutMs: 1_000 })).resolves.toBe('served');
    } finally {
      await worker.stop();
    }
  });
});
