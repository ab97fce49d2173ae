import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';

// Each test makes the engines it needs (one per process, in effect), all closed after the file.
const t = useTestEngine({
  engine: false,
  prepare: async (db) => {
    await db.pool.query(`create table accounts (id text primary key, balance int not null);
                         insert into accounts values ('a', 100), ('b', 100)`);
  },
});
const { db } = t;

describe('versions', () => {
  it('a worker claims only the (workflow, version) pairs it serves; other versions wait, visible', async () => {
    const v1Engine = t.newEngine();
    const v1 = v1Engine.workflow({ name: 'pinned', version: '1', queue: 'pinned' }, async (ctx) => ctx.step('which', () => 'v1'));
    const v2Engine = t.newEngine();
    const v2 = v2Engine.workflow({ name: 'pinned', version: '2', queue: 'pinned' }, async (ctx) => ctx.step('which', () => 'v2'));

    const v1Worker = await v1Engine.runWorker({ queues: ['pinned'], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 100 });
    const newRun = await v2Engine.start(v2, undefined);
    const oldRun = await v1Engine.start(v1, undefined);
    await expect(oldRun.result()).resolves.toBe('v1');
    expect((await v1Engine.getRun(newRun.runId))?.status).toBe('PENDING');

    const v2Worker = await v2Engine.runWorker({ queues: ['pinned'], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 100 });
    await expect(newRun.result()).resolves.toBe('v2');
    const run = await v2Engine.getRun(newRun.runId);
    expect(run).toMatchObject({
      workflowVersion: '2',
      versionManifest: { runtime: expect.stringMatching(/^runledger@/), checkpointSchema: 1, workflow: 'pinned@2' },
    });
    await v1Worker.stop();
    await v2Worker.stop();
  });
});

describe('transaction steps under contention', () => {
  it('a deadlock aborts one transaction step, which is re-run automatically; both runs succeed once', async () => {
    const e = t.newEngine();
    let arrived = 0;
    let bothIn!: () => void;
    const barrier = new Promise<void>((resolve) => (bothIn = resolve));
    const transfer = e.workflow({ name: 'transfer', queue: 'transfer' }, async (ctx, input: { from: string; to: string }) => {
      return ctx.transaction('move', async (trx) => {
        await trx
          .updateTable('accounts')
          .set((eb) => ({ balance: eb('balance', '-', 10) }))
          .where('id', '=', input.from)
          .execute();
        if (arrived < 2 && ++arrived === 2) bothIn();
        await barrier; // both transactions hold their first row lock before taking the second
        await trx
          .updateTable('accounts')
          .set((eb) => ({ balance: eb('balance', '+', 10) }))
          .where('id', '=', input.to)
          .execute();
        return 'moved';
      });
    });
    const worker = await e.runWorker({ queues: ['transfer'], concurrency: 2, leaseMs: 5_000, pollIntervalMs: 100 });
    const ab = await e.start(transfer, { from: 'a', to: 'b' });
    const ba = await e.start(transfer, { from: 'b', to: 'a' });
    await expect(Promise.all([ab.result(), ba.result()])).resolves.toEqual(['moved', 'moved']);
    const balances = await db.pool.query('select id, balance from accounts order by id');
    expect(balances.rows).toEqual([
      { id: 'a', balance: 100 },
      { id: 'b', balance: 100 },
    ]);
    const attempts = await db.pool.query(`select attempts from runledger.steps where run_id = any($1) order by attempts`, [
      [ab.runId, ba.runId],
    ]);
    expect(attempts.rows).toEqual([{ attempts: 1 }, { attempts: 2 }]);
    await worker.stop();
  });
});

describe('graceful stop', () => {
  it('stop() waits for the sweep and heartbeat in flight: nothing logs after close, over many start/stop cycles', async () => {
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    const logged: string[] = [];
    for (let cycle = 0; cycle < 15; cycle++) {
      // The engine's own pool, slowed like a busy database: each maintenance statement of
      // a sweep and each heartbeat takes 25 ms more, so stop() often finds one on its way.
      const pool = new pg.Pool({ connectionString: db.url, max: 5 });
      const query = pool.query.bind(pool) as (text: string, values?: unknown[]) => Promise<pg.QueryResult>;
      (pool as unknown as { query: typeof query }).query = async (text, values) => {
        const result = await query(text, values);
        if (/_recover_expired|_enforce_deadlines|_admit_all|_heartbeat/.test(text)) await sleep(25);
        return result;
      };
      let closed = false;
      const e = t.newEngine({
        pool,
        log: (level, message) => {
          if (closed || level !== 'info') logged.push(`cycle ${cycle}: ${level} ${message}${closed ? ' (after close)' : ''}`);
        },
      });
      e.workflow({ name: 'stop-cycle', queue: 'stop-cycle' }, async () => 'done');
      // The sweep runs at start and then every 10 ms; the heartbeat every 166 ms (leaseMs / 3).
      const worker = await e.runWorker({ queues: ['stop-cycle'], leaseMs: 500, sweepIntervalMs: 10, pollIntervalMs: 10 });
      await sleep((cycle * 37) % 200);
      await worker.stop();
      await e.close();
      await pool.end();
      closed = true;
    }
    await sleep(200);
    expect(logged).toEqual([]);
  });

  it('finishes what it can, then gives the rest back as PENDING without counting a recovery attempt', async () => {
    const e = t.newEngine();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const held = e.workflow({ name: 'held', queue: 'held' }, async (ctx) => {
      await ctx.step('first', () => 1);
      await ctx.step('blocked', async () => {
        await gate;
        return 2;
      });
      return 'done';
    });
    const first = await e.runWorker({ queues: ['held'], concurrency: 1, leaseMs: 2_000, pollIntervalMs: 100, shutdownTimeoutMs: 200 });
    const handle = await e.start(held, undefined);
    await waitFor('first step done', async () => (await e.getRun(handle.runId))?.steps?.length === 1);
    expect(first.inFlight).toBe(1);
    await first.stop();

    const run = await e.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'PENDING', recoveryAttempts: 0, leaseOwner: null });
    const released = await db.pool.query(`select detail from runledger.events where run_id = $1 and kind = 'released'`, [handle.runId]);
    expect(released.rows).toEqual([{ detail: { reason: 'worker_stopping', delay_ms: 0, counts_attempt: false } }]);
    const stopped = await db.pool.query(`select stopped_at is not null as stopped from runledger.workers where worker_id = $1`, [
      first.workerId,
    ]);
    expect(stopped.rows).toEqual([{ stopped: true }]);

    release();
    const second = await e.runWorker({ queues: ['held'], concurrency: 1, leaseMs: 2_000, pollIntervalMs: 100 });
    await expect(handle.result()).resolves.toBe('done');
    expect(await e.getRun(handle.runId)).toMatchObject({ recoveryAttempts: 0, fencingToken: '2' });
    await second.stop();
  });
});
