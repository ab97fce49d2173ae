import { afterEach, describe, expect, it } from 'vitest';
import { NonRetryableError, type Engine, type Worker } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from './helpers/worker-process.js';
import { stoppedAfterEach } from './helpers/cleanup.js';
import { TicketService } from './helpers/ticket-service.js';

let service: TicketService;
const t = useTestEngine({
  fixtures: true,
  prepare: async () => {
    service = await TicketService.start();
    return () => service.stop();
  },
});
const { db } = t;
const { processes: spawned, workers } = stoppedAfterEach();

afterEach(async () => {
  service.holdReplies(false);
});

async function processWorker(env: Record<string, string> = {}): Promise<WorkerProcess> {
  const w = await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '1000', CONCURRENCY: '2', ...env });
  spawned.push(w);
  return w;
}

async function inProcessWorker(e: Engine, queues: string[], options: { concurrency?: number; leaseMs?: number } = {}): Promise<Worker> {
  const w = await e.runWorker({ queues, concurrency: options.concurrency ?? 2, leaseMs: options.leaseMs ?? 2_000, pollIntervalMs: 100 });
  workers.push(w);
  return w;
}

const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const operation = async (runId: string) => (await db.pool.query('select * from runledger.operations where run_id = $1', [runId])).rows[0];
const events = async (runId: string, kind: string) =>
  (await db.pool.query('select detail from runledger.events where run_id = $1 and kind = $2 order by event_id', [runId, kind])).rows.map(
    (r) => r.detail,
  );

/** The service has acted on the call, then the worker dies before reading the reply. */
async function crashAfterTheCall(mode: 'reconcile' | 'idempotent' | 'manual') {
  service.holdReplies(true);
  const handle = await t.engine.start(t.fixtures.ticket, { mode, service: service.url });
  const key = `ticket-${handle.runId}`;
  const first = await processWorker();
  await waitFor('the service counted the call', async () => service.calls.get(key) === 1);
  first.kill('SIGKILL');
  await first.exited;
  service.holdReplies(false);
  expect((await operation(handle.runId)).status).toBe('STARTED'); // the intent committed before the call
  return { handle, key };
}

describe('the crash window of an external call', () => {
  it('with reconcile: the run completes and the service saw exactly one call', async () => {
    const { handle, key } = await crashAfterTheCall('reconcile');
    await processWorker();
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toEqual({ id: service.tickets.get(key) });
    expect(service.calls.get(key)).toBe(1);
    expect(await operation(handle.runId)).toMatchObject({
      status: 'SUCCEEDED',
      idempotency_key: key,
      external_resource_id: service.tickets.get(key),
    });
    expect(await events(handle.runId, 'operation_unknown')).toHaveLength(1);
  });

  it('without reconcile and not idempotent: the run waits UNKNOWN until resolve_operation from SQL; still one call', async () => {
    const { handle, key } = await crashAfterTheCall('manual');
    await processWorker();
    await waitFor('waiting for an operator', async () => (await runRow(handle.runId)).wait_kind === 'reconcile');
    expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', lease_owner: null });
    const unknown = await db.pool.query(
      'select operation_id, idempotency_key, run_id from runledger.unknown_operations where run_id = $1',
      [handle.runId],
    );
    expect(unknown.rows).toEqual([{ operation_id: expect.any(String), idempotency_key: key, run_id: handle.runId }]);

    const ticketId = service.tickets.get(key);
    await db.pool.query(`select runledger.resolve_operation($1, 'SUCCEEDED', $2::jsonb)`, [
      unknown.rows[0].operation_id,
      JSON.stringify({ id: ticketId }),
    ]);
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toEqual({ id: ticketId });
    expect(service.calls.get(key)).toBe(1);
    expect(await operation(handle.runId)).toMatchObject({ status: 'SUCCEEDED', resolved_by: expect.any(String) });
  });

  it('declared idempotent: the retry reuses the same key, and the service made one ticket', async () => {
    const { handle, key } = await crashAfterTheCall('idempotent');
    await processWorker();
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toEqual({ id: service.tickets.get(key) });
    expect(service.calls.get(key)).toBe(2); // same key both times
    expect([...service.calls.keys()].filter((k) => k.includes(handle.runId))).toEqual([key]);
    expect(await operation(handle.runId)).toMatchObject({ status: 'SUCCEEDED', attempts: 2 });
  });

  it('resolve_operation refuses bad input with coded errors', async () => {
    await expect(db.pool.query(`select runledger.resolve_operation('nope', 'SUCCEEDED')`)).rejects.toMatchObject({ code: 'RL002' });
    await expect(db.pool.query(`select runledger.resolve_operation('nope', 'MAYBE')`)).rejects.toMatchObject({ code: 'RL003' });
    await expect(t.engine.resolveOperation('nope', { status: 'FAILED' })).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});

describe('retries', () => {
  it('a flaky step succeeds on attempt 3, with each failed attempt and its backoff recorded', async () => {
    let calls = 0;
    const wf = t.engine.workflow({ name: 'flaky-retry', queue: 'retries' }, async (ctx) =>
      ctx.step(
        'flaky',
        ({ attempt }) => {
          calls++;
          if (attempt < 3) throw new Error(`attempt ${attempt} failed`);
          return `ok on ${attempt}`;
        },
        { retry: { maxAttempts: 5, initialDelayMs: 20 } },
      ),
    );
    await inProcessWorker(t.engine, ['retries']);
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('ok on 3');
    expect(calls).toBe(3);
    const failed = await events(handle.runId, 'attempt_failed');
    expect(failed.map((d) => [d.attempt, d.error.message])).toEqual([
      [1, 'attempt 1 failed'],
      [2, 'attempt 2 failed'],
    ]);
    expect(failed.every((d) => d.retry_in_ms >= 10)).toBe(true);
    expect((await t.engine.getRun(handle.runId))?.steps?.[0]).toMatchObject({ name: 'flaky', status: 'SUCCEEDED', attempts: 3 });
  });

  it('a non-retryable error fails the step at once', async () => {
    let calls = 0;
    const wf = t.engine.workflow({ name: 'hopeless', queue: 'retries' }, async (ctx) =>
      ctx.step(
        'hopeless',
        () => {
          calls++;
          throw new NonRetryableError('card declined');
        },
        { retry: { maxAttempts: 5, initialDelayMs: 10 } },
      ),
    );
    await inProcessWorker(t.engine, ['retries']);
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    expect(calls).toBe(1);
    expect(await events(handle.runId, 'attempt_failed')).toEqual([]);
  });

  it('the run retry budget stops a run whose steps keep failing', async () => {
    const wf = t.engine.workflow({ name: 'always-failing', queue: 'retries', limits: { retryBudget: 3 } }, async (ctx) => {
      for (const name of ['a', 'b']) {
        await ctx.step(
          name,
          () => {
            throw new Error(`${name} broken`);
          },
          { retry: { maxAttempts: 10, initialDelayMs: 5 } },
        );
      }
      return 'unreachable';
    });
    await inProcessWorker(t.engine, ['retries']);
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    expect(await events(handle.runId, 'attempt_failed')).toHaveLength(3);
    expect(await events(handle.runId, 'retry_budget_exhausted')).toEqual([
      expect.objectContaining({ retries_used: 3, retry_budget: 3, name: 'a', attempt: 4 }),
    ]);
    expect((await runRow(handle.runId)).retries_used).toBe(3);
  });

  it('a long backoff is a durable wait: the worker is freed and the next attempt runs later', async () => {
    const wf = t.engine.workflow({ name: 'slow-retry', queue: 'one-slot' }, async (ctx) =>
      ctx.step(
        'remote',
        ({ attempt }) => {
          if (attempt === 1) throw new Error('busy, try later');
          return `done on ${attempt}`;
        },
        { retry: { maxAttempts: 2, initialDelayMs: 1_500, jitter: false, durableAfterMs: 500 } },
      ),
    );
    const quick = t.engine.workflow({ name: 'quick-one', queue: 'one-slot' }, async (ctx) => ctx.step('q', () => 'quick'));
    await inProcessWorker(t.engine, ['one-slot'], { concurrency: 1 });
    const handle = await t.engine.start(wf, undefined);
    await waitFor('waiting out the backoff', async () => (await runRow(handle.runId)).wait_kind === 'retry');
    expect(await runRow(handle.runId)).toMatchObject({ status: 'WAITING', lease_owner: null });
    await expect((await t.engine.start(quick, undefined)).result()).resolves.toBe('quick'); // the only slot was free
    await expect(handle.result()).resolves.toBe('done on 2');
  });
});

describe('heartbeats', () => {
  const defineScanner = (e: Engine, hang: boolean) =>
    e.workflow({ name: 'scanner', queue: 'scans' }, async (ctx) =>
      ctx.step('scan', async ({ progress, heartbeat }) => {
        const from = (progress as { cursor: number } | undefined)?.cursor ?? 0;
        for (let cursor = from + 1; cursor <= 3; cursor++) {
          await new Promise((resolve) => setTimeout(resolve, 300));
          await heartbeat({ cursor });
        }
        if (hang && from === 0) await new Promise(() => {}); // stops heartbeating, forever
        return { resumedFrom: from };
      }),
    );

  it('a long step that heartbeats keeps its lease past the lease time', async () => {
    const e = t.newEngine();
    const wf = defineScanner(e, false);
    await inProcessWorker(e, ['scans'], { leaseMs: 600 });
    const handle = await e.start(wf, undefined);
    await expect(handle.result()).resolves.toEqual({ resumedFrom: 0 }); // ran 900 ms with a 600 ms lease
    expect(await runRow(handle.runId)).toMatchObject({ recovery_attempts: 0, fencing_token: '1' });
  });

  it('a step that stops heartbeating is taken over once the lease expires, and reads the last progress', async () => {
    const hanging = t.newEngine();
    const rescuer = t.newEngine();
    const wf = defineScanner(hanging, true);
    defineScanner(rescuer, true);
    await hanging.runWorker({ queues: ['scans'], concurrency: 1, leaseMs: 800, pollIntervalMs: 100 }); // closed with its engine
    const handle = await hanging.start(wf, undefined);
    await waitFor('progress recorded', async () => {
      const r = await db.pool.query('select progress from runledger.step_progress where run_id = $1', [handle.runId]);
      return r.rows[0]?.progress?.cursor === 3;
    });
    await inProcessWorker(rescuer, ['scans'], { leaseMs: 800 });
    await expect(handle.result({ timeoutMs: 20_000 })).resolves.toEqual({ resumedFrom: 3 });
    expect(await runRow(handle.runId)).toMatchObject({ recovery_attempts: 1, fencing_token: '2' });
  });
});

describe('compensation', () => {
  it('compensations run in reverse order, once each, when the run fails', async () => {
    await inProcessWorker(t.engine, ['default']);
    const handle = await t.engine.start(t.fixtures.saga, { service: service.url });
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    const compensated = await db.pool.query(
      `select detail->>'operation_id' as op from runledger.events where run_id = $1 and kind = 'compensated' order by event_id`,
      [handle.runId],
    );
    const ops = await db.pool.query(
      'select operation_id, name, compensation_status from runledger.operations where run_id = $1 order by seq',
      [handle.runId],
    );
    expect(ops.rows.map((o) => [o.name, o.compensation_status])).toEqual([
      ['reserve', 'DONE'],
      ['charge', 'DONE'],
    ]);
    expect(compensated.rows.map((r) => r.op)).toEqual([ops.rows[1].operation_id, ops.rows[0].operation_id]);
    expect(service.cancellations.get(`charge-${handle.runId}:compensate`)).toBe(1);
    expect(service.cancellations.get(`reserve-${handle.runId}:compensate`)).toBe(1);
  });

  it('a crash in the middle of compensating resumes it; none runs twice', async () => {
    const handle = await t.engine.start(t.fixtures.saga, { service: service.url });
    const doomed = await processWorker({ RUNLEDGER_FAILPOINTS: 'after-compensation:charge' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    expect(service.cancellations.get(`charge-${handle.runId}:compensate`)).toBe(1);
    expect(service.cancellations.get(`reserve-${handle.runId}:compensate`)).toBeUndefined();

    await processWorker();
    await expect(handle.result({ timeoutMs: 30_000 })).rejects.toMatchObject({ details: { status: 'FAILED' } });
    expect(service.cancellations.get(`charge-${handle.runId}:compensate`)).toBe(1);
    expect(service.cancellations.get(`reserve-${handle.runId}:compensate`)).toBe(1);
    expect(service.calls.get(`charge-${handle.runId}`)).toBe(1);
  });

  it('a compensation that throws is tried again (3 attempts with backoff) before it is recorded FAILED', async () => {
    const tries = new Map<string, number>();
    const flaky = (name: string, failures: number) => ({
      compensate: () => {
        const n = (tries.get(name) ?? 0) + 1;
        tries.set(name, n);
        if (n <= failures) throw new Error(`${name} refund service down (try ${n})`);
      },
    });
    const wf = t.engine.workflow({ name: 'flaky-saga', queue: 'flaky-saga' }, async (ctx) => {
      await ctx.operation('hold', { ...flaky('hold', 5) }, async () => 'h');
      await ctx.operation('pay', { ...flaky('pay', 2) }, async () => 'p');
      await ctx.step('ship', () => {
        throw new NonRetryableError('warehouse closed');
      });
    });
    await inProcessWorker(t.engine, ['flaky-saga']);
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result({ timeoutMs: 20_000 })).rejects.toMatchObject({ details: { status: 'FAILED' } });
    // pay failed twice, then its third try succeeded; hold failed all three and is FAILED.
    expect(Object.fromEntries(tries)).toEqual({ pay: 3, hold: 3 });
    const ops = await db.pool.query(
      'select name, compensation_status, compensation_error from runledger.operations where run_id = $1 order by seq',
      [handle.runId],
    );
    expect(ops.rows.map((o) => [o.name, o.compensation_status])).toEqual([
      ['hold', 'FAILED'],
      ['pay', 'DONE'],
    ]);
    expect(ops.rows[0].compensation_error).toMatchObject({ message: 'hold refund service down (try 3)', attempts: 3 });
    expect((await runRow(handle.runId)).error.compensationFailures).toEqual([
      { operation: 'hold', error: expect.objectContaining({ message: 'hold refund service down (try 3)', attempts: 3 }) },
    ]);
  });

  it('cancelling a run compensates what it already did', async () => {
    const wf = t.engine.workflow({ name: 'cancel-saga', queue: 'cancel-saga' }, async (ctx) => {
      await ctx.operation(
        'book',
        {
          idempotencyKey: `book-${ctx.runId}`,
          compensate: ({ idempotencyKey }) => fetch(`${service.url}/cancel?key=${idempotencyKey}`, { method: 'POST' }),
        },
        ({ idempotencyKey }) => fetch(`${service.url}/tickets?key=${idempotencyKey}`, { method: 'POST' }).then((r) => r.json()),
      );
      await ctx.waitForSignal('confirm');
      return 'confirmed';
    });
    await inProcessWorker(t.engine, ['cancel-saga']);
    const handle = await t.engine.start(wf, undefined);
    await waitFor('waiting', async () => (await runRow(handle.runId)).status === 'WAITING');
    // It booked something: cancelling it needs a worker to undo that, so it is CANCELLING first.
    await expect(t.engine.cancel(handle.runId, { reason: 'changed my mind' })).resolves.toBe('CANCELLING');
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'CANCELLED' } });
    expect(service.cancellations.get(`book-${handle.runId}:compensate`)).toBe(1);
    expect(service.calls.get(`book-${handle.runId}`)).toBe(1); // the booking itself was not repeated
    const op = await operation(handle.runId);
    expect(op).toMatchObject({ name: 'book', status: 'SUCCEEDED', compensation_status: 'DONE' });
    expect((await runRow(handle.runId)).termination_evidence).toMatchObject({ reason: 'changed my mind' });
  });
});
