/**
 * Secret references (docs/security.md#secret-references): ctx.secret resolves a name
 * through the engine's `secrets` resolver at run time, once per execution, and the value
 * is never stored: a payload holding it is refused (SECRET_IN_PAYLOAD), an error holding
 * it is stored and logged with [secret:name] in its place. Every assertion about "never
 * stored" reads every text, json and bytea column of every runledger table.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Engine, EngineOptions, SecretResolver } from '../../../src/index.js';
import { createTestClock, createTestEngine } from '../../../src/testing/index.js';
import { createTestDatabase, type TestDatabase } from '../../helpers/database.js';
import { captureLog, whereStored } from '../../helpers/scan.js';

const VALUE = 'sk_test_51Hx9QzR3cr3tV4lu3';
const MARK = '[secret:stripe-key]';

let db: TestDatabase;
const engines: Engine[] = [];
const logged = captureLog();

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query('create table ledger_rows (id serial primary key, note text not null)');
});
afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
  await db?.drop();
});

/** A payment service that only answers to the right key, and remembers what it was asked. */
function fakeStripe() {
  const calls: Array<{ call: string; amount?: number }> = [];
  const authorize = (key: string) => {
    if (key !== VALUE) throw new Error('stripe: invalid API key');
  };
  return {
    calls,
    charge(key: string, amount: number) {
      authorize(key);
      calls.push({ call: 'charge', amount });
      return { id: `ch_${calls.length}`, amount };
    },
    capture(key: string, chargeId: string) {
      authorize(key);
      calls.push({ call: 'capture' });
      return { captured: chargeId };
    },
  };
}

/** The resolver of these tests, remembering each call: stripe-key is known, broken throws, anything else is unknown. */
function resolver() {
  const resolved: Array<{ name: string; runId: string; workflow: string; version: string }> = [];
  const secrets: SecretResolver = async (name, { runId, workflow, version }) => {
    resolved.push({ name, runId, workflow, version });
    if (name === 'broken') throw new Error('vault is sealed');
    return name === 'stripe-key' ? VALUE : undefined;
  };
  return { resolved, secrets };
}

function newEngine(options: Partial<EngineOptions> & { clock?: ReturnType<typeof createTestClock> } = {}): Engine {
  const engine = createTestEngine({ connectionString: db.url, log: logged.log, ...options });
  engines.push(engine);
  return engine;
}

async function runToEnd(engine: Engine, runId: string) {
  const worker = await engine.runWorker({ manual: true });
  await worker.drain();
  await worker.stop();
  return (await engine.getRun(runId))!;
}

const stepRow = async (runId: string, name: string) =>
  (await db.pool.query('select status, attempts, error from runledger.steps where run_id = $1 and name = $2', [runId, name])).rows[0];

describe('ctx.secret', () => {
  it('resolves a secret at run time, once per execution; a step uses it, the run completes, and the value is stored and logged nowhere', async () => {
    const { resolved, secrets } = resolver();
    const engine = newEngine({ secrets });
    const stripe = fakeStripe();
    const paying = engine.workflow({ name: 'paying' }, async (ctx, input: { amount: number }) => {
      const key = await ctx.secret('stripe-key');
      expect(await ctx.secret('stripe-key')).toBe(key); // the same execution asks the resolver once
      const charge = await ctx.step('charge', () => stripe.charge(key, input.amount));
      await ctx.operation('capture', { idempotencyKey: `capture-${ctx.runId}` }, async () => stripe.capture(key, charge.id));
      await ctx.stream('progress').write({ charged: charge.id });
      await ctx.artifact('receipt', `receipt for ${charge.id}`);
      return { chargeId: charge.id };
    });
    const handle = await engine.start(paying, { amount: 30 });

    const run = await runToEnd(engine, handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED', output: { chargeId: 'ch_1' } });
    expect(stripe.calls).toEqual([{ call: 'charge', amount: 30 }, { call: 'capture' }]);
    expect(resolved).toEqual([{ name: 'stripe-key', runId: handle.runId, workflow: 'paying', version: '1' }]);
    // Not a step: nothing of the secret is a checkpoint (or an event about one).
    expect(run.steps!.map((s) => s.name)).toEqual(['charge', 'capture', 'artifact:receipt']);
    expect(await whereStored(db.pool, VALUE)).toEqual([]);
    expect(logged.lines.filter((line) => line.includes(VALUE))).toEqual([]);
  });

  it('refuses every payload that holds the value with SECRET_IN_PAYLOAD, storing none of it and committing no write of the refused step', async () => {
    const { secrets } = resolver();
    const engine = newEngine({ secrets });
    const child = engine.workflow({ name: 'leak-child' }, async () => 'child');
    const code = (error: any) => (error.code === 'STEP_FAILED' ? `${error.code}/${error.originalCode}` : error.code);
    const messages: string[] = [];
    const leaky = engine.workflow({ name: 'leaky' }, async (ctx) => {
      const key = await ctx.secret('stripe-key');
      const codes: Record<string, string> = {};
      const attempt = async (what: string, write: () => unknown) => {
        try {
          await write();
          codes[what] = 'stored';
        } catch (error) {
          codes[what] = code(error);
          messages.push((error as Error).message);
        }
      };
      await attempt('step', () => ctx.step('leak', () => ({ token: key }), { retry: { maxAttempts: 3, initialDelayMs: 0 } }));
      await attempt('transaction', () =>
        ctx.transaction('leak-trx', async (trx) => {
          await sql`insert into ledger_rows (note) values ('written by leak-trx')`.execute(trx);
          return `key=${key}`;
        }),
      );
      await attempt('operation result', () => ctx.operation('leak-op', {}, async () => ({ echo: key })));
      await attempt('idempotency key', () => ctx.operation('leak-key', { idempotencyKey: `charge-${key}` }, async () => 1));
      await attempt('stream chunk', () => ctx.stream('out').write({ header: `Bearer ${key}` }));
      await attempt('approval evidence', () => ctx.requestApproval('leak-approval', { action: 'ship', evidence: { key } }));
      await attempt('child input', () => ctx.startChild(child, { key }));
      await attempt('heartbeat progress', () =>
        ctx.step('leak-progress', async ({ heartbeat }) => {
          await heartbeat({ cursor: key });
          return 1;
        }),
      );
      await attempt('artifact', () => ctx.artifact('leak-artifact', `the key is ${key}`));
      const session = await ctx.session(`leak-session-${ctx.runId}`);
      await attempt('session entry', () => session.append([{ role: 'user', content: `my key is ${key}` }]));
      return codes;
    });
    const handle = await engine.start(leaky, undefined);

    const run = await runToEnd(engine, handle.runId);
    expect(run.status).toBe('SUCCEEDED');
    expect(run.output).toEqual({
      step: 'STEP_FAILED/SECRET_IN_PAYLOAD',
      transaction: 'STEP_FAILED/SECRET_IN_PAYLOAD',
      'operation result': 'STEP_FAILED/SECRET_IN_PAYLOAD',
      'idempotency key': 'SECRET_IN_PAYLOAD',
      'stream chunk': 'SECRET_IN_PAYLOAD',
      'approval evidence': 'SECRET_IN_PAYLOAD',
      'child input': 'SECRET_IN_PAYLOAD',
      'heartbeat progress': 'STEP_FAILED/SECRET_IN_PAYLOAD',
      artifact: 'SECRET_IN_PAYLOAD',
      'session entry': 'SECRET_IN_PAYLOAD',
    });
    expect(messages.every((message) => message.includes('secret "stripe-key"') && !message.includes(VALUE))).toBe(true);
    // Refused at once, whatever the retry policy: the same code would return the same value.
    expect(await stepRow(handle.runId, 'leak')).toMatchObject({
      status: 'FAILED',
      attempts: 1,
      error: { code: 'SECRET_IN_PAYLOAD', message: expect.stringContaining('output of step "leak" contains the value of secret') },
    });
    // The refused transaction's own write rolled back with it.
    expect((await db.pool.query(`select count(*)::int as n from ledger_rows where note = 'written by leak-trx'`)).rows[0].n).toBe(0);
    expect(await whereStored(db.pool, VALUE)).toEqual([]);
  });

  it('a run output holding the value fails the run with SECRET_IN_PAYLOAD; the output is not stored', async () => {
    const { secrets } = resolver();
    const engine = newEngine({ secrets });
    const returning = engine.workflow({ name: 'returning-secret' }, async (ctx) => ({ key: await ctx.secret('stripe-key') }));
    const handle = await engine.start(returning, undefined);

    const run = await runToEnd(engine, handle.runId);
    expect(run).toMatchObject({ status: 'FAILED', output: null, error: { code: 'SECRET_IN_PAYLOAD' } });
    expect((run.error as { message: string }).message).toContain(`output of run ${handle.runId} contains the value of secret "stripe-key"`);
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(await whereStored(db.pool, VALUE)).toEqual([]);
  });

  it('an error thrown with the value in its message is stored, evented and logged with [secret:name] in its place', async () => {
    const { secrets } = resolver();
    const engine = newEngine({ secrets });
    const scrubbing = engine.workflow({ name: 'scrubbing' }, async (ctx) => {
      const key = await ctx.secret('stripe-key');
      await ctx.operation(
        'charge',
        {
          compensate: async () => {
            throw new Error(`refund with ${key} refused`);
          },
        },
        async () => ({ id: 'ch_9' }),
      );
      await ctx.step(
        'call',
        () => {
          throw new Error(`stripe rejected key ${key}: invalid "${key}"`);
        },
        { retry: { maxAttempts: 2, initialDelayMs: 0 } },
      );
    });
    const throwing = engine.workflow({ name: 'throwing' }, async (ctx) => {
      const key = await ctx.secret('stripe-key');
      throw new TypeError(`cannot use ${key}`);
    });
    const scrubbed = await engine.start(scrubbing, undefined);
    const thrown = await engine.start(throwing, undefined);

    const run = await runToEnd(engine, scrubbed.runId);
    expect(run.status).toBe('FAILED');
    const step = await stepRow(scrubbed.runId, 'call');
    expect(step.error.message).toBe(`stripe rejected key ${MARK}: invalid "${MARK}"`);
    expect(step.error.stack).toContain(`stripe rejected key ${MARK}`);
    const error = run.error as { message: string; stack: string; compensationFailures: Array<{ operation: string; error: any }> };
    expect(error.message).toBe(`step "call" failed: stripe rejected key ${MARK}: invalid "${MARK}"`);
    expect(error.compensationFailures).toEqual([
      { operation: 'charge', error: expect.objectContaining({ message: `refund with ${MARK} refused`, attempts: 3 }) },
    ]);
    const events = (await db.pool.query(`select kind, detail from runledger.events where run_id = $1 order by event_id`, [scrubbed.runId]))
      .rows;
    expect(events.find((e) => e.kind === 'attempt_failed')?.detail.error.message).toBe(`stripe rejected key ${MARK}: invalid "${MARK}"`);
    expect(events.find((e) => e.kind === 'compensation_failed')?.detail.error.message).toBe(`refund with ${MARK} refused`);
    expect(events.find((e) => e.kind === 'failed')?.detail.error.message).toContain(MARK);

    expect(await runToEnd(engine, thrown.runId)).toMatchObject({
      status: 'FAILED',
      error: { name: 'TypeError', message: `cannot use ${MARK}`, stack: expect.stringContaining(`cannot use ${MARK}`) },
    });
    // The compensation's retries were logged, scrubbed.
    expect(
      logged.lines.filter((line) => line.includes('compensation of charge failed') && line.includes(`refund with ${MARK}`)),
    ).toHaveLength(2);
    expect(logged.lines.filter((line) => line.includes(VALUE))).toEqual([]);
    expect(await whereStored(db.pool, VALUE)).toEqual([]);
  });

  it('a secret the resolver does not know, a resolver that fails, a bad name and an engine without a resolver are coded errors naming the secret', async () => {
    const { secrets } = resolver();
    const asking = (engine: Engine, name: string) =>
      engine.workflow({ name }, async (ctx, secret: string) => {
        try {
          await ctx.secret(secret);
          return 'resolved';
        } catch (error) {
          const e = error as { code: string; message: string; details?: unknown };
          return { code: e.code, message: e.message, details: e.details ?? null };
        }
      });
    const withResolver = newEngine({ secrets });
    const ask = asking(withResolver, 'asking');
    const unknown = await withResolver.start(ask, 'no-such-key');
    const broken = await withResolver.start(ask, 'broken');
    const badName = await withResolver.start(ask, 'not a name');
    const worker = await withResolver.runWorker({ manual: true });
    await worker.drain();
    await worker.stop();
    expect(await unknown.result()).toEqual({
      code: 'SECRET_NOT_FOUND',
      message: 'ctx.secret("no-such-key"): the secrets resolver has no secret "no-such-key"',
      details: { secret: 'no-such-key' },
    });
    expect(await broken.result()).toEqual({
      code: 'SECRET_NOT_FOUND',
      message: 'ctx.secret("broken"): the secrets resolver failed: vault is sealed',
      details: { secret: 'broken' },
    });
    expect(await badName.result()).toMatchObject({ code: 'CONFIG', message: expect.stringContaining('invalid secret name "not a name"') });

    const withoutResolver = newEngine();
    const askWithout = asking(withoutResolver, 'asking-without');
    const handle = await withoutResolver.start(askWithout, 'stripe-key');
    expect(await runToEnd(withoutResolver, handle.runId)).toMatchObject({
      status: 'SUCCEEDED',
      output: { code: 'CONFIG', message: expect.stringMatching(/^ctx\.secret\("stripe-key"\): no secrets resolver is configured/) },
    });
  });

  it('is resolved again after a recovery: the worker that takes over asks the resolver anew, and the run completes', async () => {
    const clock = createTestClock('2030-01-01T00:00:00Z');
    const { resolved, secrets } = resolver();
    const engine = newEngine({ secrets, clock, crashAt: { step: 'charge', when: 'before-checkpoint' } });
    const stripe = fakeStripe();
    const recovering = engine.workflow({ name: 'recovering' }, async (ctx) => {
      const key = await ctx.secret('stripe-key');
      const charge = await ctx.step('charge', () => stripe.charge(key, 12));
      await ctx.step('after', () => 'done');
      return { chargeId: charge.id, attempt: ctx.attempt };
    });
    const handle = await engine.start(recovering, undefined);

    const doomed = await engine.runWorker({ manual: true, leaseMs: 30_000 });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    expect(resolved).toHaveLength(1);

    const survivor = await engine.runWorker({ manual: true, leaseMs: 30_000 });
    clock.advance('31s');
    await survivor.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', recoveryAttempts: 1, output: { attempt: 2 } });
    expect(resolved.map((r) => r.name)).toEqual(['stripe-key', 'stripe-key']);
    // The crashed execution's charge was lost with it (a step is at least once): both used the key.
    expect(stripe.calls).toHaveLength(2);
    expect(await whereStored(db.pool, VALUE)).toEqual([]);
    expect(logged.lines.filter((line) => line.includes(VALUE))).toEqual([]);
  });
});
