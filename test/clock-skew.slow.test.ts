/**
 * One clock: the database's. An engine and its worker run in this process while every
 * connection they open runs `runledger.clock_offset` 5 minutes ahead of (or behind) the
 * process's clock, as a database server whose clock is off would. The outcomes that the
 * worker's clock used to decide must not move:
 *
 * - a step that started before a cancel request keeps its result (its start used to be the
 *   worker's `new Date()`, compared with the database's cancel_requested_at: with the
 *   database behind, every step seemed to start after the cancel and failed with RL008);
 * - `runAt: '2s'` starts 2 s after the start by the database's clock (it used to be
 *   `Date.now() + 2 s`: with the database ahead the run started at once, behind 5 min late);
 * - a 1 s sleep wakes after about 1 s (the worker used to arm its timer for the database's
 *   due time read on its own clock: with the database ahead, 5 minutes late);
 * - a deadline of 2 s ends a sleeping run 2 s after its start, by the database's clock;
 * - leases stay held by a worker that heartbeats, judged on the database's clock.
 *
 * The worker's poll and sweep are slowed to a minute, so a run starts or wakes on time only
 * if the worker's own timers are right (a poll or a sweep would hide a late timer).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { createEngine, type Engine, type Worker, type Workflow } from '../src/index.js';
import { useTestEngine } from './helpers/test-engine.js';
import { waitFor } from './helpers/database.js';

const t = useTestEngine({ engine: false });
const { db } = t;

const SKEW_MS = 5 * 60_000;
const LEASE_MS = 1_000;

describe.each([
  ['ahead of', 'ahead', '00:05:00', SKEW_MS],
  ['behind', 'behind', '-00:05:00', -SKEW_MS],
] as const)('the database clock 5 minutes %s the worker', (_label, name, offset, skewMs) => {
  const queue = `skew-${name}`;
  let pool: pg.Pool;
  let engine: Engine;
  let worker: Worker;
  let inFlight = false;
  let inStep: Workflow<unknown, string, unknown>;
  let delayed: Workflow<unknown, string, unknown>;
  let sleeper: Workflow<unknown, string, unknown>;
  let long: Workflow<unknown, string, unknown>;
  let overdue: Workflow<unknown, string, unknown>;

  beforeAll(async () => {
    // Every connection of the engine (its pool, the worker's LISTEN and cron connections) moves its clock.
    pool = new pg.Pool({ connectionString: db.url, max: 10, options: `-c runledger.clock_offset=${offset}` });
    pool.on('error', () => {});
    engine = createEngine({ pool, log: () => {} });
    inStep = engine.workflow({ name: `skew-cancel-${name}`, queue }, async (ctx) => {
      await ctx.step('in-flight', async ({ signal }) => {
        inFlight = true;
        // Under way until the worker hears of the cancel; then it finishes and records its result.
        await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
        return 'kept';
      });
      await ctx.step('never', () => 'unreachable');
      return 'unreachable';
    });
    delayed = engine.workflow({ name: `skew-delayed-${name}`, queue }, async () => 'started');
    sleeper = engine.workflow({ name: `skew-sleep-${name}`, queue }, async (ctx) => {
      await ctx.sleep('nap', 1_000);
      return 'awake';
    });
    long = engine.workflow({ name: `skew-lease-${name}`, queue }, async (ctx) => {
      await ctx.step('three-leases', () => new Promise<string>((resolve) => setTimeout(() => resolve('done'), 3 * LEASE_MS)));
      return 'done';
    });
    overdue = engine.workflow({ name: `skew-deadline-${name}`, queue }, async (ctx) => {
      await ctx.sleep('past-the-deadline', 60_000);
      return 'too late';
    });
    worker = await engine.runWorker({ queues: [queue], leaseMs: LEASE_MS, pollIntervalMs: 60_000, sweepIntervalMs: 60_000 });
  });

  afterAll(async () => {
    await worker?.stop();
    await engine?.close();
    await pool?.end();
  });

  /** Milliseconds between two of a run's times, both stamped by the database. */
  const between = async (sql: string, runId: string): Promise<number> =>
    Number(
      (await pool.query(`select (extract(epoch from (${sql})) * 1000)::float8 as ms from runledger.runs r where r.run_id = $1`, [runId]))
        .rows[0].ms,
    );

  it(`is ${Math.abs(skewMs) / 60_000} minutes off this process's clock`, async () => {
    const row = (await pool.query(`select (extract(epoch from runledger.now()) * 1000)::float8 as ms`)).rows[0];
    expect(Math.abs(row.ms - Date.now() - skewMs)).toBeLessThan(5_000);
  });

  it('a step that started before the cancel request records its result (no RL008), and the run ends CANCELLED', async () => {
    inFlight = false;
    const handle = await engine.start(inStep, undefined);
    await waitFor('step in flight', async () => inFlight);
    await new Promise((resolve) => setTimeout(resolve, 50)); // the step is under way well before the cancel
    expect(await engine.cancel(handle.runId)).toBe('CANCELLING');
    await expect(handle.result({ timeoutMs: 15_000 })).rejects.toMatchObject({
      details: { status: 'CANCELLED', terminationReason: 'CANCELLED' },
    });
    const steps = await pool.query(
      `select s.name, s.status, s.output, s.started_at < r.cancel_requested_at as before_cancel
         from runledger.steps s join runledger.runs r using (run_id) where s.run_id = $1 order by s.seq`,
      [handle.runId],
    );
    expect(steps.rows).toEqual([{ name: 'in-flight', status: 'SUCCEEDED', output: 'kept', before_cancel: true }]);
  });

  it("runAt: '2s' starts 2 s after the start by the database's clock, not 5 minutes early or late", async () => {
    const startedAt = performance.now();
    const handle = await engine.start(delayed, undefined, { runAt: '2s' });
    await expect(handle.result({ timeoutMs: 15_000 })).resolves.toBe('started');
    const waited = performance.now() - startedAt;
    // not_before is stamped in SQL: now() + 2 s (the announcement's now, a few ms after created_at).
    const notBefore = await between('r.not_before - r.created_at', handle.runId);
    expect(notBefore).toBeGreaterThanOrEqual(2_000);
    expect(notBefore).toBeLessThan(2_100);
    const startedAfter = await between('r.started_at - r.created_at', handle.runId);
    expect(startedAfter).toBeGreaterThanOrEqual(2_000);
    expect(startedAfter).toBeLessThan(3_000);
    expect(waited).toBeGreaterThanOrEqual(1_900);
    expect(waited).toBeLessThan(4_000);
  });

  it("a deadline of 2 s ends a sleeping run 2 s after its start by the database's clock", async () => {
    const startedAt = performance.now();
    const handle = await engine.start(overdue, undefined, { deadline: '2s' });
    await expect(handle.result({ timeoutMs: 15_000 })).rejects.toMatchObject({
      details: { status: 'TERMINATED', terminationReason: 'DEADLINE' },
    });
    const waited = performance.now() - startedAt;
    const ended = await between('r.finished_at - r.created_at', handle.runId);
    expect(ended).toBeGreaterThanOrEqual(2_000);
    expect(ended).toBeLessThan(3_500);
    expect(waited).toBeLessThan(5_000);
  });

  it('a sleep of 1 s wakes after about 1 s', async () => {
    const startedAt = performance.now();
    const handle = await engine.start(sleeper, undefined);
    await expect(handle.result({ timeoutMs: 15_000 })).resolves.toBe('awake');
    const waited = performance.now() - startedAt;
    // By the database's clock: from parking (the sleep's checkpoint) to the claim that woke it.
    const woke = await pool.query(
      `select (extract(epoch from (select max(e.at) from runledger.events e where e.run_id = s.run_id and e.kind = 'claimed') - s.started_at) * 1000)::float8 as ms
         from runledger.steps s where s.run_id = $1 and s.name = 'nap'`,
      [handle.runId],
    );
    expect(woke.rows[0].ms).toBeGreaterThanOrEqual(1_000);
    expect(woke.rows[0].ms).toBeLessThan(2_000);
    expect(waited).toBeGreaterThanOrEqual(1_000);
    expect(waited).toBeLessThan(3_000);
  });

  it('a step running three leases long keeps its lease while the database recovers expired leases', async () => {
    const handle = await engine.start(long, undefined);
    const result = handle.result({ timeoutMs: 15_000 });
    let settled = false;
    void result.then(
      () => (settled = true),
      () => (settled = true),
    );
    await waitFor(
      'run claimed',
      async () => (await pool.query(`select status from runledger.runs where run_id = $1`, [handle.runId])).rows[0]?.status === 'RUNNING',
    );
    // A sweep on the database's clock every 100 ms: an expired lease would be taken back.
    let recovered = 0;
    while (!settled) {
      recovered += (await pool.query('select runledger._recover_expired() as n')).rows[0].n;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    await expect(result).resolves.toBe('done');
    expect(recovered).toBe(0);
    const run = (
      await pool.query(`select recovery_attempts, fencing_token::int as token from runledger.runs where run_id = $1`, [handle.runId])
    ).rows[0];
    expect(run).toEqual({ recovery_attempts: 0, token: 1 });
    const kinds = (await pool.query(`select kind from runledger.events where run_id = $1 order by event_id`, [handle.runId])).rows.map(
      (r) => r.kind,
    );
    expect(kinds).not.toContain('lease_expired');
  });
});
