import { beforeAll, describe, expect, it } from 'vitest';
import type { Engine } from '../src/index.js';
import { useTestEngine } from './helpers/test-engine.js';
import { CommitFaultProxy } from './helpers/tcp-proxy.js';

/**
 * A transaction step whose COMMIT outcome the worker never learns is resolved by
 * reading whether its checkpoint committed, never by blindly running it again.
 */
let proxy: CommitFaultProxy;
// The engine talks to the database through the proxy; the tests' own queries go direct.
const t = useTestEngine({
  prepare: async (db) => {
    await db.pool.query(`
      create table payments (run_id text primary key, amount int not null);
      create table pay_attempts (id bigint generated always as identity, run_id text not null)`);
    const target = new URL(db.url);
    proxy = await CommitFaultProxy.start({ host: target.hostname, port: Number(target.port || 5432) });
    return () => proxy.stop();
  },
  engine: (db) => {
    const viaProxy = new URL(db.url);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String(proxy.port);
    return { connectionString: viaProxy.toString() };
  },
});
const { db } = t;
let pay: ReturnType<typeof definePay>;

function definePay(e: Engine) {
  return e.workflow({ name: 'pay' }, async (ctx, input: { fault: string }) => {
    const amount = await ctx.step('quote', () => 42);
    const receipt = await ctx.transaction('pay', async (trx) => {
      await db.pool.query('insert into pay_attempts (run_id) values ($1)', [ctx.runId]);
      await trx.insertInto('payments').values({ run_id: ctx.runId, amount }).execute();
      return { receipt: `r-${input.fault}` };
    });
    return ctx.step('done', () => receipt.receipt);
  });
}

beforeAll(async () => {
  pay = definePay(t.engine);
  await t.engine.runWorker({ concurrency: 2, leaseMs: 2_000, pollIntervalMs: 100 });
});

async function facts(runId: string) {
  const payments = await db.pool.query('select amount from payments where run_id = $1', [runId]);
  const attempts = await db.pool.query('select count(*)::int as n from pay_attempts where run_id = $1', [runId]);
  const step = await db.pool.query(`select output, fencing_token::int as token from runledger.steps where run_id = $1 and name = 'pay'`, [
    runId,
  ]);
  return { payments: payments.rows, attempts: attempts.rows[0].n, step: step.rows };
}

describe('a COMMIT whose outcome is unknown', () => {
  it('committed but the reply was lost: the checkpoint is read back and the step is not run again', async () => {
    proxy.arm('drop-reply');
    const handle = await t.engine.start(pay, { fault: 'reply' });
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('r-reply');
    expect(proxy.faultsInjected).toBe(1);
    expect(await facts(handle.runId)).toEqual({
      payments: [{ amount: 42 }],
      attempts: 1,
      step: [{ output: { receipt: 'r-reply' }, token: 1 }],
    });
  });

  it('never reached the server: nothing committed, so the step runs again and commits once', async () => {
    proxy.arm('drop-request');
    const handle = await t.engine.start(pay, { fault: 'request' });
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('r-request');
    expect(proxy.faultsInjected).toBe(2);
    expect(await facts(handle.runId)).toEqual({
      payments: [{ amount: 42 }],
      attempts: 2,
      step: [{ output: { receipt: 'r-request' }, token: 1 }],
    });
  });
});
