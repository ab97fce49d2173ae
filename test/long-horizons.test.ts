/**
 * Waits, deadlines and delayed starts months and a year ahead (docs/waits.md#how-far-ahead),
 * under the test clock: every duration and instant is int8 milliseconds or timestamptz end
 * to end. More than 2^31 ms (24.86 days) ahead used to overflow an int cast of the delay in
 * SQL: the wait's commit failed, the run was released as an infrastructure failure again
 * and again and dead-lettered with no cause, and a delayed start threw a raw 22003.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Engine, Worker } from '../src/index.js';
import { createTestClock, createTestEngine, type TestClock } from '../src/testing/index.js';
import { createTestDatabase, type TestDatabase } from './helpers/database.js';

const DAY = 86_400_000;
const START = '2030-01-01T00:00:00.000Z';

let db: TestDatabase;
const engines: Engine[] = [];

beforeAll(async () => {
  db = await createTestDatabase();
});

afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
  await db?.drop();
});

function setup(): { clock: TestClock; engine: Engine; worker: () => Promise<Worker> } {
  const clock = createTestClock(START);
  const engine = createTestEngine({ connectionString: db.url, clock });
  engines.push(engine);
  return { clock, engine, worker: () => engine.runWorker({ manual: true, leaseMs: 30_000 }) };
}

const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const at = (days: number) => new Date(Date.parse(START) + days * DAY);

describe('durable waits months ahead', () => {
  it('a 90-day ctx.sleep parks the run WAITING until the clock has moved 90 days, then it completes', async () => {
    const { clock, engine, worker } = setup();
    const wf = engine.workflow({ name: 'sleep-90d' }, async (ctx) => {
      await ctx.sleep('quarter', '90d');
      return ctx.step('after', () => 'woke');
    });
    const handle = await engine.start(wf, undefined);
    const w = await worker();
    await w.drain();
    const parked = await runRow(handle.runId);
    expect(parked).toMatchObject({ status: 'WAITING', wait_kind: 'timer', recovery_attempts: 0 });
    expect(parked.wake_at.toISOString()).toBe(at(90).toISOString());

    clock.advance('89d');
    expect(await w.drain()).toBe(0);
    expect((await runRow(handle.runId)).status).toBe('WAITING');

    clock.advance('1d');
    await w.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'woke', recoveryAttempts: 0 });
  });

  it('a 30-day signal timeout: the wait returns null after 30 days; a signal on day 29 ends another at once', async () => {
    const { clock, engine, worker } = setup();
    const wf = engine.workflow({ name: 'signal-30d' }, async (ctx) => ctx.waitForSignal<{ ok: boolean }>('answer', { timeout: '30d' }));
    const timedOut = await engine.start(wf, undefined);
    const answered = await engine.start(wf, undefined);
    const w = await worker();
    await w.drain();
    for (const handle of [timedOut, answered]) {
      expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', wait_kind: 'signal' });
      expect((await runRow(handle.runId)).wake_at.toISOString()).toBe(at(30).toISOString());
    }
    clock.advance('29d');
    await engine.signal(answered.runId, 'answer', { ok: true });
    await w.drain();
    expect(await engine.getRun(answered.runId)).toMatchObject({ status: 'SUCCEEDED', output: { ok: true } });
    expect((await runRow(timedOut.runId)).status).toBe('WAITING');

    clock.advance('1d');
    await w.drain();
    expect(await engine.getRun(timedOut.runId)).toMatchObject({ status: 'SUCCEEDED', output: null, recoveryAttempts: 0 });
  });

  it('a 30-day approval timeout: the request expires after 30 days and the wait returns null', async () => {
    const { clock, engine, worker } = setup();
    const wf = engine.workflow({ name: 'approval-30d' }, async (ctx) => {
      const decision = await ctx.requestApproval('sign-off', { action: 'ship', timeout: '30d' });
      return decision === null ? 'expired' : 'decided';
    });
    const handle = await engine.start(wf, undefined);
    const w = await worker();
    await w.drain();
    expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', wait_kind: 'approval' });
    const request = (await db.pool.query('select expires_at from runledger.approvals where run_id = $1', [handle.runId])).rows[0];
    expect(request.expires_at.toISOString()).toBe(at(30).toISOString());

    clock.advance('29d');
    expect(await w.drain()).toBe(0);
    clock.advance('1d');
    await w.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'expired', recoveryAttempts: 0 });
  });

  it('a run with a 1-year deadline waits (its timer is the deadline), and the deadline still ends it after a year', async () => {
    const { clock, engine, worker } = setup();
    const wf = engine.workflow({ name: 'deadline-1y' }, async (ctx) => {
      await ctx.sleep('short', '2d');
      return ctx.waitForSignal('never');
    });
    const handle = await engine.start(wf, undefined, { deadline: '365d' });
    const w = await worker();
    await w.drain();
    // The 2-day sleep: its own timer, within the deadline.
    expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', wait_kind: 'timer' });
    clock.advance('2d');
    await w.drain();
    // The signal wait without a timeout: woken by the deadline, 363 days on.
    const waiting = await runRow(handle.runId);
    expect(waiting).toMatchObject({ status: 'WAITING', wait_kind: 'signal', recovery_attempts: 0 });
    expect(waiting.deadline_at.toISOString()).toBe(at(365).toISOString());
    expect(waiting.wake_at.toISOString()).toBe(at(365).toISOString());

    clock.advance('362d');
    expect(await w.drain()).toBe(0);
    expect((await runRow(handle.runId)).status).toBe('WAITING');

    clock.advance('1d');
    await w.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'TERMINATED', terminationReason: 'DEADLINE', recoveryAttempts: 0 });
  });
});

describe('delayed starts a year ahead', () => {
  it("engine.start with runAt: '400d' (and a Date 400 days ahead) stays PENDING until the clock passes it, then runs", async () => {
    const { clock, engine, worker } = setup();
    const wf = engine.workflow({ name: 'later-400d' }, async () => 'ran');
    const byDuration = await engine.start(wf, undefined, { runAt: '400d' });
    const byDate = await engine.start(wf, undefined, { runAt: at(400) });
    const w = await worker();
    expect(await w.drain()).toBe(0);
    for (const handle of [byDuration, byDate]) {
      const row = await runRow(handle.runId);
      expect(row.status).toBe('PENDING');
      expect(row.not_before.toISOString()).toBe(at(400).toISOString());
    }
    clock.advance('399d');
    expect(await w.drain()).toBe(0);
    clock.advance('1d');
    expect(await w.drain()).toBe(2);
    for (const handle of [byDuration, byDate]) {
      expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'ran' });
    }
  });

  it('start_run and start_runs with run_at 400 days ahead (and run_in_ms) stay PENDING until the clock passes it, then run', async () => {
    const { clock, engine, worker } = setup();
    const wf = engine.workflow({ name: 'sql-later-400d' }, async () => 'ran');
    const w = await worker(); // registers the workflow
    const one = await engine.pool.query(
      `select runledger.start_run('sql-later-400d', '{}', jsonb_build_object('run_at', $1::text)) as id`,
      [at(400).toISOString()],
    );
    const inMs = await engine.pool.query(
      `select runledger.start_run('sql-later-400d', '{}', jsonb_build_object('run_in_ms', $1::bigint)) as id`,
      [400 * DAY],
    );
    const many = await engine.pool.query(
      `select runledger.start_runs('sql-later-400d', '[1, 2]', jsonb_build_object('run_at', $1::text)) as ids`,
      [at(400).toISOString()],
    );
    const ids = [one.rows[0].id, inMs.rows[0].id, ...many.rows[0].ids];
    expect(await w.drain()).toBe(0);
    for (const id of ids) {
      const row = await runRow(id);
      expect(row.status).toBe('PENDING');
      expect(row.not_before.toISOString()).toBe(at(400).toISOString());
    }
    clock.advance('399d');
    expect(await w.drain()).toBe(0);
    clock.advance('1d');
    expect(await w.drain()).toBe(4);
    for (const id of ids) expect(await engine.getRun(id)).toMatchObject({ status: 'SUCCEEDED', output: 'ran' });
    void wf;
  });
});

describe('out of range: a coded error at the call, never a raw SQLSTATE or a wait that ends at once', () => {
  it('a wait with a duration beyond 2^53 - 1 ms, NaN, Infinity, a negative one or an invalid Date fails the run with CONFIG naming it', async () => {
    const { engine, worker } = setup();
    const bad: Record<string, unknown> = {
      huge: 1e16,
      text: '99999999999999w',
      nan: NaN,
      infinite: Infinity,
      negative: -1,
      invalid: new Date('x'),
      ancient: new Date(-8.64e15),
    };
    const wf = engine.workflow({ name: 'bad-waits' }, async (ctx, input: { wait: string; value: string }) => {
      const value = bad[input.value] as never;
      if (input.wait === 'sleep') await ctx.sleep('nap', value);
      else if (input.wait === 'signal') await ctx.waitForSignal('go', { timeout: value });
      else await ctx.requestApproval('ok', { action: 'ship', timeout: value });
      return 'waited';
    });
    const handles = [];
    for (const wait of ['sleep', 'signal', 'approval']) {
      for (const value of Object.keys(bad)) handles.push({ wait, value, handle: await engine.start(wf, { wait, value }) });
    }
    await (await worker()).drain();
    for (const { wait, value, handle } of handles) {
      const run = await engine.getRun(handle.runId);
      const name = wait === 'sleep' ? 'sleep "nap"' : wait === 'signal' ? 'waitForSignal go' : 'requestApproval ok';
      expect(run, `${wait} ${value}`).toMatchObject({
        status: 'FAILED',
        recoveryAttempts: 0,
        error: { code: 'CONFIG', message: expect.stringContaining(name) },
      });
      const steps = await db.pool.query('select count(*)::int as n from runledger.steps where run_id = $1', [handle.runId]);
      expect(steps.rows[0].n, `${wait} ${value}: nothing recorded`).toBe(0);
    }
  });

  it('engine.start refuses a runAt or deadline beyond 2^53 - 1 ms, NaN or Infinity with INVALID_INPUT naming it, and stores nothing', async () => {
    const { engine } = setup();
    const wf = engine.workflow({ name: 'bad-horizons' }, async () => 'ok');
    const count = async () =>
      Number((await db.pool.query(`select count(*) from runledger.runs where workflow_name = 'bad-horizons'`)).rows[0].count);
    for (const value of [1e16, NaN, Infinity, -5, '99999999999999w', 'forever']) {
      await expect(engine.start(wf, undefined, { runAt: value as never }), `runAt ${value}`).rejects.toMatchObject({
        code: 'INVALID_INPUT',
        message: expect.stringContaining('start: runAt'),
      });
      await expect(engine.start(wf, undefined, { deadline: value as never }), `deadline ${value}`).rejects.toMatchObject({
        code: 'INVALID_INPUT',
        message: expect.stringContaining('start: deadline'),
      });
    }
    expect(await count()).toBe(0);
  });

  it('start_run refuses run_in_ms, run_at and deadline past what timestamptz holds with RL003 (was 22008 or a silent wrap)', async () => {
    const { engine } = setup();
    engine.workflow({ name: 'sql-horizons' }, async () => 'ok');
    await engine.runWorker({ manual: true }); // registers the workflow
    const count = async () =>
      Number((await db.pool.query(`select count(*) from runledger.runs where workflow_name = 'sql-horizons'`)).rows[0].count);
    for (const options of [
      { run_in_ms: 9007199254740992 },
      { run_at: '300000-01-01T00:00:00Z' },
      { deadline: '300000 years' },
      { deadline: '300000-01-01' },
    ]) {
      const error = await engine.pool.query(`select runledger.start_run('sql-horizons', '{}', $1::jsonb)`, [JSON.stringify(options)]).then(
        () => undefined,
        (e: unknown) => e,
      );
      expect(error, JSON.stringify(options)).toMatchObject({ code: 'RL003', message: expect.stringContaining('start_run: ') });
    }
    expect(await count()).toBe(0);
    // The SQL helper every duration goes through: a NaN, a negative or a too-long one is RL003, not a time in the past.
    for (const ms of ['NaN', '-1', '9007199254740992']) {
      await expect(engine.pool.query(`select runledger._ms_after(runledger.now(), $1::numeric, 'x')`, [ms]), ms).rejects.toMatchObject({
        code: 'RL003',
      });
    }
    // make_interval of 8.64e16 ms wrapped to a time in the past on PostgreSQL 15.
    await expect(engine.pool.query(`select runledger._ms_after(runledger.now(), 8.64e16, 'x')`)).rejects.toMatchObject({ code: 'RL003' });
  });
});
