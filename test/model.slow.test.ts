/**
 * A model-based test (issue 18): fast-check generates sequences of operator and worker
 * events — start, signal, approve or reject, cancel, retry, fork, and an approval whose
 * run crashes its worker at a failpoint and is recovered by another — and runs them against
 * the engine and against a reference model of what each run must then be. After every
 * command the database must settle to the model: each run's status, and each run's
 * business effect (a row written by its transaction step) present exactly once for a run
 * that succeeded and absent otherwise. No run is left PENDING or RUNNING.
 *
 * The workflow: prepare (step) -> wait for signal 'go' -> approval 'ship' -> commit
 * (transaction step writing model_effects) -> done; a rejection fails the run.
 *
 * Replay: a failure prints fast-check's seed and path; rerun with
 * MODEL_SEED=<seed> MODEL_PATH=<path> npx vitest run test/model.slow.test.ts.
 * MODEL_RUNS widens the search (default 20 sequences of 3 starts and up to 14 commands, which fits CI).
 * Crashes are in-process (`crashAt` with action 'halt': the worker stops writing and
 * heartbeating as a killed process would); real SIGKILLs are in test/engine/worker/crash.slow.test.ts.
 */
import { fc, test } from '@fast-check/vitest';
import { afterAll, beforeAll, describe, expect } from 'vitest';
import { NonRetryableError, createEngine, type CrashPoint, type Engine, type Worker } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';

const t = useTestEngine({ engine: false });
const { db } = t;

const LEASE_MS = 600;
const SETTLE_MS = 20_000;
const SEED = process.env.MODEL_SEED === undefined ? 20261202 : Number(process.env.MODEL_SEED);
const NUM_RUNS = Number(process.env.MODEL_RUNS ?? 20);

type Phase = 'signal' | 'approval' | 'done' | 'failed' | 'cancelled';
const STATUS: Record<Phase, string> = {
  signal: 'WAITING',
  approval: 'WAITING',
  done: 'SUCCEEDED',
  failed: 'FAILED',
  cancelled: 'CANCELLED',
};
const TERMINAL: Phase[] = ['done', 'failed', 'cancelled'];

interface ModelRun {
  phase: Phase;
  /** Checkpoints written: 1 prepare, 2 signal, 3 approval, 4 commit. */
  reached: number;
  /** The approval's decision, once made (a fork from the commit step reuses it). */
  approved?: boolean;
  /** finished_at must be later than this (a retried run must have run again). */
  finishedAfter?: Date;
}

interface Model {
  runs: ModelRun[];
}

interface Real {
  engine: Engine;
  ids: string[];
}

// One engine for the commands and one healthy worker, swapped for a crashing one by Crash.
let engine: Engine;
let worker: Engine;
let running: Worker;
let flow: ReturnType<typeof defineModelWorkflow>;
const halted: Engine[] = [];

function defineModelWorkflow(on: Engine) {
  return on.workflow({ name: 'model-flow', maxRecoveryAttempts: 10 }, async (ctx, input: { n: number }) => {
    await ctx.step('prepare', async () => input.n);
    const go = await ctx.waitForSignal<{ v: number }>('go');
    const decision = await ctx.requestApproval('ship', { action: `ship ${input.n}` });
    if (!decision?.approved) throw new NonRetryableError(`rejected by ${decision?.decidedBy ?? 'nobody'}`);
    await ctx.transaction('commit', async (trx) => {
      await trx
        .insertInto('model_effects')
        .values({ run_id: ctx.runId, v: go?.v ?? 0 })
        .execute();
    });
    return { v: go?.v ?? 0 };
  });
}

async function startWorker(crashAt: CrashPoint[] = []): Promise<Engine> {
  const next = createEngine({ connectionString: db.url, log: () => {}, crashAt });
  defineModelWorkflow(next);
  running = await next.runWorker({ concurrency: 8, leaseMs: LEASE_MS, pollIntervalMs: 100 });
  return next;
}

beforeAll(async () => {
  await db.pool.query('create table model_effects (id bigint generated always as identity, run_id text not null, v int not null)');
  engine = createEngine({ connectionString: db.url, log: () => {} });
  flow = defineModelWorkflow(engine);
  worker = await startWorker();
});

afterAll(async () => {
  await running?.stop();
  await Promise.all([...halted, worker, engine].map((e) => e?.close()));
});

async function dbNow(): Promise<Date> {
  return (await db.pool.query('select runledger.now() as now')).rows[0].now;
}

async function expectCode(action: Promise<unknown>, code: string): Promise<void> {
  await expect(action).rejects.toMatchObject({ code });
}

/** Waits until every run of the sequence is where the model says, then checks the effects. */
async function settle(model: Model, real: Real): Promise<void> {
  await waitFor(
    'the runs to settle to the model',
    async () => {
      const rows = (
        await db.pool.query<{ run_id: string; status: string; finished_at: Date | null; wait_kind: string | null }>(
          'select run_id, status, finished_at, wait_kind from runledger.runs where run_id = any($1)',
          [real.ids],
        )
      ).rows;
      const byId = new Map(rows.map((row) => [row.run_id, row]));
      const mismatch = model.runs.findIndex((run, i) => {
        const row = byId.get(real.ids[i]!);
        if (!row || row.status !== STATUS[run.phase]) return true;
        if (run.phase === 'signal' && row.wait_kind !== 'signal') return true;
        if (run.phase === 'approval' && row.wait_kind !== 'approval') return true;
        return run.finishedAfter !== undefined && !(row.finished_at && row.finished_at > run.finishedAfter);
      });
      if (mismatch === -1) return true;
      const row = byId.get(real.ids[mismatch]!);
      throw new Error(`run #${mismatch}: model ${JSON.stringify(model.runs[mismatch])}, table ${JSON.stringify(row)}`);
    },
    SETTLE_MS,
  );
  const effects = await db.pool.query<{ run_id: string; n: number }>(
    'select run_id, count(*)::int as n from model_effects where run_id = any($1) group by run_id',
    [real.ids],
  );
  const count = new Map(effects.rows.map((row) => [row.run_id, row.n]));
  model.runs.forEach((run, i) => {
    expect(count.get(real.ids[i]!) ?? 0, `effects of run #${i} (${run.phase})`).toBe(run.phase === 'done' ? 1 : 0);
  });
}

async function pendingRequest(runId: string): Promise<string> {
  const rows = await db.pool.query(`select request_id from runledger.approvals where run_id = $1 and decided_at is null`, [runId]);
  expect(rows.rows).toHaveLength(1);
  return rows.rows[0].request_id;
}

type Command = fc.AsyncCommand<Model, Real>;

/** How often each kind of command ran, across the sequences: every kind must have been exercised. */
const executed = new Map<string, number>();
const ran = (kind: string) => executed.set(kind, (executed.get(kind) ?? 0) + 1);
const pick = (model: Model, index: number) => index % model.runs.length;

class Start implements Command {
  check = (model: Model) => model.runs.length < 8;
  async run(model: Model, real: Real) {
    ran('start');
    const handle = await real.engine.start(flow, { n: real.ids.length });
    real.ids.push(handle.runId);
    model.runs.push({ phase: 'signal', reached: 1 });
    await settle(model, real);
  }
  toString = () => 'start';
}

class Signal implements Command {
  constructor(readonly index: number) {}
  check = (model: Model) => model.runs.length > 0;
  async run(model: Model, real: Real) {
    ran('signal');
    const run = model.runs[pick(model, this.index)]!;
    const runId = real.ids[pick(model, this.index)]!;
    if (TERMINAL.includes(run.phase)) {
      await expectCode(real.engine.signal(runId, 'go', { v: this.index }), 'INVALID_STATE');
    } else {
      // A second signal while the run waits for its approval stays in its inbox, unread.
      expect(await real.engine.signal(runId, 'go', { v: this.index })).toBe(true);
      if (run.phase === 'signal') Object.assign(run, { phase: 'approval', reached: 2 });
    }
    await settle(model, real);
  }
  toString = () => `signal(${this.index})`;
}

class Decide implements Command {
  constructor(
    readonly index: number,
    readonly approved: boolean,
  ) {}
  check = (model: Model) => model.runs.some((run) => run.phase === 'approval');
  private target(model: Model): number {
    const waiting = model.runs.flatMap((run, i) => (run.phase === 'approval' ? [i] : []));
    return waiting[this.index % waiting.length]!;
  }
  async run(model: Model, real: Real) {
    ran(this.approved ? 'approve' : 'reject');
    const i = this.target(model);
    const requestId = await pendingRequest(real.ids[i]!);
    const decision = await real.engine.decideApproval(requestId, { approved: this.approved, decidedBy: 'model' });
    expect(decision.recorded).toBe(true);
    Object.assign(
      model.runs[i]!,
      this.approved ? { phase: 'done', reached: 4, approved: true } : { phase: 'failed', reached: 3, approved: false },
    );
    await settle(model, real);
  }
  toString = () => `${this.approved ? 'approve' : 'reject'}(${this.index})`;
}

class Cancel implements Command {
  constructor(readonly index: number) {}
  check = (model: Model) => model.runs.length > 0;
  async run(model: Model, real: Real) {
    ran('cancel');
    const run = model.runs[pick(model, this.index)]!;
    const status = await real.engine.cancel(real.ids[pick(model, this.index)]!, { reason: 'model' });
    if (!TERMINAL.includes(run.phase)) run.phase = 'cancelled';
    expect(status).toBe(STATUS[run.phase]); // a finished run is left as it is
    await settle(model, real);
  }
  toString = () => `cancel(${this.index})`;
}

class Retry implements Command {
  constructor(readonly index: number) {}
  check = (model: Model) => model.runs.length > 0;
  async run(model: Model, real: Real) {
    ran('retry');
    const run = model.runs[pick(model, this.index)]!;
    const runId = real.ids[pick(model, this.index)]!;
    if (run.phase !== 'failed') {
      await expectCode(real.engine.retry(runId), 'INVALID_STATE');
    } else {
      // The rejection is a checkpoint: the retried run replays it and fails again, writing nothing.
      run.finishedAfter = await dbNow();
      expect(await real.engine.retry(runId)).toBe('PENDING');
    }
    await settle(model, real);
    delete run.finishedAfter;
  }
  toString = () => `retry(${this.index})`;
}

class Fork implements Command {
  constructor(
    readonly index: number,
    readonly fromStep: number,
  ) {}
  check = (model: Model) => model.runs.length < 8 && model.runs.some((run) => TERMINAL.includes(run.phase));
  async run(model: Model, real: Real) {
    ran('fork');
    const finished = model.runs.flatMap((run, i) => (TERMINAL.includes(run.phase) ? [i] : []));
    const i = finished[this.index % finished.length]!;
    const source = model.runs[i]!;
    const fromStep = Math.min(this.fromStep, source.reached, 3);
    const handle = await real.engine.fork(real.ids[i]!, { fromStep });
    real.ids.push(handle.runId);
    // What the reused checkpoints decide: up to the signal, it waits for one; up to the approval, for that; with the approval, its outcome.
    const forked: ModelRun =
      fromStep <= 1
        ? { phase: 'signal', reached: 1 }
        : fromStep === 2
          ? { phase: 'approval', reached: 2 }
          : source.approved
            ? { phase: 'done', reached: 4, approved: true }
            : { phase: 'failed', reached: 3, approved: false };
    model.runs.push(forked);
    await settle(model, real);
  }
  toString = () => `fork(${this.index}, from ${this.fromStep})`;
}

const CRASHES = ['after-commit', 'before-complete'] as const;

/** Approves a run whose worker then dies at a failpoint of its commit; a new worker recovers it. */
class ApproveThroughCrash implements Command {
  constructor(
    readonly index: number,
    readonly when: (typeof CRASHES)[number],
  ) {}
  check = (model: Model) => model.runs.some((run) => run.phase === 'approval');
  async run(model: Model, real: Real) {
    ran(`approve-through-crash ${this.when}`);
    const waiting = model.runs.flatMap((run, i) => (run.phase === 'approval' ? [i] : []));
    const i = waiting[this.index % waiting.length]!;
    const runId = real.ids[i]!;
    await running.stop();
    await worker.close();
    const step = this.when === 'before-complete' ? 'model-flow' : 'commit';
    worker = await startWorker([{ when: this.when, step, action: 'halt' }]);
    const crashingRun = running;
    const requestId = await pendingRequest(runId);
    await real.engine.decideApproval(requestId, { approved: true, decidedBy: 'model' });
    // Halted at the failpoint, the worker still owns the run but no longer renews its lease.
    // (Had it passed the point without halting, the run would end and this would time out.)
    await waitFor(`the worker to halt at ${this.when}`, async () => {
      const row = (
        await db.pool.query(
          `select status, lease_owner, lease_expires_at < runledger.now() as expired from runledger.runs where run_id = $1`,
          [runId],
        )
      ).rows[0];
      return row.status === 'RUNNING' && row.lease_owner === crashingRun.workerId && row.expired;
    });
    halted.push(worker);
    worker = await startWorker();
    Object.assign(model.runs[i]!, { phase: 'done', reached: 4, approved: true });
    await settle(model, real);
  }
  toString = () => `approve-through-crash(${this.index}, ${this.when})`;
}

const commands = [
  fc.constant(new Start()),
  fc.nat(20).map((i) => new Signal(i)),
  fc.nat(20).map((i) => new Signal(i)), // twice as likely: it is what makes approvals possible
  fc.tuple(fc.nat(20), fc.boolean()).map(([i, approved]) => new Decide(i, approved)),
  fc.tuple(fc.nat(20), fc.boolean()).map(([i, approved]) => new Decide(i, approved)),
  fc.nat(20).map((i) => new Cancel(i)),
  fc.nat(20).map((i) => new Retry(i)),
  fc.tuple(fc.nat(20), fc.integer({ min: 0, max: 3 })).map(([i, from]) => new Fork(i, from)),
  fc.tuple(fc.nat(20), fc.constantFrom(...CRASHES)).map(([i, when]) => new ApproveThroughCrash(i, when)),
];

describe('model-based: random operator and crash sequences against a reference model', () => {
  test.prop([fc.commands(commands, { maxCommands: 14, size: 'max' })], {
    numRuns: NUM_RUNS,
    seed: SEED,
    ...(process.env.MODEL_PATH ? { path: process.env.MODEL_PATH } : {}),
    endOnFailure: true,
  })(
    'every run ends where the model says, each effect once',
    async (sequence) => {
      const model: Model = { runs: [] };
      const real: Real = { engine, ids: [] };
      for (let i = 0; i < 3; i++) await new Start().run(model, real);
      await fc.asyncModelRun(() => ({ model, real }), sequence);
      const stuck = await db.pool.query(`select count(*)::int as n from runledger.runs where status in ('PENDING', 'RUNNING')`);
      expect(stuck.rows[0].n).toBe(0);
    },
    300_000,
  );

  test('every kind of command was exercised', () => {
    console.log(`model-based test: commands run ${JSON.stringify(Object.fromEntries(executed))}`);
    const kinds = [
      'start',
      'signal',
      'approve',
      'reject',
      'cancel',
      'retry',
      'fork',
      ...CRASHES.map((when) => `approve-through-crash ${when}`),
    ];
    for (const kind of kinds) {
      expect(executed.get(kind) ?? 0, kind).toBeGreaterThan(0);
    }
  });
});
