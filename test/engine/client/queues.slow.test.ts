import { describe, expect, it } from 'vitest';
import type { Engine, Worker } from '../../../src/index.js';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { spawnWorker } from '../../helpers/worker-process.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';

const t = useTestEngine({ fixtures: true });
const { db } = t;

const { processes: spawned, workers } = stoppedAfterEach();

async function inProcessWorker(queues: string[], concurrency = 8, e: Engine = t.engine): Promise<Worker> {
  const w = await e.runWorker({ queues, concurrency, leaseMs: 2_000, pollIntervalMs: 100 });
  workers.push(w);
  return w;
}

const allDone = async (runIds: string[]) => {
  const r = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'SUCCEEDED'`, [runIds]);
  return r.rows[0].n === runIds.length;
};

describe('concurrency across processes', () => {
  it('3 worker processes, a queue with concurrency 5: never more than 5 RUNNING, and all runs finish', async () => {
    await t.engine.setQueue('limited', { concurrency: 5 });
    const runIds: string[] = [];
    for (let i = 0; i < 60; i++) runIds.push((await t.engine.start(t.fixtures.slow, { ms: 60 }, { queue: 'limited' })).runId);
    await Promise.all(
      [1, 2, 3].map(async () =>
        spawned.push(await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '2000', CONCURRENCY: '8', QUEUES: 'limited' })),
      ),
    );

    let peak = 0;
    const samples: number[] = [];
    while (!(await allDone(runIds))) {
      const r = await db.pool.query(
        `select count(*)::int as n from runledger.runs where queue_name = 'limited' and status in ('RUNNING', 'CANCELLING')`,
      );
      samples.push(r.rows[0].n);
      peak = Math.max(peak, r.rows[0].n);
    }
    expect(samples.length).toBeGreaterThan(10);
    expect(peak).toBeLessThanOrEqual(5);
    expect(peak).toBe(5); // work-conserving: the slots were used
    const owners = await db.pool.query(
      `select count(distinct detail->>'worker')::int as n from runledger.events where run_id = any($1) and kind = 'claimed'`,
      [runIds],
    );
    expect(owners.rows[0].n).toBe(3);
  });
});

describe('fairness', () => {
  it('tenant B (20 runs) finishes long before tenant A (2,000 runs, enqueued first) drains', async () => {
    await t.engine.setQueue('fair', { concurrency: 4 });
    await db.pool.query(`select runledger._register_workflow('noop', '1', 'default', 10)`);
    await db.pool.query(
      `select runledger.start_run('noop', jsonb_build_object('n', g), '{"queue": "fair", "concurrency_key": "tenant-a"}') from generate_series(1, 2000) g`,
    );
    await db.pool.query(
      `select runledger.start_run('noop', jsonb_build_object('n', g), '{"queue": "fair", "concurrency_key": "tenant-b"}') from generate_series(1, 20) g`,
    );
    await inProcessWorker(['fair'], 4);
    await waitFor(
      'all done',
      async () => {
        const r = await db.pool.query(`select count(*)::int as n from runledger.runs where queue_name = 'fair' and status <> 'SUCCEEDED'`);
        return r.rows[0].n === 0;
      },
      120_000,
    );
    const order = await db.pool.query(
      // rank(): runs completed in one group commit share their finished_at, and none of them
      // finished before another; a tie-break (by run_id, say) would put B behind A in every batch.
      `select concurrency_key, rank() over (order by finished_at) as position from runledger.runs where queue_name = 'fair'`,
    );
    const lastB = Math.max(...order.rows.filter((r) => r.concurrency_key === 'tenant-b').map((r) => Number(r.position)));
    // B's 20 runs alternate with A's: all done within the first ~50 completions of 2,020.
    expect(lastB).toBeLessThanOrEqual(60);
  });

  it('per-key concurrency: a tenant never has more than its share RUNNING', async () => {
    await t.engine.setQueue('per-tenant', { concurrency: 6, perKeyConcurrency: 2 });
    const ids: string[] = [];
    for (const tenant of ['x', 'y']) {
      for (let i = 0; i < 10; i++)
        ids.push((await t.engine.start(t.fixtures.slow, { ms: 40 }, { queue: 'per-tenant', concurrencyKey: tenant })).runId);
    }
    await inProcessWorker(['per-tenant'], 8);
    let peakPerKey = 0;
    while (!(await allDone(ids))) {
      const r = await db.pool.query(
        `select coalesce(max(n), 0)::int as peak from (select count(*) as n from runledger.runs where queue_name = 'per-tenant' and status = 'RUNNING' group by concurrency_key) t`,
      );
      peakPerKey = Math.max(peakPerKey, r.rows[0].peak);
    }
    expect(peakPerKey).toBe(2);
  });
});

describe('rate limit', () => {
  it('admissions per period never exceed the limit', async () => {
    await t.engine.setQueue('rated', { rateLimit: { max: 4, periodMs: 1_000 } });
    const ids: string[] = [];
    for (let i = 0; i < 12; i++) ids.push((await t.engine.start(t.fixtures.noop, { n: i }, { queue: 'rated' })).runId);
    const rated = await t.engine.runWorker({
      queues: ['rated'],
      concurrency: 8,
      leaseMs: 1_000,
      pollIntervalMs: 100,
      sweepIntervalMs: 100,
    });
    workers.push(rated);
    await waitFor('all done', () => allDone(ids), 30_000);
    const times = (
      await db.pool.query(`select admitted_at from runledger.runs where run_id = any($1) order by admitted_at`, [ids])
    ).rows.map((r) => (r.admitted_at as Date).getTime());
    expect(times).toHaveLength(12);
    for (let i = 0; i < times.length; i++) {
      const inWindow = times.filter((t) => t >= times[i]! && t < times[i]! + 1_000).length;
      expect(inWindow).toBeLessThanOrEqual(4);
    }
    expect(times.at(-1)! - times[0]!).toBeGreaterThanOrEqual(2_000); // 12 starts at 4 per second need 3 windows
  });
});

describe('priority, pause and resume', () => {
  it('a paused queue admits nothing; resumed, it runs lower priority numbers first', async () => {
    await t.engine.setQueue('prio', { concurrency: 1, paused: true });
    const order: number[] = [];
    const wf = t.engine.workflow({ name: 'prioritised', queue: 'prio' }, async (ctx, input: { p: number }) =>
      ctx.step('mark', () => {
        order.push(input.p);
        return input.p;
      }),
    );
    const handles = [];
    for (const p of [5, 1, 3, 2, 4]) handles.push(await t.engine.start(wf, { p }, { priority: p }));
    await inProcessWorker(['prio'], 1);
    const stats = await db.pool.query(
      `select waiting_admission, running, paused from runledger.queue_stats where queue_name = 'prio' and queue_total`,
    );
    expect(stats.rows).toEqual([{ waiting_admission: '5', running: '0', paused: true }]);
    const statuses = await db.pool.query(`select distinct status from runledger.runs where queue_name = 'prio'`);
    expect(statuses.rows).toEqual([{ status: 'PENDING' }]);

    await db.pool.query(`select runledger.set_queue('prio', '{"paused": false}')`);
    await Promise.all(handles.map((h) => h.result()));
    expect(order).toEqual([1, 2, 3, 4, 5]);
  });

  it('set_queue refuses bad options with RL003 and keeps what it was not told to change', async () => {
    await expect(db.pool.query(`select runledger.set_queue('q-bad', '{"concurrency": 0}')`)).rejects.toMatchObject({ code: 'RL003' });
    await expect(db.pool.query(`select runledger.set_queue('q-bad', '{"bogus": 1}')`)).rejects.toMatchObject({ code: 'RL003' });
    await expect(db.pool.query(`select runledger.set_queue('q-bad', '{"rate_limit_max": 5}')`)).rejects.toMatchObject({ code: 'RL003' });
    await expect(t.engine.setQueue('bad name!', { concurrency: 1 })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await t.engine.setQueue('q-keep', { concurrency: 3, perKeyConcurrency: 1 });
    await expect(t.engine.setQueue('q-keep', { paused: true })).resolves.toMatchObject({
      concurrency: 3,
      perKeyConcurrency: 1,
      paused: true,
    });
    await expect(t.engine.setQueue('q-keep', { concurrency: null })).resolves.toMatchObject({ concurrency: null, perKeyConcurrency: 1 });
  });
});

describe('idempotent and delayed start', () => {
  it('concurrent starts with the same idempotency key make one run, whose body runs once', async () => {
    let bodies = 0;
    const wf = t.engine.workflow({ name: 'once-only', queue: 'idem' }, async (ctx) => ctx.step('body', () => ++bodies));
    await inProcessWorker(['idem']);
    const handles = await Promise.all(Array.from({ length: 8 }, () => t.engine.start(wf, undefined, { idempotencyKey: 'order-42' })));
    expect(new Set(handles.map((h) => h.runId)).size).toBe(1);
    await expect(handles[0]!.result()).resolves.toBe(1);
    expect(bodies).toBe(1);
    const rows = await db.pool.query(`select count(*)::int as n from runledger.runs where idempotency_key = 'order-42'`);
    expect(rows.rows[0].n).toBe(1);
  });

  it('a delayed start does not run before its time', async () => {
    const wf = t.engine.workflow({ name: 'later', queue: 'later' }, async (ctx) => ctx.step('t', () => Date.now()));
    await inProcessWorker(['later']);
    const before = Date.now();
    const handle = await t.engine.start(wf, undefined, { runAt: 700 });
    const ranAt = await handle.result();
    expect(ranAt - before).toBeGreaterThanOrEqual(600);
  });
});

describe('cron schedules', () => {
  it('missed ticks inside the catch-up window fire once each, with two workers', async () => {
    const ticks = t.engine.workflow({ name: 'ticker', queue: 'cron' }, async (ctx) => ctx.step('tick', () => ctx.runId));
    // Pretend the schedule last fired 3 minutes ago (graphile-worker's record of it), then two
    // workers start at once with a 10-minute catch-up window.
    const lastFired = new Date(Date.now() - 3 * 60_000);
    lastFired.setUTCSeconds(0, 0);
    await db.pool.query(
      `insert into graphile_worker._private_known_crontabs (identifier, known_since, last_execution) values ('every-minute', $1, $1)`,
      [new Date(lastFired.getTime() - 60 * 60_000)],
    );
    await db.pool.query(`update graphile_worker._private_known_crontabs set last_execution = $1 where identifier = 'every-minute'`, [
      lastFired,
    ]);
    const other = t.newEngine();
    for (const e of [t.engine, other]) {
      const wf = e === t.engine ? ticks : e.workflow({ name: 'ticker', queue: 'cron' }, async (ctx) => ctx.step('tick', () => ctx.runId));
      e.schedule({ name: 'every-minute', workflow: wf, cron: '* * * * *', catchUp: '10m' });
    }
    await Promise.all([inProcessWorker(['cron'], 2, t.engine), inProcessWorker(['cron'], 2, other)]);

    const minutesMissed = Math.floor((Date.now() - lastFired.getTime()) / 60_000);
    const runs = await waitFor('missed ticks started', async () => {
      const r = await db.pool.query(
        `select idempotency_key, status from runledger.runs where workflow_name = 'ticker' order by idempotency_key`,
      );
      return r.rows.length >= minutesMissed && r.rows.every((row) => row.status === 'SUCCEEDED') ? r.rows : undefined;
    });
    const keys = runs.map((r) => r.idempotency_key as string);
    expect(new Set(keys).size).toBe(keys.length); // once per tick
    expect(keys.length).toBeGreaterThanOrEqual(minutesMissed);
    expect(keys.length).toBeLessThanOrEqual(minutesMissed + 1); // the tick of the current minute may fire too
    for (const key of keys) expect(key).toMatch(/^cron:every-minute:\d{4}-\d\d-\d\dT\d\d:\d\d:00\.000Z$/);
  });

  it('refuses an invalid cron expression', () => {
    const wf = t.engine.workflow({ name: 'bad-cron-target', queue: 'cron-bad' }, async () => 1);
    expect(() => t.engine.schedule({ name: 'bad', workflow: wf, cron: 'every tuesday' })).toThrow(/cron/);
  });
});
