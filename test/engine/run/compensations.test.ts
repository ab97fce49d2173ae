/**
 * Compensations on every path a run's work is cut short: a policy stop with or without a
 * worker, a crash between the stop and the end of its compensations, and compensate_run,
 * the operator's way to undo a finished run's effects or to try a failed compensation again.
 */
import { afterEach, describe, expect, it } from 'vitest';
import { NonRetryableError, type Worker } from '../../../src/index.js';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { TicketService } from '../../helpers/ticket-service.js';
import { sessionHelpers, setNow } from '../../helpers/session.js';

let service: TicketService;
const t = useTestEngine({
  fixtures: true,
  prepare: async () => {
    service = await TicketService.start();
    return () => service.stop();
  },
});
const { db } = t;
const { session } = sessionHelpers(db);
const { processes: spawned, workers } = stoppedAfterEach();

afterEach(() => service.reject(false));

async function worker(queue: string): Promise<Worker> {
  const w = await t.engine.runWorker({ queues: [queue], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 100 });
  workers.push(w);
  return w;
}

async function processWorker(env: Record<string, string> = {}): Promise<WorkerProcess> {
  const w = await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '1000', CONCURRENCY: '2', ...env });
  spawned.push(w);
  return w;
}

const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const eventKinds = async (runId: string) =>
  (await db.pool.query('select kind from runledger.events where run_id = $1 order by event_id', [runId])).rows.map((r) => r.kind);
const compensationStatus = async (runId: string) =>
  (await db.pool.query('select name, compensation_status from runledger.operations where run_id = $1 order by seq', [runId])).rows.map(
    (o) => [o.name, o.compensation_status],
  );

describe('a policy stop runs the compensations first', () => {
  it('a run the deadline sweep ends while WAITING is handed to the next claim, compensated, then TERMINATED (DEADLINE)', async () => {
    const undone: string[] = [];
    const wf = t.engine.workflow({ name: 'booking-with-deadline', queue: 'comp-deadline', limits: { deadline: '1d' } }, async (ctx) => {
      await ctx.operation(
        'book',
        { idempotencyKey: `book-${ctx.runId}`, compensate: ({ idempotencyKey }) => void undone.push(idempotencyKey) },
        async () => 'booked',
      );
      await ctx.waitForSignal('confirmation'); // only the deadline ends this wait
      return 'confirmed';
    });
    const first = await worker('comp-deadline');
    const handle = await t.engine.start(wf, undefined);
    await waitFor('waiting', async () => (await runRow(handle.runId)).status === 'WAITING');
    await first.stop(); // no worker holds or serves the run when the deadline passes

    const waiting = await runRow(handle.runId);
    const swept = await session(async (c) => {
      await setNow(c, new Date(waiting.deadline_at.getTime() + 60_000).toISOString());
      return Number((await c.query('select runledger._enforce_deadlines() as n')).rows[0].n);
    });
    expect(swept).toBe(1);
    // Stopping, not ended yet: no owner, the TERMINATED record set aside until the compensations have run.
    const stopping = await runRow(handle.runId);
    expect(stopping).toMatchObject({ status: 'CANCELLING', lease_owner: null, finished_at: null, termination_reason: null });
    expect(stopping.stop_record).toMatchObject({ status: 'TERMINATED', reason: 'DEADLINE', was: 'WAITING' });
    expect(undone).toEqual([]);

    await worker('comp-deadline');
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'TERMINATED', terminationReason: 'DEADLINE' } });
    expect(undone).toEqual([`book-${handle.runId}:compensate`]);
    const ended = await runRow(handle.runId);
    expect(ended.stop_record).toBeNull();
    expect(ended.termination_evidence).toMatchObject({
      deadline_at: expect.any(String),
      compensations: { done: 1, failed: [], not_run: [] },
    });
    expect(await compensationStatus(handle.runId)).toEqual([['book', 'DONE']]);
    const kinds = await eventKinds(handle.runId);
    expect(kinds.indexOf('compensations_due')).toBeLessThan(kinds.indexOf('compensated'));
    expect(kinds.indexOf('compensated')).toBeLessThan(kinds.indexOf('deadline'));
  });

  it('SIGKILL between a policy stop and the end of its compensations: the next worker runs the rest, none twice', async () => {
    const handle = await t.engine.start(t.fixtures.limitedSaga, { service: service.url });
    // The first worker stops the run at its step limit, undoes charge (newest first) and dies.
    const doomed = await processWorker({ RUNLEDGER_FAILPOINTS: 'after-compensation:charge' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    expect(service.cancellations.get(`charge-${handle.runId}:compensate`)).toBe(1);
    expect(service.cancellations.get(`reserve-${handle.runId}:compensate`)).toBeUndefined();
    const stopping = await runRow(handle.runId);
    expect(stopping.status).toBe('CANCELLING');
    expect(stopping.stop_record).toMatchObject({ status: 'TERMINATED', reason: 'MAX_STEPS' });

    await processWorker();
    await expect(handle.result({ timeoutMs: 30_000 })).rejects.toMatchObject({
      details: { status: 'TERMINATED', terminationReason: 'MAX_STEPS' },
    });
    expect(service.cancellations.get(`charge-${handle.runId}:compensate`)).toBe(1);
    expect(service.cancellations.get(`reserve-${handle.runId}:compensate`)).toBe(1);
    expect(service.calls.get(`reserve-${handle.runId}`)).toBe(1);
    expect(service.calls.get(`charge-${handle.runId}`)).toBe(1);
    expect(await compensationStatus(handle.runId)).toEqual([
      ['reserve', 'DONE'],
      ['charge', 'DONE'],
    ]);
    const ended = await runRow(handle.runId);
    expect(ended.termination_evidence).toMatchObject({ max_steps: 3, compensations: { done: 2, failed: [], not_run: [] } });
    // The steps after the limit never ran: the second worker only replayed and compensated.
    const legs = await db.pool.query(`select name from runledger.steps where run_id = $1 and name like 'leg-%' order by seq`, [
      handle.runId,
    ]);
    expect(legs.rows.map((r) => r.name)).toEqual(['leg-0']);
  });
});

describe('compensate_run', () => {
  it('tries a FAILED compensation again; the run ends FAILED again with its error, and the evidence says it is done', async () => {
    let refundsDown = true;
    let tries = 0;
    const wf = t.engine.workflow({ name: 'refund-saga', queue: 'comp-retry' }, async (ctx) => {
      await ctx.operation(
        'hold',
        {
          idempotencyKey: `hold-${ctx.runId}`,
          compensate: () => {
            tries++;
            if (refundsDown) throw new Error('refund service down');
          },
        },
        async () => 'held',
      );
      await ctx.step('ship', () => {
        throw new NonRetryableError('warehouse closed');
      });
      return 'shipped';
    });
    await worker('comp-retry');
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    expect(tries).toBe(3);
    expect(await compensationStatus(handle.runId)).toEqual([['hold', 'FAILED']]);
    const failed = await runRow(handle.runId);

    refundsDown = false;
    expect(await t.engine.compensate(handle.runId, { reason: 'refund service is back' })).toBe('CANCELLING');
    await waitFor('failed again', async () => (await runRow(handle.runId)).status === 'FAILED');
    expect(tries).toBe(4);
    expect(await compensationStatus(handle.runId)).toEqual([['hold', 'DONE']]);
    const again = await runRow(handle.runId);
    expect(again.error).toEqual(failed.error); // the failure that ended it, unchanged
    expect(again.termination_reason).toBe('FAILED');
    expect(again.termination_evidence).toEqual({ compensations: { done: 1, failed: [], not_run: [] } });
    const requested = await db.pool.query(`select detail from runledger.events where run_id = $1 and kind = 'compensation_requested'`, [
      handle.runId,
    ]);
    expect(requested.rows[0].detail).toMatchObject({
      reason: 'refund service is back',
      status: 'FAILED',
      retried: [{ name: 'hold', error: { message: 'refund service down', attempts: 3 } }],
    });
    // Done is done: asked again, there is nothing left to undo.
    expect(await t.engine.compensate(handle.runId)).toBe('FAILED');
    expect(tries).toBe(4);
  });

  it('a DEAD_LETTER run (NON_DETERMINISM) is not compensated by itself; compensate_run undoes what its replay reaches', async () => {
    const undone: string[] = [];
    let secondStep = 'pack';
    const wf = t.engine.workflow({ name: 'drifting-saga', queue: 'comp-drift' }, async (ctx) => {
      await ctx.operation(
        'book',
        { idempotencyKey: `book-${ctx.runId}`, compensate: ({ idempotencyKey }) => void undone.push(idempotencyKey) },
        async () => 'booked',
      );
      await ctx.step(secondStep, () => 'done');
      await ctx.waitForSignal('go');
      return 'finished';
    });
    await worker('comp-drift');
    const handle = await t.engine.start(wf, undefined);
    await waitFor('waiting', async () => (await runRow(handle.runId)).status === 'WAITING');
    secondStep = 'wrap'; // a deploy renamed the step: the history no longer matches the code
    await t.engine.signal(handle.runId, 'go', null);
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'DEAD_LETTER', terminationReason: 'NON_DETERMINISM' } });
    expect(undone).toEqual([]); // dead letter waits for an operator: retry after a fix, or compensate
    expect(await compensationStatus(handle.runId)).toEqual([['book', null]]);

    expect(await t.engine.compensate(handle.runId)).toBe('CANCELLING');
    await waitFor('dead letter again', async () => (await runRow(handle.runId)).status === 'DEAD_LETTER');
    expect(undone).toEqual([`book-${handle.runId}:compensate`]);
    const ended = await runRow(handle.runId);
    expect(ended.termination_reason).toBe('NON_DETERMINISM');
    expect(ended.termination_evidence).toMatchObject({ compensations: { done: 1, failed: [], not_run: [] } });
    // Its booking is undone: retry_run would replay that checkpoint and go on as if it stood.
    // Refused; the message says how to do the work again after a fix (a fork from step 0).
    await expect(t.engine.retry(handle.runId)).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining(`runledger fork ${handle.runId} --from 0`),
    });
    expect((await runRow(handle.runId)).status).toBe('DEAD_LETTER');
    // migrate_run would bring it back PENDING on its checkpoints: refused the same way, before anything else.
    await expect(db.pool.query(`select runledger.migrate_run($1, '2')`, [handle.runId])).rejects.toMatchObject({
      code: 'RL005',
      message: expect.stringContaining('migrate_run: run ' + handle.runId + ' has operations whose effects were undone'),
    });
  });

  it('refuses a SUCCEEDED or unfinished run (INVALID_STATE) and an unknown one (NOT_FOUND); with nothing to undo it returns the status', async () => {
    const done = t.engine.workflow({ name: 'plain', queue: 'comp-refuse' }, async (ctx) => {
      await ctx.operation('book', { compensate: () => undefined }, async () => 'booked');
      return 'ok';
    });
    const parked = t.engine.workflow({ name: 'parked', queue: 'comp-refuse' }, async (ctx) => ctx.waitForSignal('never'));
    await worker('comp-refuse');
    const succeeded = await t.engine.start(done, undefined);
    await succeeded.result();
    await expect(t.engine.compensate(succeeded.runId)).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining('its effects are not undone'),
    });
    const waiting = await t.engine.start(parked, undefined);
    await waitFor('waiting', async () => (await runRow(waiting.runId)).status === 'WAITING');
    await expect(t.engine.compensate(waiting.runId)).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining('cancel_run'),
    });
    await expect(t.engine.compensate('no-such-run')).rejects.toMatchObject({ code: 'NOT_FOUND' });
    expect(await t.engine.cancel(waiting.runId)).toBe('CANCELLED');
    expect(await t.engine.compensate(waiting.runId)).toBe('CANCELLED'); // it did nothing to undo
    expect((await runRow(waiting.runId)).status).toBe('CANCELLED');
    expect(await eventKinds(waiting.runId)).not.toContain('compensation_requested');
  });
});

describe('after compensations: retry_run, migrate_run and fork_run never go on from an undone effect', () => {
  /**
   * A payment provider's own ledger: what it did, in order. A charge under a key that holds a
   * charge not refunded is that charge (idempotent); once refunded, the key charges anew.
   */
  class PaymentProvider {
    readonly entries: Array<{ entry: 'charge' | 'refund' | 'ship'; charge: string }> = [];
    readonly #open = new Map<string, string>();
    charge(key: string): string {
      const open = this.#open.get(key);
      if (open) return open;
      const charge = `ch_${this.entries.filter((e) => e.entry === 'charge').length + 1}`;
      this.#open.set(key, charge);
      this.entries.push({ entry: 'charge', charge });
      return charge;
    }
    refund(key: string, charge: string): void {
      this.#open.delete(key);
      this.entries.push({ entry: 'refund', charge });
    }
    ship(charge: string): void {
      this.entries.push({ entry: 'ship', charge });
    }
    /** The shipments made against a charge that had been refunded before them. */
    shippedAfterRefund(): string[] {
      return this.entries
        .filter((e, i) => e.entry === 'ship' && this.entries.slice(0, i).some((r) => r.entry === 'refund' && r.charge === e.charge))
        .map((e) => e.charge);
    }
  }

  it('retry_run of a FAILED run whose charge was refunded is refused (INVALID_STATE, saying to fork); a fork from before the charge charges again, then ships', async () => {
    const provider = new PaymentProvider();
    let warehouseOpen = false;
    const wf = t.engine.workflow({ name: 'pay-then-ship', queue: 'comp-undone' }, async (ctx, input: { order: string }) => {
      const key = `charge-${input.order}`;
      const charge = await ctx.operation<string>(
        'charge',
        { idempotencyKey: key, compensate: ({ result }) => provider.refund(key, result) },
        async ({ idempotencyKey }) => provider.charge(idempotencyKey),
      );
      await ctx.step('ship', () => {
        if (!warehouseOpen) throw new NonRetryableError('warehouse closed');
        provider.ship(charge);
      });
      return charge;
    });
    await worker('comp-undone');
    const handle = await t.engine.start(wf, { order: 'o-7' });
    await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
    expect(provider.entries).toEqual([
      { entry: 'charge', charge: 'ch_1' },
      { entry: 'refund', charge: 'ch_1' },
    ]);

    warehouseOpen = true; // the fix: a retry would now ship
    await expect(t.engine.retry(handle.runId)).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining(
        `retry_run: run ${handle.runId} has operations whose effects were undone by compensations (charge at step 0: compensation DONE)`,
      ),
    });
    await expect(t.engine.retry(handle.runId)).rejects.toMatchObject({
      message: expect.stringContaining(`runledger fork ${handle.runId} --from 0`),
    });
    expect((await runRow(handle.runId)).status).toBe('FAILED');
    // A fork that would copy the charge's checkpoint is refused too.
    await expect(t.engine.fork(handle.runId, { fromStep: 1 })).rejects.toMatchObject({
      code: 'INVALID_STATE',
      message: expect.stringContaining(`fork_run: run ${handle.runId} has operations whose effects were undone`),
    });
    // Nothing went on from the refunded charge.
    expect(provider.shippedAfterRefund()).toEqual([]);
    expect(provider.entries).toHaveLength(2);

    // A fork from step 0 calls the charge again (a new attempt under its key), and ships on that charge.
    const fork = await t.engine.fork(handle.runId, { fromStep: 0, workflow: wf });
    await expect(fork.result({ timeoutMs: 20_000 })).resolves.toBe('ch_2');
    expect(provider.entries).toEqual([
      { entry: 'charge', charge: 'ch_1' },
      { entry: 'refund', charge: 'ch_1' },
      { entry: 'charge', charge: 'ch_2' },
      { entry: 'ship', charge: 'ch_2' },
    ]);
    expect(provider.shippedAfterRefund()).toEqual([]);
    const ledger = await db.pool.query(
      `select run_id, status, attempts, compensation_status, prior_operation_id, operation_id from runledger.operations
        where idempotency_key = 'charge-o-7' order by started_at`,
    );
    expect(ledger.rows).toEqual([
      expect.objectContaining({ run_id: handle.runId, status: 'SUCCEEDED', compensation_status: 'DONE', prior_operation_id: null }),
      expect.objectContaining({
        run_id: fork.runId,
        status: 'SUCCEEDED',
        attempts: 1,
        compensation_status: null,
        prior_operation_id: ledger.rows[0].operation_id,
      }),
    ]);
  });
});
