/**
 * runledger/testing as a user meets it: a workflow crash-tested in-process with the
 * engine option crashAt, a manual worker and a test clock, with no sleep and no process.
 */
import { afterAll, beforeAll, describe, expect, inject, it } from 'vitest';
import { sql } from 'kysely';
import type { Engine } from '../../src/index.js';
import { createTestClock, createTestDatabase, createTestEngine, type TestDatabase } from '../../src/testing/index.js';

let db: TestDatabase;
const engines: Engine[] = [];

beforeAll(async () => {
  db = await createTestDatabase({ adminUrl: inject('adminUrl'), template: inject('templateDatabase') });
  await db.pool.query('create table charges (order_id text primary key, amount int not null)');
});

afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
  await db?.drop();
});

function checkoutWorkflow(engine: Engine, bodies: Record<string, number>) {
  const count = (step: string) => (bodies[step] = (bodies[step] ?? 0) + 1);
  return engine.workflow({ name: `checkout-${engines.length}` }, async (ctx, input: { orderId: string }) => {
    const amount = await ctx.step('price', () => {
      count('price');
      return 42;
    });
    await ctx.transaction('charge', async (trx) => {
      count('charge');
      await sql`insert into charges (order_id, amount) values (${input.orderId}, ${amount})`.execute(trx);
    });
    await ctx.sleep('cool-off', '1h');
    return ctx.step('notify', () => {
      count('notify');
      return `charged ${amount}`;
    });
  });
}

describe('a workflow crash-tested in-process', () => {
  it('crashAt after the charge commits: another worker recovers once the lease ran out, the charge is not repeated', async () => {
    const clock = createTestClock('2030-01-01T00:00:00Z');
    const engine = createTestEngine({ connectionString: db.url, clock, crashAt: { step: 'charge', when: 'after-commit' } });
    engines.push(engine);
    const bodies: Record<string, number> = {};
    const checkout = checkoutWorkflow(engine, bodies);
    const handle = await engine.start(checkout, { orderId: 'o-1' });

    const doomed = await engine.runWorker({ manual: true, leaseMs: 30_000 });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'RUNNING', recoveryAttempts: 0 });
    expect((await db.pool.query(`select count(*)::int as n from charges where order_id = 'o-1'`)).rows[0].n).toBe(1);

    // The lease is 30 s of the database's clock: before it runs out nobody may take the run.
    const survivor = await engine.runWorker({ manual: true, leaseMs: 30_000 });
    clock.advance('20s');
    expect(await survivor.drain()).toBe(0);
    clock.advance('11s');
    expect(await survivor.drain()).toBe(1);
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'WAITING', waitKind: 'timer', recoveryAttempts: 1 });

    clock.advance('1h');
    expect(await survivor.drain()).toBe(1);
    const run = await engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED', output: 'charged 42', recoveryAttempts: 1 });
    expect(bodies).toEqual({ price: 1, charge: 1, notify: 1 });
    expect((await db.pool.query(`select count(*)::int as n from charges where order_id = 'o-1'`)).rows[0].n).toBe(1);
    // The run's own record agrees: the charge checkpoint was written by the first owner (token 1).
    const steps = await db.pool.query(`select name, fencing_token::int as token from runledger.steps where run_id = $1 order by seq`, [
      handle.runId,
    ]);
    expect(steps.rows).toEqual([
      { name: 'price', token: 1 },
      { name: 'charge', token: 1 },
      { name: 'cool-off', token: 2 },
      { name: 'notify', token: 3 },
    ]);
  });

  it("crashAt 'after-call' of a plain step: the step runs again after recovery (at least once until its checkpoint commits)", async () => {
    const clock = createTestClock('2030-01-01T00:00:00Z');
    const engine = createTestEngine({ connectionString: db.url, clock, crashAt: { step: 'price', when: 'after-call' } });
    engines.push(engine);
    const bodies: Record<string, number> = {};
    const checkout = checkoutWorkflow(engine, bodies);
    const handle = await engine.start(checkout, { orderId: 'o-2' });
    const doomed = await engine.runWorker({ manual: true, leaseMs: 5_000 });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    expect(bodies).toEqual({ price: 1 });
    clock.advance('6s');
    const survivor = await engine.runWorker({ manual: true, leaseMs: 5_000 });
    await survivor.drain();
    clock.advance('1h');
    await survivor.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', recoveryAttempts: 1 });
    expect(bodies).toEqual({ price: 2, charge: 1, notify: 1 });
  });
});

describe('the test clock', () => {
  it("is what runledger.now() answers on the engine's connections, after every change", async () => {
    const clock = createTestClock('2031-05-06T07:08:09Z');
    const engine = createTestEngine({ connectionString: db.url, clock });
    engines.push(engine);
    const now = async () => (await engine.pool.query('select runledger.now() as now')).rows[0].now.toISOString();
    expect(await now()).toBe('2031-05-06T07:08:09.000Z');
    clock.advance('2h');
    expect(await now()).toBe('2031-05-06T09:08:09.000Z');
    clock.set('2040-01-01T00:00:00Z');
    expect(await Promise.all([now(), now(), now()])).toEqual(Array(3).fill('2040-01-01T00:00:00.000Z'));
    clock.reset();
    expect(Math.abs(Date.parse(await now()) - Date.now())).toBeLessThan(60_000);
  });

  it("is switched on in the databases createTestDatabase makes; elsewhere the engine's first query says so (CONFIG)", async () => {
    expect((await db.pool.query('select test_clock from runledger.owner_settings')).rows[0].test_clock).toBe(true);
    await db.pool.query('update runledger.owner_settings set test_clock = false');
    try {
      const engine = createTestEngine({ connectionString: db.url, clock: createTestClock('2031-05-06T07:08:09Z') });
      engines.push(engine);
      await expect(engine.pool.query('select 1')).rejects.toMatchObject({
        code: 'CONFIG',
        message: expect.stringContaining('owner_settings.test_clock'),
      });
    } finally {
      await db.pool.query('update runledger.owner_settings set test_clock = true where not test_clock');
    }
  });
});

describe('manual workers and crash points: bad use is refused with a code', () => {
  it('runOnce() on a worker that is not manual, and crashAt with an unknown point', async () => {
    const engine = createTestEngine({ connectionString: db.url });
    engines.push(engine);
    engine.workflow({ name: 'noop-manual' }, async () => 1);
    const worker = await engine.runWorker({ pollIntervalMs: 1000 });
    await expect(worker.runOnce()).rejects.toMatchObject({ code: 'CONFIG' });
    await worker.stop();
    expect(() => createTestEngine({ connectionString: db.url, crashAt: { when: 'sometime' as never } })).toThrow(
      /crashAt: when must be one of/,
    );
  });

  it('drain() with maxRounds below 1, a manual option that is not a boolean, and a crash point with an empty step', async () => {
    const engine = createTestEngine({ connectionString: db.url });
    engines.push(engine);
    engine.workflow({ name: 'noop-manual-args' }, async () => 1);
    const manual = await engine.runWorker({ manual: true });
    await expect(manual.drain({ maxRounds: 0 })).rejects.toMatchObject({ code: 'CONFIG', message: expect.stringMatching(/maxRounds/) });
    await manual.stop();
    await expect(engine.runWorker({ manual: 'yes' as never })).rejects.toMatchObject({
      code: 'CONFIG',
      message: expect.stringMatching(/manual/),
    });
    expect(() => createTestEngine({ connectionString: db.url, crashAt: { when: 'after-commit', step: '' } })).toThrow(/crashAt: step/);
  });
});
