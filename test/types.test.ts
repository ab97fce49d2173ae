/**
 * The public types say what the runtime does. The expectTypeOf assertions are checked by
 * `npm run typecheck` (tsc compiles test/); the runtime half of each check runs here, so a
 * type and the value it describes are tested side by side.
 */
import { afterAll, beforeAll, describe, expect, expectTypeOf, it } from 'vitest';
import type { Kysely, Transaction } from 'kysely';
import { z } from 'zod';
import {
  ConfigError,
  createEngine,
  InvalidInputError,
  type Engine,
  type Jsonify,
  type OperationRecord,
  type OperationStatus,
  type RunHandle,
  type RunledgerDatabase,
  type Workflow,
  type WorkflowContext,
} from '../src/index.js';
import { createTestDatabase, waitFor, type TestDatabase } from './helpers/database.js';

interface AppDatabase {
  notes: { id: string; body: string };
}
type Db = AppDatabase & RunledgerDatabase;

class Money {
  constructor(
    readonly amount: number,
    readonly currency: string,
  ) {}
  add(other: Money): Money {
    return new Money(this.amount + other.amount, this.currency);
  }
}

let db: TestDatabase;
let engine: Engine<Db>;
let wfs: ReturnType<typeof defineWorkflows>;

const seen: unknown[] = [];
let calls = 0;

/** Workers run the workflows defined before runWorker: all of this file's are defined here. */
function defineWorkflows(engine: Engine<Db>) {
  const date = engine.workflow({ name: 'types-date', queue: 'types' }, async (ctx) => {
    const at = await ctx.step('at', () => {
      calls++;
      return new Date('2030-01-02T03:04:05Z');
    });
    expectTypeOf(at).toEqualTypeOf<string>();
    const money = await ctx.step('money', () => new Money(5, 'EUR'));
    expectTypeOf(money).toEqualTypeOf<{ amount: number; currency: string }>();
    seen.push({ at, money, hasAdd: 'add' in money });
    await ctx.waitForSignal('go'); // the run parks here; the signal resumes it in a new execution that replays both steps
    return { at, money };
  });
  const child = engine.workflow({ name: 'types-child', queue: 'types' }, async () => ({ born: new Date('2030-01-01T00:00:00Z') }));
  const parent = engine.workflow({ name: 'types-parent', queue: 'types' }, async (ctx) => {
    const fromTrx = await ctx.transaction('trx', async () => new Date('2030-01-01T00:00:00Z'));
    expectTypeOf(fromTrx).toEqualTypeOf<string>();
    const fromOp = await ctx.operation('op', {}, async () => ({
      at: new Date('2030-01-01T00:00:00Z'),
      note: undefined as string | undefined,
    }));
    expectTypeOf(fromOp).toEqualTypeOf<{ at: string; note?: string }>();
    const fromChild = await ctx.runChild(child, undefined);
    expectTypeOf(fromChild).toEqualTypeOf<{ born: string }>();
    const signal = await ctx.waitForSignal<{ at: Date }>('never', { timeout: 1 });
    expectTypeOf(signal).toEqualTypeOf<{ at: string } | null>();
    return [typeof fromTrx, typeof fromOp.at, 'note' in fromOp, typeof fromChild.born, signal];
  });
  const defaults = engine.workflow(
    { name: 'types-defaults', queue: 'types', input: z.object({ orderId: z.string(), retries: z.number().default(3) }) },
    async (_ctx, input) => {
      expectTypeOf(input).toEqualTypeOf<{ orderId: string; retries: number }>();
      return input.retries;
    },
  );
  // Type-checked only, never started.
  const typesOnly = engine.workflow({ name: 'types-only', queue: 'types' }, async (ctx) => {
    expectTypeOf(await ctx.waitForChild<{ born: Date }>('child-id')).toEqualTypeOf<{ born: string }>();
    // z.input: the defaulted field may be left out; orderId may not.
    expectTypeOf(await ctx.runChild(defaults, { orderId: 'o-2' })).toEqualTypeOf<number>();
    // @ts-expect-error orderId has no default: still required
    await ctx.runChild(defaults, { retries: 1 });
  });
  const defaultsParent = engine.workflow({ name: 'types-defaults-parent', queue: 'types' }, async (ctx) =>
    ctx.runChild(defaults, { orderId: 'o-2' }),
  );
  const trx = engine.workflow({ name: 'types-trx', queue: 'types' }, async (ctx, input: { id: string }) => {
    expectTypeOf(ctx).toEqualTypeOf<WorkflowContext<Db>>();
    return ctx.transaction('note', async (trx) => {
      expectTypeOf(trx).toEqualTypeOf<Transaction<Db>>();
      await trx.insertInto('notes').values({ id: input.id, body: 'hello' }).execute();
      const row = await trx.selectFrom('notes').select(['id', 'body']).where('id', '=', input.id).executeTakeFirstOrThrow();
      expectTypeOf(row).toEqualTypeOf<{ id: string; body: string }>();
      return row;
    });
  });
  const getRunWf = engine.workflow({ name: 'types-getrun', queue: 'types', limits: { budget: 100 } }, async (ctx) => {
    ctx.charge(2.5);
    return ctx.operation('ticket', { idempotencyKey: `ticket-${ctx.runId}` }, async () => 'T-1');
  });
  const fork = engine.workflow({ name: 'types-fork', queue: 'types' }, async (ctx) => ({
    at: await ctx.step('at', () => new Date('2030-01-01T00:00:00Z')),
  }));
  const forkOther = engine.workflow({ name: 'types-fork-other', queue: 'types' }, async () => 1);
  // Something in every table a client read returns: steps, the ledger, a stream, an artifact, an approval, budgets.
  const reads = engine.workflow({ name: 'types-reads', queue: 'types', limits: { budget: { tokens: 1_000 } } }, async (ctx) => {
    ctx.charge({ tokens: 10 });
    const step = await ctx.step('step', () => ({ at: new Date('2030-01-01T00:00:00Z'), n: 1 }));
    await ctx.operation('op', { idempotencyKey: `reads-${ctx.runId}` }, async () => ({ ticket: 'T-2' }));
    const out = ctx.stream('out');
    await out.write({ n: 1 });
    await out.close();
    const artifact = await ctx.artifact('report', 'the report');
    const decision = await ctx.requestApproval('ok', { action: 'ship', evidence: { n: 1 } });
    return { step, artifactId: artifact.artifactId, approved: decision?.approved ?? null };
  });
  return { date, child, parent, typesOnly, defaults, defaultsParent, trx, getRunWf, fork, forkOther, reads };
}

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query('create table notes (id text primary key, body text not null)');
  engine = createEngine<Db>({ connectionString: db.url, log: () => {} });
  wfs = defineWorkflows(engine);
  await engine.runWorker({ concurrency: 2, leaseMs: 2_000, pollIntervalMs: 50, queues: ['types'] });
});

afterAll(async () => {
  await engine?.close();
  await db?.drop();
});

describe('Jsonify: the type of a value after the JSON round trip', () => {
  it('maps dates, class instances, undefined, arrays, tuples, unions and optional properties', () => {
    expectTypeOf<Jsonify<Date>>().toEqualTypeOf<string>();
    expectTypeOf<Jsonify<Money>>().toEqualTypeOf<{ amount: number; currency: string }>();
    expectTypeOf<Jsonify<{ at: Date; n?: number; u: string | undefined; gone: undefined; f: () => void; s: symbol }>>().toEqualTypeOf<{
      at: string;
      n?: number;
      u?: string;
    }>();
    expectTypeOf<Jsonify<(string | undefined)[]>>().toEqualTypeOf<(string | null)[]>();
    expectTypeOf<Jsonify<readonly Date[]>>().toEqualTypeOf<string[]>();
    expectTypeOf<Jsonify<readonly [Date, number, undefined]>>().toEqualTypeOf<[string, number, null]>();
    expectTypeOf<Jsonify<Date | { at: Date } | null>>().toEqualTypeOf<string | { at: string } | null>();
    expectTypeOf<Jsonify<{ toJSON(): { v: number } }>>().toEqualTypeOf<{ v: number }>();
    expectTypeOf<Jsonify<Record<string, Date>>>().toEqualTypeOf<Record<string, string>>();
    expectTypeOf<Jsonify<'a' | 1 | true>>().toEqualTypeOf<'a' | 1 | true>();
    expectTypeOf<Jsonify<void>>().toEqualTypeOf<void>();
    expectTypeOf<Jsonify<unknown>>().toEqualTypeOf<unknown>();
    // Refused at run time (NOT_SERIALIZABLE), so nothing comes back.
    expectTypeOf<Jsonify<bigint>>().toBeNever();
    expectTypeOf<Jsonify<Map<string, number>>>().toBeNever();
    expectTypeOf<Jsonify<Set<string>>>().toBeNever();
  });
});

describe('ctx.step returns the JSON form of what its function produced', () => {
  it('a Date is a string on the first execution and on replay; a class instance keeps its fields, not its methods', async () => {
    const handle = await engine.start(wfs.date, undefined);
    expectTypeOf(handle).toEqualTypeOf<RunHandle<{ at: string; money: { amount: number; currency: string } }>>();
    await waitFor('the run to wait for its signal', async () => (await engine.getRun(handle.runId))?.status === 'WAITING');
    await engine.signal(handle.runId, 'go');
    const output = await handle.result({ timeoutMs: 30_000 });
    expect(output).toEqual({ at: '2030-01-02T03:04:05.000Z', money: { amount: 5, currency: 'EUR' } });
    const first = { at: '2030-01-02T03:04:05.000Z', money: { amount: 5, currency: 'EUR' }, hasAdd: false };
    expect(seen).toEqual([first, first]); // first execution, then the replay
    expect(calls).toBe(1);
  });

  it('types transaction, operation, signal and child results as JSON too', async () => {
    const handle = await engine.start(wfs.parent, undefined);
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toEqual(['string', 'string', false, 'string', null]);
  });
});

describe('input schemas: start takes z.input, the workflow function gets z.output', () => {
  it('leaves out a .default() field at start; the function sees it filled in', async () => {
    expectTypeOf(wfs.defaults).toEqualTypeOf<
      Workflow<{ orderId: string; retries: number }, number, { orderId: string; retries?: number | undefined }>
    >();
    const handle = await engine.start(wfs.defaults, { orderId: 'o-1' });
    // @ts-expect-error orderId has no default: still required
    await expect(engine.start(wfs.defaults, { retries: 1 })).rejects.toThrow(InvalidInputError);
    expectTypeOf(handle.result).returns.resolves.toEqualTypeOf<number>();
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe(3);
    await expect((await engine.start(wfs.defaultsParent, undefined)).result({ timeoutMs: 30_000 })).resolves.toBe(3);
  });
});

describe('createEngine<DB>() types trx and engine.db', () => {
  it('trx is a Transaction<DB>, engine.db a Kysely<DB>, the context a WorkflowContext<DB>', async () => {
    expectTypeOf(engine.db).toEqualTypeOf<Kysely<Db>>();
    const untyped = createEngine({ connectionString: db.url }); // untyped users: as before
    expectTypeOf(untyped.db).toEqualTypeOf<Kysely<any>>();
    await untyped.close();
    const handle = await engine.start(wfs.trx, { id: 'n-1' });
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toEqual({ id: 'n-1', body: 'hello' });
    const run = await engine.db
      .selectFrom('runledger.runs')
      .select(['status', 'fencing_token'])
      .where('run_id', '=', handle.runId)
      .executeTakeFirstOrThrow();
    expectTypeOf(run).toEqualTypeOf<{
      status: 'PENDING' | 'RUNNING' | 'WAITING' | 'CANCELLING' | 'SUCCEEDED' | 'FAILED' | 'CANCELLED' | 'TERMINATED' | 'DEAD_LETTER';
      fencing_token: string;
    }>();
    expect(run).toEqual({ status: 'SUCCEEDED', fencing_token: '1' }); // node-postgres returns int8 as text
  });
});

describe('getRun field types', () => {
  it('fencingToken is a decimal string, budget and budgetSpent numbers, operations OperationRecords', async () => {
    const handle = await engine.start(wfs.getRunWf, undefined);
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('T-1');
    const run = (await engine.getRun(handle.runId))!;
    expectTypeOf(run.fencingToken).toEqualTypeOf<string>();
    expectTypeOf<NonNullable<typeof run.steps>[number]['fencingToken']>().toEqualTypeOf<string>();
    expectTypeOf(run.budgetSpent).toEqualTypeOf<number>();
    expectTypeOf(run.budget).toEqualTypeOf<number | null>();
    expectTypeOf(run.operations).toEqualTypeOf<OperationRecord[] | undefined>();
    expectTypeOf<OperationRecord['status']>().toEqualTypeOf<OperationStatus>();
    expectTypeOf<OperationStatus>().toEqualTypeOf<'PLANNED' | 'STARTED' | 'SUCCEEDED' | 'FAILED' | 'UNKNOWN'>();
    expect(run.fencingToken).toBe('1');
    expect(run.steps?.map((s) => s.fencingToken)).toEqual(['1']);
    expect(run.budget).toBe(100);
    expect(run.budgetSpent).toBe(2.5);
    expect(run.operations).toEqual([
      expect.objectContaining({
        runId: handle.runId,
        seq: 0,
        name: 'ticket',
        idempotencyKey: `ticket-${handle.runId}`,
        status: 'SUCCEEDED',
        result: 'T-1',
        attempts: 1,
        compensable: false,
        compensationStatus: null,
        startedAt: expect.any(Date),
        finishedAt: expect.any(Date),
      }),
    ]);
    const listed = await engine.listRuns({ workflow: 'types-getrun' });
    expect(listed[0]).toMatchObject({ fencingToken: '1', budget: 100, budgetSpent: 2.5 });
  });
});

/**
 * Every value in a client read is one JSON.stringify writes and JSON.parse gives back
 * (a Date as its ISO text, a Buffer as its toJSON): no bigint, function, symbol, NaN.
 */
function expectJsonSafe(value: unknown, path = '(read)'): void {
  if (value === null || typeof value === 'string' || typeof value === 'boolean') return;
  if (typeof value === 'number') return void expect(Number.isFinite(value), `${path} is ${value}`).toBe(true);
  if (value instanceof Date || Buffer.isBuffer(value)) return;
  expect(['object', 'undefined'], `${path} is a ${typeof value}`).toContain(typeof value);
  if (value === undefined) return;
  for (const [key, item] of Object.entries(value as object)) expectJsonSafe(item, `${path}.${key}`);
}

describe('client reads are JSON-safe', () => {
  it('JSON.stringify succeeds on what getRun, listRuns, result, readStream, readArtifact, decideApproval, setQueue and the operator calls return', async () => {
    const handle = await engine.start(wfs.reads, undefined);
    const requestId = await waitFor('the approval request', async () => {
      const r = await db.pool.query('select request_id from runledger.approvals where run_id = $1', [handle.runId]);
      return r.rows[0]?.request_id as string | undefined;
    });
    const reads: Record<string, unknown> = {};
    reads.decideApproval = await engine.decideApproval(requestId, { approved: true, decidedBy: 'ops', note: 'fine' });
    reads.result = await handle.result({ timeoutMs: 30_000 });
    reads.getRun = await engine.getRun(handle.runId);
    reads.listRuns = await engine.listRuns({ workflow: 'types-reads' });
    reads.readStream = [];
    for await (const chunk of engine.readStream(handle.runId, 'out')) (reads.readStream as unknown[]).push(chunk);
    reads.readArtifact = await engine.readArtifact((reads.result as { artifactId: string }).artifactId);
    reads.setQueue = await engine.setQueue('types-reads-queue', { concurrency: 2 });
    reads.migrate = await engine.migrate();
    reads.cancel = await engine.cancel(handle.runId);

    for (const [name, value] of Object.entries(reads)) {
      expect(() => JSON.stringify(value), name).not.toThrow();
      expectJsonSafe(value, name);
    }
    const run = reads.getRun as Awaited<ReturnType<typeof engine.getRun>>;
    expect(run).toMatchObject({ status: 'SUCCEEDED', fencingToken: expect.stringMatching(/^[1-9][0-9]*$/), budgetUsed: { tokens: 10 } });
    expect(run?.steps?.map((s) => s.name)).toEqual(expect.arrayContaining(['step', 'op', 'ok']));
    expect(run?.operations).toHaveLength(1);
    expect((reads.readStream as unknown[]).length).toBe(1);
    expect(reads.readArtifact).toMatchObject({ record: { name: 'report' } });
    // What a web handler sends (res.json(run)) reads back as the same run.
    expect(JSON.parse(JSON.stringify(run))).toMatchObject({ runId: handle.runId, fencingToken: run?.fencingToken, status: 'SUCCEEDED' });
  });
});

describe('fork types result() from the forked workflow', () => {
  it('with the workflow, result() is its output; a workflow of another name is refused', async () => {
    const source = await engine.start(wfs.fork, undefined);
    await source.result({ timeoutMs: 30_000 });

    const forked = await engine.fork(source.runId, { fromStep: 0, workflow: wfs.fork });
    expectTypeOf(forked).toEqualTypeOf<RunHandle<{ at: string }>>();
    await expect(forked.result({ timeoutMs: 30_000 })).resolves.toEqual({ at: '2030-01-01T00:00:00.000Z' });

    const named = await engine.fork<{ at: Date }>(source.runId, { fromStep: 1 });
    expectTypeOf(named.result).returns.resolves.toEqualTypeOf<{ at: string }>();
    await expect(named.result({ timeoutMs: 30_000 })).resolves.toEqual({ at: '2030-01-01T00:00:00.000Z' });

    const untyped = await engine.fork(source.runId, { fromStep: 1 });
    expectTypeOf(untyped.result).returns.resolves.toEqualTypeOf<unknown>();

    await expect(engine.fork(source.runId, { fromStep: 0, workflow: wfs.forkOther })).rejects.toThrow(ConfigError);
    await expect(engine.fork(source.runId, { fromStep: 0, workflow: wfs.forkOther })).rejects.toThrow(/types-fork, not types-fork-other/);
  });
});
