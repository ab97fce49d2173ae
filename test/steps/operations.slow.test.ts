import { sql } from 'kysely';
import { afterEach, describe, expect, it } from 'vitest';
import { NonRetryableError, type Engine, type Worker } from '../../src/index.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { z } from 'zod';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';
import { TicketService } from '../helpers/ticket-service.js';
import { runCli } from '../helpers/cli.js';
import { createRefundTables, defineRefundWorkflow } from '../../examples/refund-workflow.js';
import { ACTIONS } from '../../src/console/actions.js';
import { NO_CODEC } from '../../src/engine/core/payloads.js';

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
  service.reject(false);
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
async function crashAfterTheCall(mode: 'reconcile' | 'idempotent' | 'manual' | 'raw-reconcile' | 'null-reconcile') {
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

  it("a result schema checks an operator's result: from psql a mismatch fails the run INVALID_INPUT naming the operation at replay; engine.resolveOperation refuses it before writing", async () => {
    const clock = createTestClock('2032-01-01T00:00:00Z');
    const engines: Engine[] = [];
    const define = (crashAt?: { step: string; when: 'after-call' }) => {
      const engine = createTestEngine({ connectionString: db.url, clock, ...(crashAt ? { crashAt } : {}) });
      engines.push(engine);
      const flow = engine.workflow({ name: 'op-result-schema', queue: 'op-result-schema' }, async (ctx) => {
        const booked = await ctx.operation('book', { result: z.object({ ticket: z.string() }) }, async () => ({ ticket: 'T-1' }));
        return booked.ticket;
      });
      return { engine, flow };
    };
    // The call returns, its worker dies before recording it: the outcome is UNKNOWN.
    const unknown = async () => {
      const { engine, flow } = define({ step: 'book', when: 'after-call' });
      const handle = await engine.start(flow, undefined);
      await (await engine.runWorker({ manual: true, leaseMs: 30_000 })).drain();
      clock.advance('31s');
      await (await engine.runWorker({ manual: true, leaseMs: 30_000 })).drain();
      const op = (await db.pool.query('select operation_id, status from runledger.operations where run_id = $1', [handle.runId])).rows[0];
      expect(op.status).toBe('UNKNOWN');
      return { engine, runId: handle.runId, operationId: op.operation_id as string };
    };
    try {
      const { engine } = define();
      const worker = await engine.runWorker({ manual: true, leaseMs: 30_000 });

      const bad = await unknown();
      await db.pool.query(`select runledger.resolve_operation($1, 'SUCCEEDED', '{"ticket": 7}'::jsonb)`, [bad.operationId]);
      await worker.drain();
      const failed = await engine.getRun(bad.runId);
      expect(failed?.status).toBe('FAILED');
      expect(failed?.error).toMatchObject({ code: 'INVALID_INPUT', message: expect.stringMatching(/operation "book".*ticket/) });

      const good = await unknown();
      await db.pool.query(`select runledger.resolve_operation($1, 'SUCCEEDED', '{"ticket": "T-9"}'::jsonb)`, [good.operationId]);
      await worker.drain();
      expect(await engine.getRun(good.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'T-9' });

      // The engine whose worker ran the operation knows its schema: a mismatch is refused, nothing is written.
      const checked = await unknown();
      await expect(
        checked.engine.resolveOperation(checked.operationId, { status: 'SUCCEEDED', result: { ticket: 7 } }),
      ).rejects.toMatchObject({
        code: 'INVALID_INPUT',
        message: expect.stringMatching(/operation "book".*ticket/),
      });
      expect(
        (await db.pool.query('select status from runledger.operations where operation_id = $1', [checked.operationId])).rows[0].status,
      ).toBe('UNKNOWN');
      await expect(checked.engine.resolveOperation(checked.operationId, { status: 'SUCCEEDED', result: { ticket: 'T-3' } })).resolves.toBe(
        'SUCCEEDED',
      );
      await worker.drain();
      expect(await engine.getRun(checked.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'T-3' });
    } finally {
      for (const engine of engines) await engine.close();
    }
  });

  it.each(['raw-reconcile', 'null-reconcile'] as const)(
    '%s: a reconcile answering none of the three shapes fails the step with INVALID_RECONCILE_ANSWER; the operation stays UNKNOWN',
    async (mode) => {
      const { handle, key } = await crashAfterTheCall(mode);
      await processWorker();
      const failed = await handle.result({ timeoutMs: 15_000 }).then(
        () => undefined,
        (error: unknown) => error as { details: { status: string; error: { message: string } } },
      );
      expect(failed?.details.status).toBe('FAILED');
      expect(failed?.details.error.message).toContain(
        "it must answer { status: 'succeeded', result }, { status: 'failed', error? } or { status: 'unknown' }",
      );
      const step = (await t.engine.getRun(handle.runId))?.steps?.find((s) => s.name === 'create-ticket');
      expect(step).toMatchObject({ status: 'FAILED', error: { name: 'InvalidReconcileAnswerError', code: 'INVALID_RECONCILE_ANSWER' } });
      expect(await operation(handle.runId)).toMatchObject({ status: 'UNKNOWN', idempotency_key: key });
      const [invalid] = await events(handle.runId, 'operation_reconcile_invalid');
      expect(invalid).toMatchObject({ name: 'create-ticket', error: { code: 'INVALID_RECONCILE_ANSWER' } });
      expect(invalid.error.message).toContain(mode === 'null-reconcile' ? 'answered null' : 'answered {"id":');
      expect(await events(handle.runId, 'waiting_for_reconcile')).toEqual([]);
      expect(await events(handle.runId, 'attempt_failed')).toEqual([]);
      expect(service.calls.get(key)).toBe(1); // never called again on a guess
    },
  );

  it('an operation an operator resolved FAILED throws a StepFailedError with the recorded name, message and code', async () => {
    const { handle, key } = await crashAfterTheCall('manual');
    await processWorker();
    await waitFor('waiting for an operator', async () => (await runRow(handle.runId)).wait_kind === 'reconcile');
    const { operation_id } = await operation(handle.runId);
    await db.pool.query(`select runledger.resolve_operation($1, 'FAILED', $2::jsonb)`, [
      operation_id,
      JSON.stringify({ name: 'TicketLost', message: 'no such ticket at the service', code: 'TICKET_LOST' }),
    ]);
    await expect(handle.result({ timeoutMs: 30_000 })).rejects.toMatchObject({
      details: {
        status: 'FAILED',
        error: { name: 'StepFailedError', code: 'STEP_FAILED', message: 'step "create-ticket" failed: no such ticket at the service' },
      },
    });
    const step = (await t.engine.getRun(handle.runId))?.steps?.find((s) => s.name === 'create-ticket');
    expect(step?.error).toEqual({ name: 'TicketLost', message: 'no such ticket at the service', code: 'TICKET_LOST' });
    expect(service.calls.get(key)).toBe(1);
  });

  it("resolve_operation is refused (INVALID_STATE) while the worker's call is in flight; the worker records the outcome once", async () => {
    const wf = t.engine.workflow({ name: 'in-flight', queue: 'in-flight' }, async (ctx) =>
      ctx.operation('book', { idempotencyKey: `in-flight-${ctx.runId}` }, async ({ idempotencyKey }) => {
        const res = await fetch(`${service.url}/tickets?key=${idempotencyKey}`, { method: 'POST' });
        return (await res.json()) as { id: string };
      }),
    );
    await inProcessWorker(t.engine, ['in-flight']);
    service.holdReplies(true); // the service acts and holds its answer: the call is in flight
    const handle = await t.engine.start(wf, undefined);
    await waitFor('the call reached the service', async () => service.calls.get(`in-flight-${handle.runId}`) === 1);
    const started = await operation(handle.runId);
    expect(started.status).toBe('STARTED');
    expect((await runRow(handle.runId)).status).toBe('RUNNING');

    await expect(
      t.engine.resolveOperation(started.operation_id, { status: 'FAILED', result: { message: 'gave up on it' } }),
    ).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringMatching(/its call may still be in flight.*Wait.*cancel the run/),
    });
    await expect(db.pool.query(`select runledger.resolve_operation($1, 'SUCCEEDED', '{}')`, [started.operation_id])).rejects.toMatchObject({
      code: 'RL005',
    });
    expect(await operation(handle.runId)).toMatchObject({ status: 'STARTED', resolved_by: null });

    service.holdReplies(false);
    const ticket = await handle.result();
    expect(ticket).toEqual({ id: service.tickets.get(`in-flight-${handle.runId}`) });
    expect(await operation(handle.runId)).toMatchObject({ status: 'SUCCEEDED', resolved_by: null, result: ticket });
    expect(await events(handle.runId, 'operation_resolved')).toEqual([]);
    const audit = await db.pool.query(`select count(*)::int as n from runledger.audit_log where target = $1`, [started.operation_id]);
    expect(audit.rows[0].n).toBe(0); // a refused action leaves no record
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

describe('retry_run of a run that failed in an operation', () => {
  class TicketRejectedError extends Error {
    override name = 'TicketRejectedError';
    readonly code = 'TICKET_REJECTED';
    readonly nonRetryable = true;
  }
  const ticketOnce = (name: string) =>
    t.engine.workflow({ name, queue: 'tickets-once' }, async (ctx) => {
      const ticket = await ctx.operation<{ id: string }>(
        'create-ticket',
        { idempotencyKey: `once-${ctx.runId}` },
        async ({ idempotencyKey }) => {
          const res = await fetch(`${service.url}/tickets?key=${idempotencyKey}`, { method: 'POST' });
          if (!res.ok) throw new TicketRejectedError(`the service refused the ticket (${res.status})`);
          return (await res.json()) as { id: string };
        },
      );
      return { ticket };
    });

  it('calls the failed operation again with the same key, and the run succeeds when the service does', async () => {
    const wf = ticketOnce(`ticket-once-${Math.random().toString(36).slice(2)}`);
    await inProcessWorker(t.engine, ['tickets-once']);
    service.reject(true);
    const handle = await t.engine.start(wf, undefined);
    const key = `once-${handle.runId}`;
    await expect(handle.result()).rejects.toMatchObject({
      details: { status: 'FAILED', error: { name: 'StepFailedError', code: 'STEP_FAILED' } },
    });
    expect(service.calls.get(key)).toBe(1);
    const before = await operation(handle.runId);
    expect(before).toMatchObject({ status: 'FAILED', attempts: 1, error: { name: 'TicketRejectedError', code: 'TICKET_REJECTED' } });

    service.reject(false);
    await expect(db.pool.query('select runledger.retry_run($1) as status', [handle.runId])).resolves.toMatchObject({
      rows: [{ status: 'PENDING' }],
    });
    const result = await handle.result();
    expect(result).toEqual({ ticket: { id: service.tickets.get(key) } });
    expect(service.calls.get(key)).toBe(2);
    expect(await operation(handle.runId)).toMatchObject({
      operation_id: before.operation_id,
      idempotency_key: key,
      status: 'SUCCEEDED',
      attempts: 1,
      error: null,
    });
    const [retried] = await events(handle.runId, 'retried');
    expect(retried.reset_operation).toMatchObject({
      operation_id: before.operation_id,
      name: 'create-ticket',
      idempotency_key: key,
      attempts: 1,
      error: { name: 'TicketRejectedError', code: 'TICKET_REJECTED' },
    });
  });

  it('a run that fails again after retry_run throws the new failure as a StepFailedError with its name and code', async () => {
    const wf = ticketOnce(`ticket-once-${Math.random().toString(36).slice(2)}`);
    await inProcessWorker(t.engine, ['tickets-once']);
    service.reject(true);
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    await db.pool.query('select runledger.retry_run($1)', [handle.runId]);
    const failed = await handle.result().then(
      () => undefined,
      (error: unknown) => error as { details: { status: string; error: Record<string, unknown> } },
    );
    expect(failed?.details).toMatchObject({
      status: 'FAILED',
      error: { name: 'StepFailedError', code: 'STEP_FAILED', message: 'step "create-ticket" failed: the service refused the ticket (422)' },
    });
    expect(service.calls.get(`once-${handle.runId}`)).toBe(2);
    const step = (await t.engine.getRun(handle.runId))?.steps?.find((s) => s.name === 'create-ticket');
    expect(step?.error).toMatchObject({ name: 'TicketRejectedError', code: 'TICKET_REJECTED' });
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
    // No timeout of its own: the caller of the engine whose execution still hangs hears the
    // run's end from the database (it once waited for that execution, forever).
    await expect(handle.result()).resolves.toEqual({ resumedFrom: 3 });
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

describe('forks and idempotency keys', () => {
  const book = (key: string) =>
    fetch(`${service.url}/tickets?key=${key}`, { method: 'POST' }).then((r) => r.json() as Promise<{ id: string }>);
  const ledger = async (key: string) =>
    (await db.pool.query('select * from runledger.operations where idempotency_key = $1 order by started_at, operation_id', [key])).rows;

  it('a fork from step 0 reuses the result its source recorded under a business key: the service is not called again', async () => {
    const wf = t.engine.workflow({ name: 'fork-order', queue: 'fork-order' }, async (ctx, input: { orderId: string }) =>
      ctx.operation('book', { idempotencyKey: `order-${input.orderId}` }, ({ idempotencyKey }) => book(idempotencyKey)),
    );
    await inProcessWorker(t.engine, ['fork-order']);
    const source = await t.engine.start(wf, { orderId: 'o-41' });
    const ticket = await source.result();
    const fork = await t.engine.fork(source.runId, { fromStep: 0, workflow: wf });
    await expect(fork.result({ timeoutMs: 20_000 })).resolves.toEqual(ticket);
    expect(service.calls.get('order-o-41')).toBe(1);
    const [original, reused] = await ledger('order-o-41');
    expect(original).toMatchObject({ run_id: source.runId, status: 'SUCCEEDED', prior_operation_id: null });
    expect(reused).toMatchObject({
      run_id: fork.runId,
      status: 'SUCCEEDED',
      result: ticket,
      attempts: 0,
      prior_operation_id: original.operation_id,
    });
    expect(await events(fork.runId, 'operation_reused')).toEqual([
      expect.objectContaining({ operation_id: reused.operation_id, from_operation_id: original.operation_id, from_run_id: source.runId }),
    ]);
    expect((await runRow(fork.runId)).recovery_attempts).toBe(0);
  });

  it('a fork whose key derives from ctx.runId calls the service once more, with its own key', async () => {
    const wf = t.engine.workflow({ name: 'fork-run-key', queue: 'fork-run-key' }, async (ctx) =>
      ctx.operation('book', { idempotencyKey: `ticket-${ctx.runId}` }, ({ idempotencyKey }) => book(idempotencyKey)),
    );
    await inProcessWorker(t.engine, ['fork-run-key']);
    const source = await t.engine.start(wf, undefined);
    const ticket = await source.result();
    const fork = await t.engine.fork(source.runId, { fromStep: 0, workflow: wf });
    const forked = await fork.result({ timeoutMs: 20_000 });
    expect(forked.id).not.toBe(ticket.id);
    expect(service.calls.get(`ticket-${source.runId}`)).toBe(1);
    expect(service.calls.get(`ticket-${fork.runId}`)).toBe(1);
    expect(await operation(fork.runId)).toMatchObject({ idempotency_key: `ticket-${fork.runId}`, prior_operation_id: null, attempts: 1 });
  });

  it('a fork of a run whose operation failed makes a new attempt under the same key, and both ledgers show it', async () => {
    let down = true;
    const wf = t.engine.workflow({ name: 'fork-failed-op', queue: 'fork-failed-op' }, async (ctx, input: { orderId: string }) =>
      ctx.operation('book', { idempotencyKey: `order-${input.orderId}` }, ({ idempotencyKey }) => {
        if (down) throw new NonRetryableError('helpdesk down');
        return book(idempotencyKey);
      }),
    );
    await inProcessWorker(t.engine, ['fork-failed-op']);
    const source = await t.engine.start(wf, { orderId: 'o-42' });
    await expect(source.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    down = false;
    const fork = await t.engine.fork(source.runId, { fromStep: 0, workflow: wf });
    const forked = await fork.result({ timeoutMs: 20_000 });
    expect(forked).toEqual({ id: service.tickets.get('order-o-42') });
    expect(service.calls.get('order-o-42')).toBe(1);
    const [original, attempt] = await ledger('order-o-42');
    expect(original).toMatchObject({ run_id: source.runId, status: 'FAILED' });
    expect(attempt).toMatchObject({ run_id: fork.runId, status: 'SUCCEEDED', attempts: 1, prior_operation_id: original.operation_id });
    expect(await events(source.runId, 'operation_attempted_by_fork')).toEqual([
      expect.objectContaining({ operation_id: original.operation_id, fork: fork.runId, fork_operation_id: attempt.operation_id }),
    ]);
  });

  it('ctx.lineageId is the same in a run, its forks and their forks: a payout keyed by it is made once; a key from ctx.runId is warned of at fork time (SQL NOTICE, CLI, console, engine log)', async () => {
    const seen = new Map<string, string>();
    const payout = t.engine.workflow({ name: 'lineage-payout', queue: 'lineage' }, async (ctx, input: { amount: number }) => {
      seen.set(ctx.runId, ctx.lineageId);
      const paid = await ctx.operation('pay', { idempotencyKey: `payout-${ctx.lineageId}` }, ({ idempotencyKey }) => book(idempotencyKey));
      await ctx.step('notify', () => input.amount);
      return paid;
    });
    const runKeyed = t.engine.workflow({ name: 'run-keyed-payout', queue: 'lineage' }, async (ctx) =>
      ctx.operation('pay', { idempotencyKey: `payout-${ctx.runId}` }, ({ idempotencyKey }) => book(idempotencyKey)),
    );
    await inProcessWorker(t.engine, ['lineage']);
    const source = await t.engine.start(payout, { amount: 5 });
    const paid = await source.result();
    expect(seen.get(source.runId)).toBe(source.runId); // never forked: its own id
    const fork = await t.engine.fork(source.runId, { fromStep: 0, workflow: payout });
    await expect(fork.result({ timeoutMs: 20_000 })).resolves.toEqual(paid);
    const forkOfFork = await t.engine.fork(fork.runId, { fromStep: 1, workflow: payout });
    await expect(forkOfFork.result({ timeoutMs: 20_000 })).resolves.toEqual(paid);
    expect(seen.get(fork.runId)).toBe(source.runId);
    expect(seen.get(forkOfFork.runId)).toBe(source.runId);
    expect(service.calls.get(`payout-${source.runId}`)).toBe(1); // one payout across the lineage
    expect([...service.calls.keys()].filter((key) => key.startsWith('payout-'))).toEqual([`payout-${source.runId}`]);
    const lineage = await db.pool.query('select run_id, lineage_id from runledger.runs where run_id = any($1) order by created_at', [
      [source.runId, fork.runId, forkOfFork.runId],
    ]);
    expect(lineage.rows).toEqual([
      { run_id: source.runId, lineage_id: null },
      { run_id: fork.runId, lineage_id: source.runId },
      { run_id: forkOfFork.runId, lineage_id: source.runId },
    ]);

    // The same payout keyed by ctx.runId: every fork from before it pays again, and says so when it is made.
    const warned = await t.engine.start(runKeyed, undefined);
    await warned.result();
    const warning = `runs again operations of run ${warned.runId} whose idempotency keys hold that run's id: pay (step 0, key payout-${warned.runId})`;
    const notices: string[] = [];
    const client = await db.pool.connect();
    try {
      client.on('notice', (notice) => notices.push(notice.message ?? ''));
      const sqlFork = (await client.query('select runledger.fork_run($1, 0) as id', [warned.runId])).rows[0].id;
      expect(notices).toEqual([expect.stringContaining(`fork_run: the fork ${sqlFork} ${warning}`)]);
    } finally {
      client.removeAllListeners('notice');
      client.release();
    }
    const cli = await runCli(db.url, ['fork', warned.runId, '--from', '0']);
    expect(cli.code).toBe(0);
    expect(cli.stdout).toMatch(/^[0-9A-HJKMNP-TV-Z]{26}\n$/); // still only the new id, for NEW=$(runledger fork ...)
    expect(cli.stderr).toContain(`warning: the fork ${cli.stdout.trim()} ${warning}`);
    const said = await ACTIONS.fork!.run(db.pool, { run_id: warned.runId, from_step: '0' }, NO_CODEC);
    expect(said).toContain(`Warning: the fork `);
    expect(said).toContain(warning);
    const lines: string[] = [];
    const logged = t.newEngine({ log: (level, message) => void (level === 'warn' && lines.push(message)) });
    await logged.fork(warned.runId, { fromStep: 0 });
    expect(lines).toEqual([expect.stringContaining(warning)]);
    // From past the operation nothing is run again: no warning.
    await logged.fork(warned.runId, { fromStep: 1 });
    expect(lines).toHaveLength(1);
    // The lineage key's source was never forked: its key holds the run id too, and the notice says why.
    const lineageNotice = `run ${source.runId} was never forked: its lineage id is its run id, so a key made from ctx.lineageId is listed too`;
    const asked = await runCli(db.url, ['fork', source.runId, '--from', '0']);
    expect(asked.stderr).toContain(lineageNotice);
    const fromFork = await runCli(db.url, ['fork', fork.runId, '--from', '0']);
    expect(fromFork.stderr).toBe(''); // the fork's key holds its lineage id, not its own run id
  });

  it("the refund example forked from step 2 (its provider call) pays once, and records the refund's ledger once", async () => {
    await createRefundTables(db.pool);
    await db.pool.query(`insert into shop.orders (order_id, customer_email, total_cents) values ('o-fork', 'ana@example.com', 3000)`);
    const refund = defineRefundWorkflow(t.engine);
    await inProcessWorker(t.engine, ['default']);
    const source = await t.engine.start(refund, { orderId: 'o-fork', amountCents: 1200 });
    const paid = await source.result({ timeoutMs: 20_000 });
    const steps = await db.pool.query('select seq, name from runledger.steps where run_id = $1 order by seq', [source.runId]);
    expect(steps.rows.map((r) => r.name)).toEqual([
      'load-order',
      'reserve-refund',
      'refund-at-provider',
      'record-ledger',
      'notify-customer',
    ]);
    const fork = await t.engine.fork(source.runId, { fromStep: 2, workflow: refund });
    await expect(fork.result({ timeoutMs: 20_000 })).resolves.toEqual(paid); // the same refund, the same provider id
    const provider = await db.pool.query('select idempotency_key, calls from payment_provider.refunds');
    expect(provider.rows).toEqual([{ idempotency_key: `refund-${source.runId}`, calls: 1 }]); // one payout
    const ledger = await db.pool.query('select refund_id, account from shop.ledger_entries order by entry_id');
    expect(ledger.rows).toEqual([
      { refund_id: source.runId, account: 'sales-returns' },
      { refund_id: source.runId, account: 'cash-at-provider' },
    ]);
    const order = await db.pool.query(`select refunded_cents from shop.orders where order_id = 'o-fork'`);
    expect(order.rows).toEqual([{ refunded_cents: 1200 }]);
    // From step 0 too: the reservation is found, not made again.
    const again = await t.engine.fork(source.runId, { fromStep: 0, workflow: refund });
    await expect(again.result({ timeoutMs: 20_000 })).resolves.toEqual(paid);
    expect((await db.pool.query(`select refunded_cents from shop.orders where order_id = 'o-fork'`)).rows).toEqual([
      { refunded_cents: 1200 },
    ]);
    expect((await db.pool.query('select calls from payment_provider.refunds')).rows).toEqual([{ calls: 1 }]);
  });

  it('a key another run already used is a constraint error: the run fails with CONSTRAINT_VIOLATION in its events, no release loop', async () => {
    const wf = t.engine.workflow({ name: 'same-key', queue: 'same-key' }, async (ctx, input: { orderId: string }) =>
      ctx.operation('book', { idempotencyKey: `order-${input.orderId}` }, ({ idempotencyKey }) => book(idempotencyKey)),
    );
    await inProcessWorker(t.engine, ['same-key']);
    await (await t.engine.start(wf, { orderId: 'o-43' })).result();
    const second = await t.engine.start(wf, { orderId: 'o-43' });
    await expect(second.result({ timeoutMs: 20_000 })).rejects.toMatchObject({ details: { status: 'FAILED' } });
    const run = await runRow(second.runId);
    expect(run).toMatchObject({ recovery_attempts: 0, termination_reason: 'FAILED' });
    expect(run.error).toMatchObject({ code: 'CONSTRAINT_VIOLATION', sqlstate: '23505', step: 'book' });
    expect(await events(second.runId, 'failed')).toEqual([
      expect.objectContaining({ error: expect.objectContaining({ code: 'CONSTRAINT_VIOLATION' }) }),
    ]);
    expect(await events(second.runId, 'released')).toEqual([]);
    expect(service.calls.get('order-o-43')).toBe(1);
  });
});

describe('a key another run holds', () => {
  it('met after a human approved: the run fails CONSTRAINT_VIOLATION naming the key and the run and operation that hold it', async () => {
    const wf = t.engine.workflow({ name: 'approved-refund', queue: 'key-held' }, async (ctx, input: { orderId: string }) => {
      const decision = await ctx.requestApproval('manager', { action: 'refund', evidence: input, approvers: ['maria'] });
      if (!decision?.approved) return 'rejected';
      return ctx.operation('refund', { idempotencyKey: `refund-${input.orderId}` }, async ({ idempotencyKey }) => {
        const res = await fetch(`${service.url}/tickets?key=${idempotencyKey}`, { method: 'POST' });
        return (await res.json()) as { id: string };
      });
    });
    await inProcessWorker(t.engine, ['key-held']);
    const approve = async (runId: string) => {
      await waitFor('approval requested', async () => (await runRow(runId)).wait_kind === 'approval');
      const request = await db.pool.query(`select request_id from runledger.approvals where run_id = $1`, [runId]);
      await t.engine.decideApproval(request.rows[0].request_id, { approved: true, decidedBy: 'maria' });
    };
    const first = await t.engine.start(wf, { orderId: 'o-44' });
    await approve(first.runId);
    await first.result();
    const held = await operation(first.runId);

    const second = await t.engine.start(wf, { orderId: 'o-44' }); // an unrelated run, the same business key
    await approve(second.runId);
    await expect(second.result({ timeoutMs: 20_000 })).rejects.toMatchObject({ details: { status: 'FAILED' } });
    const run = await runRow(second.runId);
    expect(run).toMatchObject({ recovery_attempts: 0, termination_reason: 'FAILED' });
    expect(run.error).toMatchObject({
      code: 'CONSTRAINT_VIOLATION',
      sqlstate: '23505',
      constraint: 'operations_idempotency_key',
      step: 'refund',
      idempotencyKey: 'refund-o-44',
      heldByRunId: first.runId,
      heldByOperationId: held.operation_id,
      message: expect.stringContaining(
        `operation "refund": idempotency key "refund-o-44" is already used by operation ${held.operation_id} ("refund", SUCCEEDED) of run ${first.runId} (workflow approved-refund, SUCCEEDED)`,
      ),
    });
    expect(run.error.message).not.toContain('duplicate key value');
    expect(await events(second.runId, 'released')).toEqual([]);
    expect(service.calls.get('refund-o-44')).toBe(1); // the second run never called the service
  });
});

describe('constraint errors from a step', () => {
  it('a deferred constraint broken at a ctx.transaction commit fails the run with CONSTRAINT_VIOLATION, no release loop', async () => {
    await db.pool.query('create table deferred_keys (k text unique deferrable initially deferred)');
    const wf = t.engine.workflow({ name: 'deferred-key', queue: 'deferred-key' }, async (ctx) => {
      await ctx.transaction('write-twice', async (trx) => {
        await sql`insert into deferred_keys (k) values ('x'), ('x')`.execute(trx);
      });
      return 'written';
    });
    await inProcessWorker(t.engine, ['deferred-key']);
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result({ timeoutMs: 20_000 })).rejects.toMatchObject({ details: { status: 'FAILED' } });
    const run = await runRow(handle.runId);
    expect(run).toMatchObject({ recovery_attempts: 0 });
    expect(run.error).toMatchObject({ code: 'CONSTRAINT_VIOLATION', sqlstate: '23505', step: 'write-twice' });
    expect(await events(handle.runId, 'released')).toEqual([]);
    expect((await db.pool.query('select count(*)::int as n from deferred_keys')).rows[0].n).toBe(0);
  });
});
