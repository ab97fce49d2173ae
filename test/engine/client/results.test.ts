/**
 * Results without polling: a caller awaiting a run is woken by its own engine's worker,
 * or by NOTIFY runledger_finished from a worker elsewhere, and reads the run row once per
 * wake-up; reading on a backoff is only the fallback while its LISTEN connection is down.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { createEngine, type Engine } from '../../../src/index.js';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { notifyHelpers } from '../../helpers/notify.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';

const t = useTestEngine({ engine: false });
const { db } = t;
const { notified } = notifyHelpers(db);
const { workers } = stoppedAfterEach();

/** Reads of one run's row (getRun) made through engines built by engineCountingReads. */
const reads = new Map<string, number>();

class CountingClient extends pg.Client {
  override query(...args: any[]): any {
    const [text, values] = args;
    const sql = typeof text === 'string' ? text : text?.text;
    if (typeof sql === 'string' && /^select .* from "runledger"."runs"/.test(sql) && Array.isArray(values ?? text?.values)) {
      const runId = (values ?? text.values)[0];
      if (typeof runId === 'string') reads.set(runId, (reads.get(runId) ?? 0) + 1);
    }
    return (super.query as (...a: unknown[]) => unknown)(...args);
  }
}

const engines: Engine[] = [];
function engineCountingReads(): Engine {
  const engine = createEngine({ pool: new pg.Pool({ connectionString: db.url, Client: CountingClient, max: 4 }), log: () => {} });
  engines.push(engine);
  return engine;
}

function slowWorkflow(engine: Engine, queue: string) {
  return engine.workflow({ name: `slow-${queue}`, queue }, async (ctx, input: { ms: number }) => {
    await ctx.step('work', () => new Promise((resolve) => setTimeout(() => resolve(input.ms), input.ms)));
    return { slept: input.ms };
  });
}

describe('handle.result() without polling', () => {
  it("a run the caller's own worker took at its start: answered by that execution's committed completion, with no read", async () => {
    const engine = engineCountingReads();
    try {
      const wf = slowWorkflow(engine, 'results-local');
      workers.push(await engine.runWorker({ queues: ['results-local'], concurrency: 2, pollIntervalMs: 100 }));
      const handle = await engine.start(wf, { ms: 600 });
      await expect(handle.result()).resolves.toEqual({ slept: 600 });
      // Polling from 10 ms growing by 1.5x would have read the row about ten times in 600 ms.
      expect(reads.get(handle.runId) ?? 0).toBe(0);
      // What the caller got is what committed.
      expect((await db.pool.query('select status, output from runledger.runs where run_id = $1', [handle.runId])).rows[0]).toEqual({
        status: 'SUCCEEDED',
        output: { slept: 600 },
      });
      // The handle answers again, and a handle re-attached by id reads the row.
      await expect(handle.result()).resolves.toEqual({ slept: 600 });
      await expect(engine.handle(wf, handle.runId).result()).resolves.toEqual({ slept: 600 });
      expect(reads.get(handle.runId)).toBe(1);
    } finally {
      await engine.close();
    }
  });

  it('a run its own worker took at its start but did not complete there is read: a failure, a durable wait, a timeout', async () => {
    const engine = engineCountingReads();
    try {
      const wf = engine.workflow({ name: 'results-local-other', queue: 'results-local-other' }, async (ctx, input: { how: string }) => {
        if (input.how === 'fail') await ctx.step('boom', () => Promise.reject(new Error('it broke')));
        if (input.how === 'sleep') await ctx.sleep('nap', 50);
        if (input.how === 'slow') await ctx.step('slow', () => new Promise((resolve) => setTimeout(() => resolve(1), 1_500)));
        return input.how;
      });
      workers.push(await engine.runWorker({ queues: ['results-local-other'], concurrency: 4, pollIntervalMs: 100 }));
      const failing = await engine.start(wf, { how: 'fail' });
      await expect(failing.result({ timeoutMs: 10_000 })).rejects.toMatchObject({ code: 'RUN_FAILED', details: { status: 'FAILED' } });
      expect(reads.get(failing.runId)).toBeGreaterThanOrEqual(1);
      // The wait ends the first execution (no output); a later claim completes the run.
      const sleeping = await engine.start(wf, { how: 'sleep' });
      await expect(sleeping.result({ timeoutMs: 10_000 })).resolves.toBe('sleep');
      expect(reads.get(sleeping.runId)).toBeGreaterThanOrEqual(1);
      const slow = await engine.start(wf, { how: 'slow' });
      await expect(slow.result({ timeoutMs: 200 })).rejects.toMatchObject({ code: 'RUN_FAILED', details: { status: 'RUNNING' } });
      await expect(slow.result({ timeoutMs: 10_000 })).resolves.toBe('slow');
    } finally {
      await engine.close();
    }
  });

  it('a run finished by a worker in another engine: woken by NOTIFY runledger_finished', async () => {
    const caller = engineCountingReads();
    const elsewhere = createEngine({ connectionString: db.url, log: () => {} });
    try {
      const wf = slowWorkflow(caller, 'results-remote');
      slowWorkflow(elsewhere, 'results-remote');
      workers.push(await elsewhere.runWorker({ queues: ['results-remote'], concurrency: 2, pollIntervalMs: 100 }));
      const handle = await caller.start(wf, { ms: 600 });
      await expect(handle.result()).resolves.toEqual({ slept: 600 });
      expect(reads.get(handle.runId)).toBeLessThanOrEqual(2);
    } finally {
      await elsewhere.close();
      await caller.close();
    }
  });

  it('engine.handle re-attaches to a run started elsewhere (here from SQL) and awaits it; an unknown run is refused', async () => {
    const engine = engineCountingReads();
    try {
      const wf = slowWorkflow(engine, 'results-handle');
      workers.push(await engine.runWorker({ queues: ['results-handle'], concurrency: 2, pollIntervalMs: 100 }));
      await engine.start(wf, { ms: 1 }); // registers the workflow so SQL can start it
      const runId = (await db.pool.query(`select runledger.start_run('slow-results-handle', '{"ms": 300}') as id`)).rows[0].id;
      const typed = engine.handle(wf, runId);
      expect(typed.runId).toBe(runId);
      const output: { slept: number } = await typed.result();
      expect(output).toEqual({ slept: 300 });
      await expect(engine.handle(runId).result()).resolves.toEqual({ slept: 300 }); // already finished: read once
      await expect(engine.handle('no-such-run').result()).rejects.toMatchObject({
        code: 'RUN_FAILED',
        message: 'run no-such-run not found',
      });
      expect(() => engine.handle('')).toThrow(/a run id is required/);
      expect(reads.get(runId)).toBeLessThanOrEqual(3);
    } finally {
      await engine.close();
    }
  });

  it('while its LISTEN connection is down a caller reads on a backoff, and still gets the result', async () => {
    const caller = engineCountingReads();
    const elsewhere = createEngine({ connectionString: db.url, log: () => {} });
    try {
      const wf = slowWorkflow(caller, 'results-lost');
      slowWorkflow(elsewhere, 'results-lost');
      const handle = await caller.start(wf, { ms: 50 });
      const result = handle.result({ timeoutMs: 30_000 });
      // The caller's LISTEN session is the one whose last statement was the LISTEN.
      const listenerPid = async () =>
        (await db.pool.query(`select pid from pg_stat_activity where query = 'listen runledger_finished' and datname = current_database()`))
          .rows[0]?.pid;
      await waitFor('the caller listens', async () => (await listenerPid()) !== undefined);
      await db.pool.query('select pg_terminate_backend($1)', [await listenerPid()]);
      workers.push(await elsewhere.runWorker({ queues: ['results-lost'], concurrency: 2, pollIntervalMs: 100 }));
      await expect(result).resolves.toEqual({ slept: 50 });
    } finally {
      await elsewhere.close();
      await caller.close();
    }
  });
});

describe('runledger_finished', () => {
  it('every way a run ends announces its id: completion, failure, a cancel of a waiting run', async () => {
    const engine = createEngine({ connectionString: db.url, log: () => {} });
    try {
      const ok = engine.workflow({ name: 'announced-ok', queue: 'announce' }, async (ctx) => ctx.step('a', () => 1));
      const bad = engine.workflow({ name: 'announced-bad', queue: 'announce' }, async () => {
        throw new Error('no');
      });
      const parked = engine.workflow({ name: 'announced-parked', queue: 'announce' }, async (ctx) => ctx.waitForSignal('never'));
      workers.push(await engine.runWorker({ queues: ['announce'], concurrency: 2, pollIntervalMs: 100 }));
      const { result: ids, payloads } = await notified(async () => {
        const a = await engine.start(ok, undefined);
        const b = await engine.start(bad, undefined);
        const c = await engine.start(parked, undefined);
        await a.result();
        await b.result().catch(() => undefined);
        await waitFor('waiting', async () => (await engine.getRun(c.runId))?.status === 'WAITING');
        await engine.cancel(c.runId);
        return [a.runId, b.runId, c.runId];
      }, 'runledger_finished');
      const announced = payloads.flatMap((p) => p.split(','));
      for (const id of ids) expect(announced).toContain(id);
    } finally {
      await engine.close();
    }
  });

  it('_announce_finished splits many ids into notifications under the 8,000-byte payload limit, none lost', async () => {
    const ids = Array.from({ length: 700 }, (_, i) => `run-${String(i).padStart(22, '0')}`);
    const { payloads } = await notified(() => db.pool.query('select runledger._announce_finished($1)', [ids]), 'runledger_finished');
    expect(payloads.length).toBe(3); // 700 × 27 bytes, at most 7,900 per notification
    for (const payload of payloads) expect(Buffer.byteLength(payload)).toBeLessThan(8_000);
    expect(payloads.flatMap((p) => p.split(','))).toEqual(ids);
  });
});

// Engines a failed test left open would keep the database busy when it is dropped.
afterAll(async () => {
  await Promise.all(engines.map((e) => e.close().catch(() => undefined)));
});

describe('engine.startMany', () => {
  it('starts the runs in one statement and returns their handles in input order; each result arrives', async () => {
    const engine = createEngine({ connectionString: db.url, log: () => {} });
    engines.push(engine);
    const double = engine.workflow({ name: 'double', queue: 'many' }, async (ctx, input: { n: number }) =>
      ctx.step('x2', () => input.n * 2),
    );
    workers.push(await engine.runWorker({ queues: ['many'], concurrency: 4, pollIntervalMs: 100 }));
    const { result: handles, payloads } = await notified(() =>
      engine.startMany(
        double,
        Array.from({ length: 30 }, (_, n) => ({ n })),
      ),
    );
    expect(payloads.filter((p) => p === 'many')).toHaveLength(1); // one announcement for the 30
    const outputs: number[] = await Promise.all(handles.map((h) => h.result()));
    expect(outputs).toEqual(Array.from({ length: 30 }, (_, n) => n * 2));
    expect(await engine.startMany(double, [])).toEqual([]);
  });

  it('checks every input first (the error names its index) and starts none unless all pass; idempotency keys give the same runs', async () => {
    const { z } = await import('zod');
    const engine = createEngine({ connectionString: db.url, log: () => {} });
    engines.push(engine);
    const typed = engine.workflow(
      { name: 'typed-many', queue: 'many-typed', input: z.object({ n: z.number() }) },
      async (_ctx, input) => input.n,
    );
    const count = async () =>
      Number((await db.pool.query(`select count(*) from runledger.runs where workflow_name = 'typed-many'`)).rows[0].count);
    await expect(engine.startMany(typed, [{ n: 1 }, { n: 'two' as unknown as number }])).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringContaining('input 1 for workflow typed-many is invalid'),
    });
    await expect(engine.startMany(typed, [{ n: 1 }], { idempotencyKeys: ['a', 'b'] })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringContaining('idempotencyKeys must be an array of 1 entries'),
    });
    expect(await count()).toBe(0);
    const first = await engine.startMany(typed, [{ n: 1 }, { n: 2 }], { idempotencyKeys: ['order-1', undefined] });
    const again = await engine.startMany(typed, [{ n: 1 }, { n: 2 }], { idempotencyKeys: ['order-1', undefined] });
    expect(again[0]!.runId).toBe(first[0]!.runId);
    expect(again[1]!.runId).not.toBe(first[1]!.runId); // no key: a new run each time
    expect(await count()).toBe(3);
  });
});
