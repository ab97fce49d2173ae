/**
 * A run started by an engine whose own worker has a free slot is handed to that worker in
 * process, without NOTIFY (every notifying commit queues on one lock per database); a run
 * the local worker cannot take at once is announced as before, so workers elsewhere take it.
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

/** No poll in the time a test takes: a run is claimed on a notification or the local hand-off only. */
const NO_POLL_MS = 600_000;

const engines: Engine[] = [];
afterAll(async () => {
  for (const engine of engines) await engine.close();
});

/** Steps wait on a gate a test opens, so a run can hold its worker's slot. */
let openGate: () => void = () => {};
let gate = Promise.resolve();
function closeGate(): void {
  gate = new Promise((resolve) => (openGate = resolve));
}

function engineWith(queue: string) {
  const engine = createEngine({ connectionString: db.url, log: () => {} });
  engines.push(engine);
  const wf = engine.workflow({ name: `local-${queue}`, queue }, async (ctx, input: { gated: boolean }) => {
    await ctx.step('work', async () => {
      if (input.gated) await gate;
      return 1;
    });
    return 'done';
  });
  return { engine, wf };
}

/** A session whose answers to runledger._start_claimed reach the engine 600 ms after the database sent them. */
class SlowStartClient extends pg.Client {
  override query(...args: any[]): any {
    const callback = args[args.length - 1];
    if (args[0]?.name === 'runledger_start_claimed' && typeof callback === 'function') {
      args[args.length - 1] = (error: unknown, result: unknown) => setTimeout(() => callback(error, result), 600);
    }
    return (super.query as (...a: unknown[]) => unknown)(...args);
  }
}

const ownerOf = async (runId: string) =>
  (
    await db.pool.query<{ worker: string }>(
      `select detail->>'worker' as worker from runledger.events where run_id = $1 and kind = 'claimed' order by event_id limit 1`,
      [runId],
    )
  ).rows[0]?.worker;

describe('engine.start with a worker of its own', () => {
  it('hands the run to its worker without NOTIFY, and the worker claims it without a poll', async () => {
    const { engine, wf } = engineWith('local-free');
    const worker = await engine.runWorker({ concurrency: 2, pollIntervalMs: NO_POLL_MS });
    workers.push(worker);
    const { result: handle, payloads } = await notified(() => engine.start(wf, { gated: false }));
    expect(payloads).toEqual([]);
    await expect(handle.result({ timeoutMs: 10_000 })).resolves.toBe('done');
    expect(await ownerOf(handle.runId)).toBe(worker.workerId);
    // Claimed in the start's own transaction: both events were written by it (same xmin).
    const events = await db.pool.query<{ kind: string; xid: string }>(
      `select kind, xmin::text as xid from runledger.events where run_id = $1 and kind in ('created', 'claimed') order by event_id`,
      [handle.runId],
    );
    expect(events.rows.map((e) => e.kind)).toEqual(['created', 'claimed']);
    expect(events.rows[1]!.xid).toBe(events.rows[0]!.xid);
  });

  it('a start that finds its run already there claims nothing, and the run runs once', async () => {
    const { engine, wf } = engineWith('local-again');
    workers.push(await engine.runWorker({ concurrency: 2, pollIntervalMs: NO_POLL_MS }));
    const first = await engine.start(wf, { gated: false }, { runId: 'local-again-1' });
    const again = await engine.start(wf, { gated: false }, { runId: 'local-again-1' });
    expect(again.runId).toBe(first.runId);
    await expect(again.result({ timeoutMs: 10_000 })).resolves.toBe('done');
    const claims = await db.pool.query(`select count(*)::int as n from runledger.events where run_id = $1 and kind = 'claimed'`, [
      first.runId,
    ]);
    expect(claims.rows[0].n).toBe(1);
    const steps = await db.pool.query(`select attempts from runledger.steps where run_id = $1`, [first.runId]);
    expect(steps.rows).toEqual([{ attempts: 1 }]);
  });

  it('promises each free slot once: of three starts at once on two free slots, the third is announced', async () => {
    const { engine, wf } = engineWith('local-promised');
    workers.push(await engine.runWorker({ concurrency: 2, pollIntervalMs: NO_POLL_MS }));
    const { result: handles, payloads } = await notified(() =>
      Promise.all([engine.start(wf, { gated: false }), engine.start(wf, { gated: false }), engine.start(wf, { gated: false })]),
    );
    expect(payloads).toEqual(['local-promised']);
    for (const handle of handles) await expect(handle.result({ timeoutMs: 10_000 })).resolves.toBe('done');
  });

  it('announces a run its full worker cannot take, and a worker of another engine takes it', async () => {
    closeGate();
    const a = engineWith('local-full');
    const b = engineWith('local-full');
    const busy = await a.engine.runWorker({ concurrency: 1, pollIntervalMs: NO_POLL_MS });
    workers.push(busy);
    const blocking = await a.engine.start(a.wf, { gated: true });
    await waitFor('the gated run to hold the only slot', async () => busy.inFlight === 1 || undefined, 10_000);
    const other = await b.engine.runWorker({ concurrency: 1, pollIntervalMs: NO_POLL_MS });
    workers.push(other);
    try {
      const { result: second, payloads } = await notified(() => a.engine.start(a.wf, { gated: false }));
      expect(payloads).toEqual(['local-full']);
      // Taken by the other engine's worker while the first one's slot is still held.
      await expect(second.result({ timeoutMs: 10_000 })).resolves.toBe('done');
      expect(await ownerOf(second.runId)).toBe(other.workerId);
      expect(busy.inFlight).toBe(1);
    } finally {
      openGate();
    }
    await expect(blocking.result({ timeoutMs: 10_000 })).resolves.toBe('done');
  });

  it("a heartbeat that sees a run started here before the start's answer is handled does not take it back: it runs once", async () => {
    // The start's answer reaches the engine 600 ms after its commit, while heartbeats (every
    // 166 ms with a 500 ms lease) already renew the run: a run leased to the worker and not
    // executed by it, as after a claim whose answer was lost, which the next claim takes back.
    const engine = createEngine({
      pool: new pg.Pool({ connectionString: db.url, Client: SlowStartClient, max: 6 }),
      log: () => {},
    });
    engines.push(engine);
    let bodies = 0;
    const wf = engine.workflow({ name: 'local-slow-answer', queue: 'local-slow-answer' }, async (ctx) => {
      await ctx.step('counted', () => ++bodies);
      return 'done';
    });
    const worker = await engine.runWorker({ concurrency: 2, pollIntervalMs: NO_POLL_MS, leaseMs: 500 });
    workers.push(worker);
    const handle = await engine.start(wf, undefined);
    await expect(handle.result({ timeoutMs: 10_000 })).resolves.toBe('done');
    const claims = await db.pool.query(`select count(*)::int as n from runledger.events where run_id = $1 and kind = 'claimed'`, [
      handle.runId,
    ]);
    expect({ claims: claims.rows[0].n, bodies }).toEqual({ claims: 1, bodies: 1 });
  });

  it('a run started for a worker that stops before the start is answered is given back, not run, and another worker runs it once', async () => {
    const engine = createEngine({ pool: new pg.Pool({ connectionString: db.url, Client: SlowStartClient, max: 6 }), log: () => {} });
    engines.push(engine);
    let bodies = 0;
    const define = (e: Engine) =>
      e.workflow({ name: 'local-stopping', queue: 'local-stopping' }, async (ctx) => {
        await ctx.step('counted', () => ++bodies);
        return 'done';
      });
    const wf = define(engine);
    const stopping = await engine.runWorker({ concurrency: 2, pollIntervalMs: NO_POLL_MS });
    const started = engine.start(wf, undefined);
    await waitFor('the start to commit', async () => {
      const r = await db.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'local-stopping'`);
      return r.rows[0].n === 1 || undefined;
    });
    await stopping.stop(); // before the start's answer arrives
    const handle = await started;
    await waitFor('the run given back', async () => {
      const r = await db.pool.query(`select status from runledger.runs where run_id = $1`, [handle.runId]);
      return r.rows[0].status === 'PENDING' || undefined;
    });
    expect(bodies).toBe(0);
    const other = createEngine({ connectionString: db.url, log: () => {} });
    engines.push(other);
    define(other);
    workers.push(await other.runWorker({ concurrency: 2, pollIntervalMs: 100 }));
    await expect(other.handle(handle.runId).result({ timeoutMs: 10_000 })).resolves.toBe('done');
    expect(bodies).toBe(1);
  });

  it('a delayed start is announced with its delay, even with a free slot', async () => {
    const { engine, wf } = engineWith('local-delayed');
    workers.push(await engine.runWorker({ concurrency: 2, pollIntervalMs: NO_POLL_MS }));
    const { result: handle, payloads } = await notified(() => engine.start(wf, { gated: false }, { runAt: 50 }));
    expect(payloads).toHaveLength(1);
    expect(payloads[0]).toMatch(/^local-delayed\+\d+$/);
    await expect(handle.result({ timeoutMs: 10_000 })).resolves.toBe('done');
  });
});
