import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  ConfigError,
  createEngine,
  InvalidInputError,
  PayloadTooLargeError,
  RunledgerError,
  UnknownWorkflowError,
} from '../../../src/index.js';
import { useTestEngine } from '../../helpers/test-engine.js';

const t = useTestEngine({ engine: { maxPayloadBytes: 1_000 } });
const { db } = t;

const runCount = async () => Number((await db.pool.query('select count(*) from runledger.runs')).rows[0].count);

describe('engine.start with bad input', () => {
  it('rejects input that fails the zod schema with INVALID_INPUT and stores nothing', async () => {
    const wf = t.engine.workflow({ name: 'typed', input: z.object({ orderId: z.string().min(1) }) }, async () => 'ok');
    const before = await runCount();
    const error = await t.engine.start(wf, { orderId: 42 } as never).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(InvalidInputError);
    expect(error).toMatchObject({ code: 'INVALID_INPUT' });
    expect((error as RunledgerError).message).toMatch(/orderId/);
    expect(await runCount()).toBe(before);
  });

  it('rejects input over the size limit with PAYLOAD_TOO_LARGE and stores nothing', async () => {
    const wf = t.engine.workflow({ name: 'big-input' }, async () => 'ok');
    const before = await runCount();
    await expect(t.engine.start(wf, { blob: 'x'.repeat(2_000) })).rejects.toMatchObject({ code: 'PAYLOAD_TOO_LARGE' });
    await expect(t.engine.start(wf, { blob: 'x'.repeat(2_000) })).rejects.toBeInstanceOf(PayloadTooLargeError);
    expect(await runCount()).toBe(before);
  });

  it('rejects input JSON cannot hold (bigint, function) with INVALID_INPUT', async () => {
    const wf = t.engine.workflow({ name: 'weird-input' }, async () => 'ok');
    await expect(t.engine.start(wf, { n: 1n })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(t.engine.start(wf, { f: () => 1 })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
  });

  it('rejects an invalid run id with INVALID_INPUT and stores nothing', async () => {
    const wf = t.engine.workflow({ name: 'ids' }, async () => 'ok');
    const before = await runCount();
    await expect(t.engine.start(wf, {}, { runId: "x'; drop table runledger.runs; --" })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    expect(await runCount()).toBe(before);
  });

  it('an explicit run id started twice gives one run', async () => {
    const wf = t.engine.workflow({ name: 'explicit-id' }, async () => 'ok');
    const first = await t.engine.start(wf, {}, { runId: 'order-77' });
    const second = await t.engine.start(wf, {}, { runId: 'order-77' });
    expect(second.runId).toBe(first.runId);
    const rows = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = 'order-77'`);
    expect(rows.rows[0].n).toBe(1);
  });
});

describe('unknown workflows and bad names', () => {
  it('start_run from SQL of an unknown workflow raises RL006, mapped to UNKNOWN_WORKFLOW', async () => {
    const error = await db.pool.query(`select runledger.start_run('nope', '{}')`).catch((e: unknown) => e);
    expect(error).toMatchObject({ code: 'RL006' });
    expect((error as Error).message).toMatch(/workflow 'nope' is not registered/);
    const { fromPgError } = await import('../../../src/engine/core/errors.js');
    expect(fromPgError(error)).toBeInstanceOf(UnknownWorkflowError);
  });

  it('refuses names that are not plain identifiers, with CONFIG errors naming the field', () => {
    expect(() => t.engine.workflow({ name: 'bad name' }, async () => 1)).toThrow(ConfigError);
    expect(() => t.engine.workflow({ name: "x'); drop" }, async () => 1)).toThrow(/workflow name/);
    expect(() => t.engine.workflow({ name: 'ok-name', queue: 'a:b' }, async () => 1)).toThrow(/queue/);
    expect(() => t.engine.workflow({ name: 'ok-name2', version: '1@2' }, async () => 1)).toThrow(/version/);
    expect(() => t.engine.workflow({ name: 'ok-name3', maxRecoveryAttempts: -1 }, async () => 1)).toThrow(/maxRecoveryAttempts/);
  });

  it('refuses to define the same workflow version twice on one engine', () => {
    t.engine.workflow({ name: 'twice' }, async () => 1);
    expect(() => t.engine.workflow({ name: 'twice' }, async () => 2)).toThrow(/already defined/);
  });

  it('refuses bad engine and worker options with CONFIG errors', async () => {
    expect(() => createEngine({ connectionString: db.url, schema: 'other' })).toThrow(/schema/);
    expect(() => createEngine({ connectionString: db.url, maxPayloadBytes: -5 })).toThrow(ConfigError);
    await expect(t.engine.runWorker({ leaseMs: 10 })).rejects.toThrow(/leaseMs/);
    await expect(t.engine.runWorker({ concurrency: 0 })).rejects.toThrow(/concurrency/);
    await expect(t.engine.runWorker({ queues: ['bad queue'] })).rejects.toThrow(/queue/);
    await expect(t.engine.runWorker({ fetchBatchSize: 0 })).rejects.toMatchObject({
      code: 'CONFIG',
      message: expect.stringMatching(/fetchBatchSize/),
    });
    await expect(t.engine.runWorker({ pollIntervalMs: 0 })).rejects.toMatchObject({
      code: 'CONFIG',
      message: expect.stringMatching(/pollIntervalMs/),
    });
    await expect(t.engine.runWorker({ sweepIntervalMs: 2.5 })).rejects.toMatchObject({
      code: 'CONFIG',
      message: expect.stringMatching(/sweepIntervalMs/),
    });
    await expect(createEngine({ connectionString: db.url }).runWorker()).rejects.toThrow(/no workflow is defined/);
  });

  it('retry of a run that is not dead-lettered or failed is INVALID_STATE; of an unknown run NOT_FOUND', async () => {
    const wf = t.engine.workflow({ name: 'not-retryable' }, async () => 'ok');
    const handle = await t.engine.start(wf, {});
    await expect(t.engine.retry(handle.runId)).rejects.toMatchObject({ code: 'INVALID_STATE' });
    await expect(t.engine.retry('missing-run')).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});

describe('input validated again at claim', () => {
  it('a run started from SQL with input that fails the schema ends FAILED with INVALID_INPUT', async () => {
    const wf = t.engine.workflow(
      { name: 'sql-typed', queue: 'sql-typed', input: z.object({ n: z.number() }) },
      async (_ctx, input) => input.n,
    );
    const worker = await t.engine.runWorker({ queues: ['sql-typed'], concurrency: 1, leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      await t.engine.start(wf, { n: 1 }); // registers the workflow
      const started = await db.pool.query(`select runledger.start_run('sql-typed', '{"n": "not a number"}') as id`);
      const { awaitResult } = await import('../../../src/engine/client/start.js');
      const failure = await awaitResult({ getRun: (id: string) => t.engine.getRun(id) } as never, started.rows[0].id).catch(
        (e: unknown) => e,
      );
      expect(failure).toMatchObject({ code: 'RUN_FAILED' });
      const run = await t.engine.getRun(started.rows[0].id);
      expect(run).toMatchObject({ status: 'FAILED', error: { code: 'INVALID_INPUT' } });
    } finally {
      await worker.stop();
    }
  });
});

describe('ctx calls with bad arguments', () => {
  it('ctx.sleep without a duration (the duration passed as the name) fails the run with CONFIG instead of waiting forever', async () => {
    const wf = t.engine.workflow({ name: 'sleepless', queue: 'sleepless' }, async (ctx) => {
      await (ctx.sleep as (name: string) => Promise<void>)('5s');
      return 'woke';
    });
    const worker = await t.engine.runWorker({ queues: ['sleepless'], concurrency: 1, leaseMs: 2_000, pollIntervalMs: 100 });
    try {
      const handle = await t.engine.start(wf, undefined);
      await expect(handle.result({ timeoutMs: 10_000 })).rejects.toMatchObject({ code: 'RUN_FAILED' });
      const run = await t.engine.getRun(handle.runId);
      expect(run).toMatchObject({ status: 'FAILED', error: { code: 'CONFIG', message: expect.stringContaining('a duration') } });
      const waits = await db.pool.query(`select count(*)::int as n from runledger.steps where run_id = $1`, [handle.runId]);
      expect(waits.rows[0].n).toBe(0); // no timer without a wake-up time was recorded
    } finally {
      await worker.stop();
    }
  });

  it('the SQL refuses a sleep step without a wake-up time (RL003)', async () => {
    await db.pool.query(`select runledger._register_workflow('sql-sleep', '1', 'sql-sleep', 10)`);
    const runId = (await db.pool.query(`select runledger.start_run('sql-sleep', '{}') as id`)).rows[0].id;
    const claimed = await db.pool.query(
      `select fencing_token from runledger._claim_batch('wk-sleep', array['sql-sleep'], array['sql-sleep@1'], 1, 30000) where run_id = $1`,
      [runId],
    );
    await expect(
      db.pool.query(`select * from runledger._wait($1, $2, 0, 'nap', 'sleep', '{}'::jsonb)`, [runId, claimed.rows[0].fencing_token]),
    ).rejects.toMatchObject({ code: 'RL003', message: expect.stringContaining('has no duration or time') });
  });
});

describe('start_run options from SQL', () => {
  it('refuses a non-numeric priority, a negative recovery limit and an unreadable deadline with RL003', async () => {
    await db.pool.query(`select runledger._register_workflow('sql-opts', '1', 'default', 3)`);
    const before = await runCount();
    for (const options of ['{"priority": "abc"}', '{"priority": 1.5}', '{"max_recovery_attempts": -1}', '{"deadline": "soon"}']) {
      await expect(db.pool.query(`select runledger.start_run('sql-opts', '{}', $1::jsonb)`, [options]), options).rejects.toMatchObject({
        code: 'RL003',
      });
    }
    expect(await runCount()).toBe(before);
  });

  it('send_signal refuses a topic that is not 1 to 100 plain characters with RL003 and stores nothing', async () => {
    await db.pool.query(`select runledger._register_workflow('sql-topic', '1', 'default', 3)`);
    const runId = (await db.pool.query(`select runledger.start_run('sql-topic', '{}') as id`)).rows[0].id as string;
    for (const topic of ['t'.repeat(101), 'has space', '/leading-slash', '']) {
      await expect(db.pool.query(`select runledger.send_signal($1, $2, '{}')`, [runId, topic]), topic).rejects.toMatchObject({
        code: 'RL003',
      });
    }
    expect(Number((await db.pool.query('select count(*) from runledger.signals where run_id = $1', [runId])).rows[0].count)).toBe(0);
    await expect(db.pool.query(`select runledger.send_signal($1, $2, '{}') as ok`, [runId, 't'.repeat(100)])).resolves.toMatchObject({
      rows: [{ ok: true }],
    });
  });

  it('reads a date as a point in time and anything else as a lifetime', async () => {
    const point = await db.pool.query(`select runledger.start_run('sql-opts', '{}', '{"deadline": "2030-01-31"}') as id`);
    const lifetime = await db.pool.query(`select runledger.start_run('sql-opts', '{}', '{"deadline": "36 hours"}') as id`);
    const result = await db.pool.query(
      `select (select deadline_at from runledger.runs where run_id = $1) as point,
              (select deadline_at - created_at from runledger.runs where run_id = $2) as lifetime`,
      [point.rows[0].id, lifetime.rows[0].id],
    );
    expect((result.rows[0].point as Date).toISOString().slice(0, 10)).toBe('2030-01-31');
    expect(result.rows[0].lifetime).toMatchObject({ days: 1, hours: 12 });
  });
});

describe('unknown options and arguments that raised a raw SQLSTATE get a code (RL003 / INVALID_INPUT)', () => {
  const sqlError = (query: Promise<unknown>) =>
    query.then(
      () => undefined,
      (e: unknown) => e as { code?: string; message?: string },
    );

  it('start_run and start_runs refuse an unknown option, naming it and the known ones, and store nothing', async () => {
    await db.pool.query(`select runledger._register_workflow('sql-typo', '1', 'default', 3)`);
    const before = await runCount();
    const one = await sqlError(db.pool.query(`select runledger.start_run('sql-typo', '{}', '{"max_step": 3, "queue": "default"}')`));
    expect(one).toMatchObject({ code: 'RL003', message: expect.stringContaining(`start_run: unknown option 'max_step'`) });
    expect(one?.message).toMatch(/the options are .*\bmax_steps\b/);
    const many = await sqlError(
      db.pool.query(`select runledger.start_runs('sql-typo', '[1, 2]', '{"deadlin": "1 day", "no_progres": 3}')`),
    );
    expect(many).toMatchObject({ code: 'RL003', message: expect.stringContaining(`start_runs: unknown option 'deadlin', 'no_progres'`) });
    expect(many?.message).toMatch(/the options are .*\brun_ids\b/);
    expect(many?.message).not.toMatch(/\bidempotency_key\b,/);
    expect(await runCount()).toBe(before);
    // The known ones still start runs.
    await expect(db.pool.query(`select runledger.start_run('sql-typo', '{}', '{"max_steps": 3}')`)).resolves.toBeDefined();
  });

  it('engine.start and engine.startMany refuse an unknown option with INVALID_INPUT and store nothing', async () => {
    const wf = t.engine.workflow({ name: 'ts-typo' }, async () => 'ok');
    const before = await runCount();
    const single = await t.engine.start(wf, {}, { maxStep: 3 } as never).catch((e: unknown) => e);
    expect(single).toBeInstanceOf(InvalidInputError);
    expect(single).toMatchObject({ message: expect.stringMatching(/start: unknown option "maxStep" \(the options are .*maxSteps/) });
    const batch = await t.engine.startMany(wf, [{}, {}], { runId: 'r-1', dedline: '1d' } as never).catch((e: unknown) => e);
    expect(batch).toMatchObject({ code: 'INVALID_INPUT', message: expect.stringMatching(/startMany: unknown options "runId", "dedline"/) });
    await expect(t.engine.start(wf, {}, null as never)).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    expect(await runCount()).toBe(before);
  });

  it("start_run refuses run_at 'infinity', '-infinity' and unparsable text, and an infinite deadline, with RL003 naming the option", async () => {
    await db.pool.query(`select runledger._register_workflow('sql-when', '1', 'default', 3)`);
    const before = await runCount();
    for (const [options, named] of [
      [{ run_at: 'infinity' }, 'run_at'],
      [{ run_at: '-infinity' }, 'run_at'],
      [{ run_at: 'next tuesday-ish' }, 'run_at'],
      [{ deadline: 'infinity' }, 'deadline'],
      [{ deadline: '2030-01-01 infinity' }, 'deadline'],
    ] as const) {
      const error = await sqlError(db.pool.query(`select runledger.start_run('sql-when', '{}', $1::jsonb)`, [JSON.stringify(options)]));
      expect(error, JSON.stringify(options)).toMatchObject({ code: 'RL003', message: expect.stringContaining(`start_run: ${named}`) });
      const batch = await sqlError(db.pool.query(`select runledger.start_runs('sql-when', '[1]', $1::jsonb)`, [JSON.stringify(options)]));
      expect(batch, JSON.stringify(options)).toMatchObject({ code: 'RL003', message: expect.stringContaining(`start_runs: ${named}`) });
    }
    expect(await runCount()).toBe(before);
  });

  it('an invalid Date as runAt or deadline is INVALID_INPUT naming the option (not an uncoded RangeError), and stores nothing', async () => {
    const wf = t.engine.workflow({ name: 'bad-dates' }, async () => 'ok');
    const before = await runCount();
    for (const options of [{ runAt: new Date('x') }, { deadline: new Date('x') }, { runAt: new Date(-8.64e15) }]) {
      const error = await t.engine.start(wf, {}, options).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(InvalidInputError);
      expect((error as Error).message).toMatch(/^start: (runAt|deadline): /);
    }
    await expect(t.engine.startMany(wf, [{}], { runAt: new Date('x') })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
      message: expect.stringContaining('startMany: runAt'),
    });
    expect(await runCount()).toBe(before);
  });

  it('resolve_operation with a null status is RL003 (it broke a not-null constraint, 23502), and the operation stays as it was', async () => {
    await db.pool.query(`select runledger._register_workflow('sql-resolve', '1', 'default', 3)`);
    const runId = (await db.pool.query(`select runledger.start_run('sql-resolve', '{}') as id`)).rows[0].id as string;
    await db.pool.query(
      `insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status) values ('op-null', $1, 0, 'charge', 'key-null', 'UNKNOWN')`,
      [runId],
    );
    const error = await sqlError(db.pool.query(`select runledger.resolve_operation('op-null', null)`));
    expect(error).toMatchObject({
      code: 'RL003',
      message: expect.stringContaining('resolve_operation: status must be SUCCEEDED or FAILED'),
    });
    await expect(t.engine.resolveOperation('op-null', { status: null as never })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    expect((await db.pool.query(`select status from runledger.operations where operation_id = 'op-null'`)).rows[0].status).toBe('UNKNOWN');
  });

  it('a signal id over 200 characters is RL003 from send_signal (it broke the inbox check, 23514) and INVALID_INPUT from engine.signal', async () => {
    await db.pool.query(`select runledger._register_workflow('sql-signal-id', '1', 'default', 3)`);
    const runId = (await db.pool.query(`select runledger.start_run('sql-signal-id', '{}') as id`)).rows[0].id as string;
    for (const signalId of ['s'.repeat(201), '']) {
      const error = await sqlError(db.pool.query(`select runledger.send_signal($1, 'topic', '{}', $2)`, [runId, signalId]));
      expect(error).toMatchObject({
        code: 'RL003',
        message: expect.stringContaining('send_signal: signal_id must be 1 to 200 characters'),
      });
      await expect(t.engine.signal(runId, 'topic', {}, { signalId })).rejects.toMatchObject({
        code: 'INVALID_INPUT',
        message: expect.stringContaining('signalId'),
      });
    }
    expect(Number((await db.pool.query('select count(*) from runledger.signals where run_id = $1', [runId])).rows[0].count)).toBe(0);
    await expect(t.engine.signal(runId, 'topic', {}, { signalId: 's'.repeat(200) })).resolves.toBe(true);
  });
});
