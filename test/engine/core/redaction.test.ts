/**
 * Redaction (docs/security.md#redaction): a workflow's `redact` paths name values where
 * they come from (input, output, a step's result, a signal's payload); the engine keeps
 * them out of the copies it writes (events, termination and approval evidence, stored
 * errors, log lines), with "[redacted]" in their place, while the run's own input,
 * checkpoints and output stay whole.
 */
import { sql } from 'kysely';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ConfigError, REDACTED, type Engine } from '../../../src/index.js';
import { Masker, Redaction } from '../../../src/engine/core/redaction.js';
import { createTestEngine } from '../../../src/testing/index.js';
import { createTestDatabase, type TestDatabase } from '../../helpers/database.js';
import { captureLog } from '../../helpers/scan.js';

const CARD = '4111111111111111';
const FINGERPRINT = 'fp_9f8e7d6c5b';
const TOKEN = 'tok_5up3r53cr3t';
const EMAIL = 'ada@example.com';

let db: TestDatabase;
let engine: Engine;
const logged = captureLog();

beforeAll(async () => {
  db = await createTestDatabase();
  // Checked at COMMIT: a duplicate is a CONSTRAINT_VIOLATION of the step, whose detail quotes the value.
  await db.pool.query('create table cards (number text, constraint cards_number unique (number) deferrable initially deferred)');
  engine = createTestEngine({ connectionString: db.url, log: logged.log });
});
afterAll(async () => {
  await engine?.close();
  await db?.drop();
});

async function drain(): Promise<void> {
  const worker = await engine.runWorker({ manual: true });
  await worker.drain();
  await worker.stop();
}

/** The copies the engine writes of a run's data: every place redaction applies to. */
async function copies(runId: string) {
  const one = async (text: string) => (await db.pool.query(text, [runId])).rows;
  const [run] = await one('select error, termination_evidence, stop_record from runledger.runs where run_id = $1');
  return {
    run: run!,
    events: await one('select kind, detail from runledger.events where run_id = $1 order by event_id'),
    approvals: await one('select evidence from runledger.approvals where run_id = $1'),
    stepErrors: await one('select name, error from runledger.steps where run_id = $1 and error is not null order by seq'),
    operationErrors: await one('select name, error from runledger.operations where run_id = $1 and error is not null'),
  };
}

const holds = (value: unknown, text: string) => JSON.stringify(value).includes(text);

interface Card {
  card: { number: string; holder: string };
  amount: number;
  fail?: boolean;
}

describe('redact paths', () => {
  it('keep the input, a step result and the output out of approval evidence, verify evidence, errors, events and log lines; the run sees them whole', async () => {
    const charging = engine.workflow(
      {
        name: 'redacted-charge',
        redact: ['input.card.number', 'output.token', 'steps.charge.result.card'],
        verify: (output, _ctx, input: Card) => ({ ok: true, evidence: { token: (output as { token: string }).token, card: input.card } }),
      },
      async (ctx, input: Card) => {
        const seen = await ctx.step('seen', () => input.card.number);
        const decision = await ctx.requestApproval('approve', { action: 'charge', evidence: input });
        const charge = await ctx.operation(
          'charge',
          {
            compensate: async ({ result }) => {
              throw new Error(`refund of ${result.card.fingerprint} refused`);
            },
          },
          async () => ({ id: 'ch_1', card: { fingerprint: FINGERPRINT, last4: '1111' } }),
        );
        if (input.fail) {
          await ctx.step(
            'notify',
            () => {
              throw new Error(`could not notify about card ${input.card.number} (${charge.card.fingerprint})`);
            },
            { retry: { maxAttempts: 2, initialDelayMs: 0 } },
          );
        }
        return { token: TOKEN, chargeId: charge.id, seen, approved: decision?.approved ?? false };
      },
    );
    const input = { card: { number: CARD, holder: 'Ada' }, amount: 30 };
    const succeeding = await engine.start(charging, input);
    const failing = await engine.start(charging, { ...input, fail: true });
    await drain();

    // What the approvers see is a copy: the card number is not in it.
    expect((await copies(succeeding.runId)).approvals).toEqual([{ evidence: { card: { number: REDACTED, holder: 'Ada' }, amount: 30 } }]);
    expect((await copies(failing.runId)).approvals).toEqual([
      { evidence: { card: { number: REDACTED, holder: 'Ada' }, amount: 30, fail: true } },
    ]);
    const requests = (await db.pool.query(`select request_id from runledger.approvals where name = 'approve'`)).rows;
    for (const { request_id } of requests) await engine.decideApproval(request_id, { approved: true, decidedBy: 'maria' });
    await drain();

    // The run's own data is whole: its input, its checkpoints, its output.
    const ok = (await engine.getRun(succeeding.runId))!;
    expect(ok).toMatchObject({
      status: 'SUCCEEDED',
      input,
      output: { token: TOKEN, chargeId: 'ch_1', seen: CARD, approved: true },
      terminationEvidence: { verification: { token: REDACTED, card: { number: REDACTED, holder: 'Ada' } } },
    });
    expect(ok.steps!.find((s) => s.name === 'charge')?.output).toMatchObject({
      value: { id: 'ch_1', card: { fingerprint: FINGERPRINT, last4: '1111' } },
    });
    const okCopies = await copies(succeeding.runId);
    expect(okCopies.events.find((e) => e.kind === 'completed')?.detail.evidence.verification).toEqual({
      token: REDACTED,
      card: { number: REDACTED, holder: 'Ada' },
    });
    // verify's verdict is evidence too, in its checkpoint as in the termination record.
    expect(ok.steps!.find((s) => s.name === '@verify')?.output).toEqual({
      ok: true,
      evidence: { token: REDACTED, card: { number: REDACTED, holder: 'Ada' } },
    });

    const failed = (await engine.getRun(failing.runId))!;
    expect(failed.status).toBe('FAILED');
    const failedCopies = await copies(failing.runId);
    const notify = `could not notify about card ${REDACTED} (${REDACTED})`;
    expect(failedCopies.stepErrors.find((s) => s.name === 'notify')?.error.message).toBe(notify);
    expect(failedCopies.events.find((e) => e.kind === 'attempt_failed')?.detail.error.message).toBe(notify);
    expect(failedCopies.events.find((e) => e.kind === 'compensation_failed')?.detail.error.message).toBe(`refund of ${REDACTED} refused`);
    expect(failedCopies.run.error).toMatchObject({
      message: `step "notify" failed: ${notify}`,
      compensationFailures: [{ operation: 'charge', error: expect.objectContaining({ message: `refund of ${REDACTED} refused` }) }],
    });
    expect(failedCopies.events.find((e) => e.kind === 'failed')?.detail.error.message).toBe(`step "notify" failed: ${notify}`);
    const compensationLines = logged.lines.filter((line) => line.includes('compensation of charge failed'));
    expect(compensationLines).toHaveLength(2);
    expect(compensationLines.every((line) => line.includes(`refund of ${REDACTED} refused`))).toBe(true);

    for (const value of [CARD, FINGERPRINT, TOKEN]) {
      for (const runCopies of [okCopies, failedCopies]) expect(holds(runCopies, value), `${value} in a copy`).toBe(false);
      expect(logged.lines.filter((line) => line.includes(value))).toEqual([]);
    }
  });

  it("keep a value out of a constraint violation's detail, as stored in the run's error and its failed event", async () => {
    const storing = engine.workflow({ name: 'redacted-cards', redact: ['input.card.number'] }, async (ctx, input: Card) => {
      await ctx.transaction('store-card', async (trx) => {
        await sql`insert into cards (number) values (${input.card.number})`.execute(trx);
      });
    });
    const first = await engine.start(storing, { card: { number: CARD, holder: 'Ada' }, amount: 1 });
    await drain();
    const second = await engine.start(storing, { card: { number: CARD, holder: 'Bob' }, amount: 2 });
    await drain();

    expect(await engine.getRun(first.runId)).toMatchObject({ status: 'SUCCEEDED' });
    const run = (await engine.getRun(second.runId))!;
    expect(run).toMatchObject({
      status: 'FAILED',
      input: { card: { number: CARD } },
      error: { code: 'CONSTRAINT_VIOLATION', detail: `Key (number)=(${REDACTED}) already exists.` },
    });
    const { events } = await copies(second.runId);
    expect(events.find((e) => e.kind === 'failed')?.detail.error.detail).toBe(`Key (number)=(${REDACTED}) already exists.`);
    expect(holds(await copies(second.runId), CARD)).toBe(false);
    expect(logged.lines.filter((line) => line.includes(CARD))).toEqual([]);
  });

  it("keep a signal payload's value out of the run's error; the wait's checkpoint keeps the payload", async () => {
    const replying = engine.workflow({ name: 'redacted-signal', redact: ['signals.reply.payload.email'] }, async (ctx) => {
      const reply = await ctx.waitForSignal<{ email: string }>('reply');
      throw new Error(`no account for ${reply!.email}`);
    });
    const handle = await engine.start(replying, undefined);
    await drain();
    await engine.signal(handle.runId, 'reply', { email: EMAIL });
    await drain();

    const run = (await engine.getRun(handle.runId))!;
    expect(run).toMatchObject({ status: 'FAILED', error: { message: `no account for ${REDACTED}` } });
    expect(run.steps![0]!.output).toMatchObject({ payload: { email: EMAIL } });
    expect(holds(await copies(handle.runId), EMAIL)).toBe(false);
  });

  it("keep the run's values out of a failed migration's error, as recorded in its event and logged", async () => {
    const v1 = engine.workflow({ name: 'redacted-moving', version: '1' }, async (ctx, input: Card) => {
      await ctx.waitForSignal('go');
      return input.amount;
    });
    engine.workflow(
      {
        name: 'redacted-moving',
        version: '2',
        redact: ['input.card.number'],
        migrations: {
          '1': ({ input }) => {
            throw new Error(`cannot move card ${(input as Card).card.number}`);
          },
        },
      },
      async () => 0,
    );
    const handle = await engine.start(v1, { card: { number: CARD, holder: 'Ada' }, amount: 5 });
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    expect(await engine.migrateRun(handle.runId, '2', { wait: false })).toMatchObject({ outcome: 'requested' });
    await worker.runOnce();
    await worker.stop();

    const { events } = await copies(handle.runId);
    expect(events.find((e) => e.kind === 'migration_failed')?.detail.error.message).toContain(`cannot move card ${REDACTED}`);
    expect(holds(events, CARD)).toBe(false);
    expect(logged.lines.filter((line) => line.includes(CARD))).toEqual([]);
    expect((await engine.getRun(handle.runId))?.input).toEqual({ card: { number: CARD, holder: 'Ada' }, amount: 5 });
  });

  it('are checked at definition: a bad path is a CONFIG error naming it', () => {
    const define = (redact: unknown) => () =>
      engine.workflow({ name: `bad-${Math.random().toString(36).slice(2, 8)}`, redact } as never, async () => 1);
    for (const bad of [
      'card.number',
      'input..number',
      'input.',
      'steps.charge.card',
      'steps.charge',
      'signals.reply',
      'signals.reply.body.email',
      'input.ca*rd',
      'input.**',
      '',
      7,
    ]) {
      expect(define([bad]), JSON.stringify(bad)).toThrow(ConfigError);
    }
    expect(define('input.card')).toThrow(/redact must be a list of paths/);
    expect(define(['card.number'])).toThrow(/redact path "card.number" is invalid: unknown root "card"/);
    for (const good of [
      'input',
      'output.token',
      'steps.*.result',
      'steps.charge.result.card.*',
      'signals.*.payload.email',
      'input.items.0.sku',
    ]) {
      expect(define([good]), good).not.toThrow();
    }
  });
});

describe('the masking function', () => {
  const masker = (paths: string[], source: Parameters<Redaction['select']>[0], value: unknown) => {
    const m = new Masker();
    m.addRedacted(Redaction.compile(paths, 'test')!.select(source, value));
    return m;
  };

  it('selects what a path names: keys, * over keys and array elements, array indices, every leaf under an object', () => {
    const input = {
      items: [
        { sku: 'SKU-1', price: 1234 },
        { sku: 'SKU-2', price: 99 },
      ],
      card: { number: CARD, exp: { m: 12, y: 2031 } },
    };
    const r = Redaction.compile(['input.items.*.sku', 'input.items.1.price', 'input.card', 'steps.x.result'], 'test')!;
    expect(r.select({ root: 'input' }, input)).toEqual(['SKU-1', 'SKU-2', 99, CARD, 12, 2031]);
    expect(r.select({ root: 'step', name: 'x' }, 'whole')).toEqual(['whole']);
    expect(r.select({ root: 'step', name: 'y' }, 'other')).toEqual([]);
    expect(r.select({ root: 'output' }, input)).toEqual([]);
  });

  it('replaces values inside text, and short ones only where they are a whole value', () => {
    const m = masker(['input.*'], { root: 'input' }, { code: 'US', card: CARD, quote: 'say "hi" now', n: 4242 });
    expect(m.mask({ message: `card ${CARD} from US`, code: 'US', numbers: [4242, 42], text: 'the card 4242 is used' })).toEqual({
      message: `card ${REDACTED} from US`,
      code: REDACTED,
      numbers: [REDACTED, 42],
      text: `the card ${REDACTED} is used`,
    });
    // Quoted in JSON text (an error message that printed an object), it is found too.
    expect(m.maskText(`got ${JSON.stringify({ q: 'say "hi" now' })}`)).toBe(`got {"q":"${REDACTED}"}`);
  });

  it('names a secret in its place, and finds it in a payload as it is or JSON-escaped', () => {
    const m = new Masker();
    m.addSecret('api', 'k"ey-123');
    expect(m.maskText('Bearer k"ey-123')).toBe('Bearer [secret:api]');
    expect(m.secretIn(JSON.stringify({ header: 'Bearer k"ey-123' }))).toBe('api');
    expect(m.secretIn(Buffer.from('raw k"ey-123 bytes'))).toBe('api');
    expect(m.secretIn('nothing here')).toBeUndefined();
  });
});
