import { mkdtempSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { useTestEngine } from './helpers/test-engine.js';
import { stoppedAfterEach } from './helpers/cleanup.js';
import { waitFor } from './helpers/database.js';
import { defineEnvironmentWorkflows } from './fixtures/environment-workflows.js';

/**
 * Environments (WorkflowOptions.environment, sql/0020_environments.sql): made once per run and
 * checkpointed, rebuilt on a worker that lacks it, reclaimed once whatever the terminal status,
 * by the run's worker or by another worker's sweep. Worker processes killed: environments-crash.slow.test.ts.
 */
const t = useTestEngine();
const { db } = t;
const { workers } = stoppedAfterEach();
const logFile = join(mkdtempSync(join(tmpdir(), 'runledger-env-log-')), 'log');
let defined: ReturnType<typeof defineEnvironmentWorkflows> | undefined;
const workflows = () => (defined ??= defineEnvironmentWorkflows(t.engine, logFile));
const worker = async (engine = t.engine) => {
  if (engine === t.engine) workflows();
  const w = await engine.runWorker({ queues: ['environments'], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 50, sweepIntervalMs: 250 });
  workers.push(w);
  return w;
};
const lines = (runId: string) =>
  (existsSync(logFile) ? readFileSync(logFile, 'utf8') : '')
    .split('\n')
    .filter((line) => line.split(' ')[1] === runId)
    .map((line) => line.split(' ').slice(0, -1).join(' ').replace(` ${runId}`, ''));
const envRows = async (runId: string) =>
  (await db.pool.query(`select reclaimed_status, reclaim_attempts, last_error from runledger.environments where run_id = $1`, [runId]))
    .rows;

describe('environments', () => {
  it('a succeeded run: created once as its first step, ctx.environment is the manifest, reclaimed once with SUCCEEDED', async () => {
    await worker();
    const handle = await t.engine.start(workflows().workspace, {});
    const output = await handle.result();
    expect(output.exists).toBe(true);
    // The reclaim callback writes its line before the worker records the reclaim: wait for the row.
    await waitFor('the reclaim recorded', async () => (await envRows(handle.runId))[0]?.reclaimed_status != null);
    expect(lines(handle.runId)).toEqual([`create ${output.dir}`, 'reclaim SUCCEEDED true']);
    expect(await envRows(handle.runId)).toEqual([{ reclaimed_status: 'SUCCEEDED', reclaim_attempts: 1, last_error: null }]);
    const first = await db.pool.query(`select seq, name, output from runledger.steps where run_id = $1 order by seq limit 1`, [
      handle.runId,
    ]);
    expect(first.rows[0]).toMatchObject({ seq: 0, name: '@environment', output: { dir: output.dir } });
  });

  it('a failed run and a run cancelled while it waits (no worker holds it) are reclaimed once each, with their status', async () => {
    await worker();
    const failed = await t.engine.start(workflows().workspace, { fail: true });
    const waiting = await t.engine.start(workflows().workspace, { wait: true });
    await expect(failed.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    await waitFor(
      'the run waiting',
      async () =>
        (await db.pool.query(`select status from runledger.runs where run_id = $1`, [waiting.runId])).rows[0].status === 'WAITING',
    );
    await t.engine.cancel(waiting.runId);
    await waitFor('both reclaims recorded', async () => {
      const rows = [...(await envRows(failed.runId)), ...(await envRows(waiting.runId))];
      return rows.length === 2 && rows.every((row) => row.reclaimed_status != null);
    });
    expect(lines(failed.runId)[1]).toBe('reclaim FAILED true');
    expect(lines(waiting.runId)[1]).toBe('reclaim CANCELLED true');
    expect(await envRows(waiting.runId)).toEqual([{ reclaimed_status: 'CANCELLED', reclaim_attempts: 1, last_error: null }]);
  });

  it('a worker that lacks the environment rebuilds it from the manifest before the run goes on; the one that made it does not', async () => {
    const first = await worker();
    const handle = await t.engine.start(workflows().workspace, { wait: true });
    await waitFor(
      'the run waiting',
      async () => (await db.pool.query(`select status from runledger.runs where run_id = $1`, [handle.runId])).rows[0].status === 'WAITING',
    );
    await first.stop();
    // Another process, in effect: an engine of its own, whose worker has never seen the run.
    const other = t.newEngine();
    defineEnvironmentWorkflows(other, logFile);
    await worker(other);
    await t.engine.signal(handle.runId, 'go');
    const output = await handle.result();
    // The reclaim callback writes its line before the worker records the reclaim: wait for the row.
    await waitFor('the reclaim recorded', async () => (await envRows(handle.runId))[0]?.reclaimed_status != null);
    expect(lines(handle.runId)).toEqual([`create ${output.dir}`, `rehydrate ${output.dir}`, 'reclaim SUCCEEDED true']);
  });

  it('a reclaim that throws is recorded and tried again; a run brought back by retry_run is reclaimed again when it ends again', async () => {
    let throwOnce = true;
    const flaky = t.engine.workflow(
      {
        name: 'flaky-reclaim',
        queue: 'environments',
        environment: {
          create: () => ({ id: 1 }),
          reclaim: (_manifest, { runId, status }) => {
            if (throwOnce) {
              throwOnce = false;
              throw new Error('sandbox API down');
            }
            reclaimed.push(`${runId} ${status}`);
          },
        },
      },
      async (_ctx, input: { fail: boolean }) => {
        if (input.fail) throw new Error('failed once');
        return 'ok';
      },
    );
    const reclaimed: string[] = [];
    workflows();
    await worker();
    const handle = await t.engine.start(flaky, { fail: true });
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    await waitFor(
      'the failed reclaim',
      async () =>
        (await db.pool.query(`select last_error from runledger.environments where run_id = $1`, [handle.runId])).rows[0]?.last_error,
    );
    const failedOnce = (
      await db.pool.query(`select reclaimed_at, last_error, reclaim_attempts from runledger.environments where run_id = $1`, [handle.runId])
    ).rows[0];
    expect(failedOnce).toMatchObject({ reclaimed_at: null, reclaim_attempts: 1, last_error: { message: 'sandbox API down' } });
    // Its retry is due later; time passes here by moving that time.
    await db.pool.query(`update runledger.environments set reclaim_until = now() where run_id = $1`, [handle.runId]);
    await waitFor('the second reclaim', async () => reclaimed.length === 1);
    expect(reclaimed).toEqual([`${handle.runId} FAILED`]);
    // The operator brings the run back, with input that now succeeds; it ends again: reclaimed again.
    await db.pool.query(`update runledger.runs set input = '{"fail": false}' where run_id = $1`, [handle.runId]);
    await t.engine.retry(handle.runId);
    await expect(t.engine.handle(flaky, handle.runId).result()).resolves.toBe('ok');
    await waitFor('the reclaim after the retry', async () => reclaimed.length === 2);
    expect(reclaimed[1]).toBe(`${handle.runId} SUCCEEDED`);
  });

  it('a reclaim that outlasts the lease keeps it while it runs: another worker sweeping meanwhile does not start a second one', async () => {
    let calls = 0;
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    const slow = t.engine.workflow(
      {
        name: 'slow-reclaim',
        queue: 'environments-slow',
        environment: {
          create: () => ({ vm: 'vm-1' }),
          reclaim: async (_manifest, { signal }) => {
            calls++;
            await finished; // released by the test once several leases have passed
            if (signal.aborted) throw new Error('lease lost');
          },
        },
      },
      async () => 'ok',
    );
    const options = { queues: ['environments-slow'], concurrency: 1, leaseMs: 600, pollIntervalMs: 50, sweepIntervalMs: 100 };
    workers.push(await t.engine.runWorker(options));
    const handle = await t.engine.start(slow, undefined);
    await handle.result();
    await waitFor('the reclaim started', async () => calls === 1);
    // A second worker sweeps every 100 ms; without renewal the 600 ms lease would run out three times over.
    workers.push(await t.engine.runWorker(options));
    const leasedUntil = async () =>
      (await db.pool.query(`select reclaim_until from runledger.environments where run_id = $1`, [handle.runId])).rows[0]
        .reclaim_until as Date;
    const first = await leasedUntil();
    await waitFor('the lease renewed three times over', async () => (await leasedUntil()).getTime() > first.getTime() + 1_800);
    expect(calls).toBe(1);
    finish();
    await waitFor('the reclaim recorded', async () => (await envRows(handle.runId))[0]?.reclaimed_status != null);
    expect(await envRows(handle.runId)).toEqual([{ reclaimed_status: 'SUCCEEDED', reclaim_attempts: 1, last_error: null }]);
    expect(calls).toBe(1);
  });

  it("a worker that lost a reclaim's lease is told through the signal, and its outcome is not recorded", async () => {
    let aborted = false;
    let finish!: () => void;
    const finished = new Promise<void>((resolve) => (finish = resolve));
    const taken = t.engine.workflow(
      {
        name: 'taken-reclaim',
        queue: 'environments-taken',
        environment: {
          create: () => ({ vm: 'vm-2' }),
          reclaim: async (_manifest, { signal }) => {
            signal.addEventListener('abort', () => (aborted = true));
            await finished;
          },
        },
      },
      async () => 'ok',
    );
    const w = await t.engine.runWorker({ queues: ['environments-taken'], leaseMs: 600, pollIntervalMs: 50, sweepIntervalMs: 100 });
    workers.push(w);
    const handle = await t.engine.start(taken, undefined);
    await handle.result();
    await waitFor(
      'the reclaim leased',
      async () =>
        (await db.pool.query(`select reclaim_owner from runledger.environments where run_id = $1`, [handle.runId])).rows[0]?.reclaim_owner,
    );
    // Another worker holds it now (as after this one stalled past the lease).
    await db.pool.query(`update runledger.environments set reclaim_owner = 'another-worker' where run_id = $1`, [handle.runId]);
    await waitFor('the signal aborted', async () => aborted);
    finish();
    // stop() waits for the reclaim in flight to finish and to try to record its outcome.
    await w.stop();
    const row = (await db.pool.query(`select reclaim_owner, reclaimed_at from runledger.environments where run_id = $1`, [handle.runId]))
      .rows[0];
    expect(row).toEqual({ reclaim_owner: 'another-worker', reclaimed_at: null });
  });

  it('a bad environment option is a ConfigError', () => {
    expect(() => t.engine.workflow({ name: 'env-bad', environment: { create: () => 1 } as never }, async () => 1)).toThrow(
      /environment.reclaim must be a function/,
    );
  });
});
