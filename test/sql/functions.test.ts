/**
 * The SQL contract, exercised from SQL only: every statement here is what an operator
 * (or another language's client) would type in psql. No TypeScript engine wrappers.
 *
 * Clock: runledger.now() honours the session setting runledger.fake_now, so tests that
 * need exact times or expired leases open their own session (pg.Client) and move the
 * clock there. Recovery tests use fake times in the past (years 2001-2003): a lease set
 * in 2001 is expired in 2001 + a few seconds, while leases set on the real clock by other
 * tests in this file are not, so each sweep touches only the runs its test made.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { decodeTime } from 'ulid';
import { createTestDatabase, waitFor, type TestDatabase } from '../helpers/database.js';

let db: TestDatabase;
let seq = 0;

beforeAll(async () => {
  db = await createTestDatabase();
  await db.pool.query(`select runledger._register_workflow('w', '1', 'default', 3)`);
});

afterAll(async () => {
  await db?.drop();
});

// ---------------------------------------------------------------------------------------------
// helpers (plain SQL over pg)

type Queryable = Pick<pg.Pool, 'query'> | pg.Client;

/** A dedicated session, for session settings (runledger.fake_now, runledger.max_payload_bytes). */
async function session<T>(fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

async function setNow(client: pg.Client, at: string): Promise<void> {
  await client.query(`select set_config('runledger.fake_now', $1, false)`, [at]);
}

function newRunId(label: string): string {
  seq += 1;
  return `${label}-${seq}`;
}

async function startRun(options: Record<string, unknown> = {}, input: unknown = { n: 1 }, on: Queryable = db.pool, workflow = 'w'): Promise<string> {
  const result = await on.query('select runledger.start_run($1, $2::jsonb, $3::jsonb) as run_id', [
    workflow,
    JSON.stringify(input),
    JSON.stringify(options),
  ]);
  return result.rows[0].run_id;
}

interface Claimed {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  input: unknown;
  fencing_token: number;
  recovery_attempts: number;
  checkpoints: unknown[];
}

async function claim(runId: string, worker = 'wk-1', leaseMs = 30_000, on: Queryable = db.pool, reclaim?: boolean): Promise<Claimed[]> {
  const result = await on.query(
    `select run_id, workflow_name, workflow_version, input, fencing_token::int as fencing_token, recovery_attempts, checkpoints
       from runledger._claim_run($1, $2, $3${reclaim === undefined ? '' : ', $4'})`,
    reclaim === undefined ? [runId, worker, leaseMs] : [runId, worker, leaseMs, reclaim],
  );
  return result.rows;
}

async function claimOne(runId: string, worker = 'wk-1', leaseMs = 30_000, on: Queryable = db.pool): Promise<Claimed> {
  const rows = await claim(runId, worker, leaseMs, on);
  expect(rows, `claim of ${runId}`).toHaveLength(1);
  return rows[0]!;
}

async function checkpoint(
  runId: string,
  token: number,
  stepSeq: number,
  name: string,
  options: { status?: 'SUCCEEDED' | 'FAILED'; output?: unknown; error?: unknown; on?: Queryable } = {},
): Promise<number> {
  const result = await (options.on ?? db.pool).query(
    `select pid from runledger._checkpoint($1, $2, $3, $4, 'step', $5, $6::jsonb, $7::jsonb, 1, runledger.now())`,
    [
      runId,
      token,
      stepSeq,
      name,
      options.status ?? 'SUCCEEDED',
      options.output === undefined ? null : JSON.stringify(options.output),
      options.error === undefined ? null : JSON.stringify(options.error),
    ],
  );
  return result.rows[0].pid;
}

async function getRun(runId: string): Promise<Record<string, any> | undefined> {
  const result = await db.pool.query(`select *, fencing_token::int as fencing_token from runledger.runs where run_id = $1`, [runId]);
  return result.rows[0];
}

async function steps(runId: string): Promise<Array<{ seq: number; name: string; status: string; fencing_token: number }>> {
  const result = await db.pool.query(
    `select seq, name, status, fencing_token::int as fencing_token from runledger.steps where run_id = $1 order by seq`,
    [runId],
  );
  return result.rows;
}

async function events(runId: string): Promise<Array<{ kind: string; detail: any }>> {
  const result = await db.pool.query(`select kind, detail from runledger.events where run_id = $1 order by event_id`, [runId]);
  return result.rows;
}

/** A run claimed by runledger._claim_batch, or (run_id null) the sentinel row that carries next_due_at. */
interface BatchRow {
  run_id: string | null;
  workflow_name: string | null;
  workflow_version: string | null;
  input: unknown;
  fencing_token: number | null;
  recovery_attempts: number | null;
  cancel_requested: boolean | null;
  checkpoints: unknown[] | null;
  next_due_at: Date | null;
}

async function claimBatch(
  worker: string,
  queues: string[],
  workflows: string[],
  limit: number | null,
  options: { on?: Queryable; leaseMs?: number; reclaimExcept?: string[] } = {},
): Promise<BatchRow[]> {
  const result = await (options.on ?? db.pool).query(
    `select run_id, workflow_name, workflow_version, input, fencing_token::int as fencing_token, recovery_attempts,
            cancel_requested, checkpoints, next_due_at
       from runledger._claim_batch($1, $2, $3, $4, $5${options.reclaimExcept === undefined ? '' : ', $6'})`,
    options.reclaimExcept === undefined
      ? [worker, queues, workflows, limit, options.leaseMs ?? 30_000]
      : [worker, queues, workflows, limit, options.leaseMs ?? 30_000, options.reclaimExcept],
  );
  return result.rows;
}

const claimedIds = (rows: BatchRow[]): string[] => rows.filter((r) => r.run_id !== null).map((r) => r.run_id!);
const sentinels = (rows: BatchRow[]): BatchRow[] => rows.filter((r) => r.run_id === null);

/** More than any queue in this file holds: a probe with this limit claims everything claimable. */
const PROBE_LIMIT = 100_000;

/**
 * Would a worker claim the run now? runledger._claim_batch for the run's queue and
 * workflow@version (or the ones given), in a transaction that is rolled back, so nothing
 * changes. The limit is larger than any queue here, so the run comes back exactly when it
 * is claimable, and the sentinel row (run_id null) is always there with next_due_at.
 * `on`: a session whose runledger.fake_now is the clock of the probe.
 */
async function claimable(
  runId: string,
  options: { on?: pg.Client; queues?: string[]; workflows?: string[] } = {},
): Promise<{ claimed: boolean; nextDueAt: Date | null }> {
  const run = await getRun(runId);
  expect(run, `run ${runId}`).toBeDefined();
  const queues = options.queues ?? [run!.queue_name];
  const workflows = options.workflows ?? [`${run!.workflow_name}@${run!.workflow_version}`];
  const client = options.on ?? (await db.pool.connect());
  try {
    await client.query('begin');
    try {
      const rows = await claimBatch('wk-probe', queues, workflows, PROBE_LIMIT, { on: client });
      expect(claimedIds(rows).filter((id) => id === runId).length, `${runId} claimed at most once`).toBeLessThanOrEqual(1);
      expect(sentinels(rows), 'fewer runs than the limit: one sentinel row').toHaveLength(1);
      return { claimed: claimedIds(rows).includes(runId), nextDueAt: sentinels(rows)[0]!.next_due_at };
    } finally {
      await client.query('rollback');
    }
  } finally {
    if (!options.on) (client as pg.PoolClient).release();
  }
}

let markers = 0;

/**
 * The runledger_runnable notifications (payloads, in order) sent while fn runs, seen by a
 * dedicated LISTEN session. A marker notified afterwards bounds the wait: notifications
 * arrive in commit order, so once the marker is in, everything fn committed is in too.
 */
async function notified<T>(fn: () => Promise<T>): Promise<{ result: T; payloads: string[] }> {
  const listener = new pg.Client({ connectionString: db.url });
  await listener.connect();
  const payloads: string[] = [];
  listener.on('notification', (message) => {
    if (message.channel === 'runledger_runnable') payloads.push(message.payload ?? '');
  });
  try {
    await listener.query('listen runledger_runnable');
    const result = await fn();
    markers += 1;
    const marker = `.marker-${markers}`; // no queue name starts with a dot
    await db.pool.query(`select pg_notify('runledger_runnable', $1)`, [marker]);
    await waitFor('the marker notification', async () => payloads.includes(marker), 10_000);
    return { result, payloads: payloads.slice(0, payloads.indexOf(marker)) };
  } finally {
    await listener.end();
  }
}

async function countRuns(): Promise<number> {
  return (await db.pool.query('select count(*)::int as n from runledger.runs')).rows[0].n;
}

async function sqlState(promise: Promise<unknown>): Promise<string | undefined> {
  try {
    await promise;
  } catch (error) {
    return (error as { code?: string }).code;
  }
  throw new Error('expected the statement to raise, but it succeeded');
}

const ULID = /^[0-9A-HJKMNP-TV-Z]{26}$/;

// ---------------------------------------------------------------------------------------------

describe('runledger.start_run', () => {
  it('creates a PENDING run with a ULID and a created event, announces its queue on runledger_runnable and is claimable at once', async () => {
    const before = (await db.pool.query(`select floor(extract(epoch from clock_timestamp()) * 1000)::bigint as ms`)).rows[0].ms;
    const { result: runId, payloads } = await notified(() => startRun({}, { orderId: 'o-1' }));
    const after = (await db.pool.query(`select ceil(extract(epoch from clock_timestamp()) * 1000)::bigint as ms`)).rows[0].ms;

    expect(runId).toHaveLength(26);
    expect(runId).toMatch(ULID);
    // The ULID's 48-bit time prefix is the server clock at creation (rounded to the millisecond).
    expect(decodeTime(runId)).toBeGreaterThanOrEqual(Number(before) - 1);
    expect(decodeTime(runId)).toBeLessThanOrEqual(Number(after) + 1);

    const run = await getRun(runId);
    expect(run).toMatchObject({
      status: 'PENDING',
      workflow_name: 'w',
      workflow_version: '1',
      queue_name: 'default',
      input: { orderId: 'o-1' },
      fencing_token: 0,
      recovery_attempts: 0,
      max_recovery_attempts: 3,
      lease_owner: null,
      termination_reason: null,
    });
    expect(await events(runId)).toEqual([{ kind: 'created', detail: { workflow: 'w', version: '1', queue: 'default' } }]);
    expect(run?.not_before).toBeNull();
    // Announced once, as runnable now (no "@due"), to the workers of its queue.
    expect(payloads).toEqual(['default']);
    expect(await claimable(runId)).toMatchObject({ claimed: true });
  });

  it('gives every run its own id', async () => {
    const ids = await Promise.all(Array.from({ length: 20 }, () => startRun()));
    expect(new Set(ids).size).toBe(20);
    for (const id of ids) expect(id).toMatch(ULID);
  });

  it('raises RL006 for an unknown workflow or version and stores nothing', async () => {
    const before = await countRuns();
    expect(await sqlState(startRun({}, {}, db.pool, 'no-such-workflow'))).toBe('RL006');
    expect(await sqlState(startRun({ version: '99' }))).toBe('RL006');
    expect(await countRuns()).toBe(before);
  });

  it.each([
    ['an invalid queue name', { queue: 'bad queue!' }],
    ['a queue name starting with a dot', { queue: '.hidden' }],
    ['an invalid run_id', { run_id: 'has space' }],
    ['a run_id over 200 characters', { run_id: 'r'.repeat(201) }],
    ['a deadline that is neither interval nor timestamp', { deadline: 'tomorrowish' }],
  ])('raises RL003 for %s and stores nothing', async (_what, options) => {
    const before = await countRuns();
    expect(await sqlState(startRun(options))).toBe('RL003');
    expect(await countRuns()).toBe(before);
  });

  it('raises RL004 for input over runledger.max_payload_bytes and stores nothing', async () => {
    await session(async (client) => {
      await client.query('set runledger.max_payload_bytes = 100');
      const before = await countRuns();
      const runId = newRunId('too-big');
      const big = { text: 'x'.repeat(200) };
      let caught: { code?: string; message?: string } | undefined;
      const refused = await notified(async () => {
        try {
          await startRun({ run_id: runId }, big, client);
        } catch (error) {
          caught = error as { code?: string; message?: string };
        }
      });
      expect(caught?.code).toBe('RL004');
      expect(caught?.message).toMatch(/over the limit of 100/);
      expect(await countRuns()).toBe(before);
      expect(await getRun(runId)).toBeUndefined();
      expect(refused.payloads).toEqual([]); // nothing announced
      // Under the limit, the same session starts runs normally.
      const accepted = await notified(() => startRun({ run_id: newRunId('small') }, { a: 1 }, client));
      expect((await getRun(accepted.result))?.status).toBe('PENDING');
      expect(accepted.payloads).toEqual(['default']);
    });
  });

  it('returns the same run for the same run_id and creates one row', async () => {
    const runId = newRunId('fixed');
    const first = await notified(() => startRun({ run_id: runId }, { first: true }));
    const second = await notified(() => startRun({ run_id: runId }, { second: true }));
    expect(first.result).toBe(runId);
    expect(second.result).toBe(runId);
    const rows = await db.pool.query('select input from runledger.runs where run_id = $1', [runId]);
    expect(rows.rows).toEqual([{ input: { first: true } }]);
    expect((await events(runId)).map((e) => e.kind)).toEqual(['created']);
    // Announced by the first start only; the run is claimable (once: the probe checks).
    expect(first.payloads).toEqual(['default']);
    expect(second.payloads).toEqual([]);
    expect(await claimable(runId)).toMatchObject({ claimed: true });
  });

  it('raises RL005 when a run_id is reused for another workflow', async () => {
    await db.pool.query(`select runledger._register_workflow('other', '1', 'default', 3)`);
    const runId = await startRun({ run_id: newRunId('owned') });
    expect(await sqlState(startRun({ run_id: runId }, {}, db.pool, 'other'))).toBe('RL005');
    expect((await getRun(runId))?.workflow_name).toBe('w');
  });

  it('returns the first run for the same idempotency_key', async () => {
    const key = newRunId('idem');
    const first = await startRun({ idempotency_key: key }, { attempt: 1 });
    const second = await startRun({ idempotency_key: key }, { attempt: 2 });
    const third = await startRun({ idempotency_key: key, run_id: newRunId('ignored') }, { attempt: 3 });
    expect(second).toBe(first);
    expect(third).toBe(first);
    const rows = await db.pool.query('select run_id, input from runledger.runs where idempotency_key = $1', [key]);
    expect(rows.rows).toEqual([{ run_id: first, input: { attempt: 1 } }]);
  });

  it('concurrent starts with the same idempotency_key or run_id all return one run', async () => {
    const key = newRunId('idem-race');
    const byKey = await Promise.all(Array.from({ length: 8 }, (_, i) => startRun({ idempotency_key: key }, { i })));
    expect(new Set(byKey).size).toBe(1);
    expect((await db.pool.query('select count(*)::int as n from runledger.runs where idempotency_key = $1', [key])).rows[0].n).toBe(1);

    const runId = newRunId('id-race');
    const byId = await Promise.all(Array.from({ length: 8 }, (_, i) => startRun({ run_id: runId }, { i })));
    expect(byId).toEqual(Array.from({ length: 8 }, () => runId));
    expect((await events(runId)).map((e) => e.kind)).toEqual(['created']);
  });

  it('uses the version named in options, else the most recently registered one', async () => {
    await db.pool.query(`select runledger._register_workflow('multi', '1', 'q-one', 3)`);
    await db.pool.query(`select runledger._register_workflow('multi', '2', 'q-two', 5)`);
    const v1 = await notified(() => startRun({ version: '1' }, {}, db.pool, 'multi'));
    const latest = await notified(() => startRun({}, {}, db.pool, 'multi'));
    expect(await getRun(v1.result)).toMatchObject({ workflow_version: '1', queue_name: 'q-one', max_recovery_attempts: 3 });
    expect(await getRun(latest.result)).toMatchObject({ workflow_version: '2', queue_name: 'q-two', max_recovery_attempts: 5 });
    expect(v1.payloads).toEqual(['q-one']);
    expect(latest.payloads).toEqual(['q-two']);
    // Claimed only by a worker serving its queue and its workflow version.
    expect(await claimable(v1.result)).toMatchObject({ claimed: true });
    expect(await claimable(v1.result, { workflows: ['multi@2'] })).toMatchObject({ claimed: false });
    expect(await claimable(v1.result, { queues: ['q-two'] })).toMatchObject({ claimed: false });
    expect(await claimable(latest.result)).toMatchObject({ claimed: true });
    expect(await claimable(latest.result, { workflows: ['multi@1'] })).toMatchObject({ claimed: false });
    expect(await claimable(latest.result, { queues: ['q-one'] })).toMatchObject({ claimed: false });
  });

  it('accepts a deadline as an interval or as an ISO timestamp', async () => {
    await session(async (client) => {
      await setNow(client, '2040-03-04T05:06:07Z');
      const relative = await startRun({ deadline: '2 days' }, {}, client);
      const absolute = await startRun({ deadline: '2041-05-06T07:08:09Z' }, {}, client);
      const withOffset = await startRun({ deadline: '2041-05-06T09:08:09+02:00' }, {}, client);
      const none = await startRun({}, {}, client);
      const rel = await getRun(relative);
      expect(rel?.created_at.toISOString()).toBe('2040-03-04T05:06:07.000Z');
      expect(rel?.deadline_at.toISOString()).toBe('2040-03-06T05:06:07.000Z');
      expect((await getRun(absolute))?.deadline_at.toISOString()).toBe('2041-05-06T07:08:09.000Z');
      expect((await getRun(withOffset))?.deadline_at.toISOString()).toBe('2041-05-06T07:08:09.000Z');
      expect((await getRun(none))?.deadline_at).toBeNull();
    });
  });
});

// ---------------------------------------------------------------------------------------------

describe('claim / fence protocol (_claim_run, _checkpoint, _fence, _complete_run, _fail_run, _release_run)', () => {
  it('_claim_run takes a PENDING run once: fencing token 1, empty checkpoints, a lease and a claimed event', async () => {
    await session(async (client) => {
      await setNow(client, '2050-01-01T00:00:00Z');
      const runId = await startRun({}, { x: 1 }, client);
      const rows = await claim(runId, 'wk-claim', 30_000, client);
      expect(rows).toEqual([
        { run_id: runId, workflow_name: 'w', workflow_version: '1', input: { x: 1 }, fencing_token: 1, recovery_attempts: 0, checkpoints: [] },
      ]);
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-claim', fencing_token: 1 });
      expect(run?.lease_expires_at.toISOString()).toBe('2050-01-01T00:00:30.000Z');
      expect(run?.started_at.toISOString()).toBe('2050-01-01T00:00:00.000Z');
      expect(await events(runId)).toEqual([
        { kind: 'created', detail: { workflow: 'w', version: '1', queue: 'default' } },
        { kind: 'claimed', detail: { worker: 'wk-claim' } },
      ]);

      // Compare-and-set: a second claim (another worker, or a duplicate dispatch) gets nothing.
      expect(await claim(runId, 'wk-other', 30_000, client)).toEqual([]);
      expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-claim', fencing_token: 1 });
      expect((await events(runId)).map((e) => e.kind)).toEqual(['created', 'claimed']);
    });
  });

  it('_claim_run with p_reclaim takes back a run only from the same owner, with a new token', async () => {
    const runId = await startRun();
    const first = await claimOne(runId, 'wk-reclaim');
    await checkpoint(runId, first.fencing_token, 0, 'a', { output: 'kept' });
    // Without p_reclaim (default false) a RUNNING run is not claimable, even by its owner.
    expect(await claim(runId, 'wk-reclaim', 30_000, db.pool, false)).toEqual([]);
    // Another worker cannot take it with p_reclaim either.
    expect(await claim(runId, 'wk-thief', 30_000, db.pool, true)).toEqual([]);
    expect(await getRun(runId)).toMatchObject({ lease_owner: 'wk-reclaim', fencing_token: 1 });

    const again = await claim(runId, 'wk-reclaim', 30_000, db.pool, true);
    expect(again).toEqual([
      {
        run_id: runId, workflow_name: 'w', workflow_version: '1', input: { n: 1 }, fencing_token: 2, recovery_attempts: 0,
        checkpoints: [[0, 'a', 'SUCCEEDED', ['kept'], null, 'step']],
      },
    ]);
    // The first claim's token is now stale.
    expect(await sqlState(checkpoint(runId, first.fencing_token, 1, 'b'))).toBe('RL001');
    expect((await events(runId)).map((e) => e.kind)).toEqual(['created', 'claimed', 'claimed']);
  });

  it('_claim_run of an unknown run returns no row', async () => {
    expect(await claim('no-such-run')).toEqual([]);
  });

  it('only one of many concurrent claims wins', async () => {
    const runId = await startRun();
    const results = await Promise.all(Array.from({ length: 5 }, (_, i) => claim(runId, `wk-race-${i}`)));
    const winners = results.filter((rows) => rows.length === 1);
    expect(winners).toHaveLength(1);
    expect(winners[0]![0]!.fencing_token).toBe(1);
    expect((await events(runId)).filter((e) => e.kind === 'claimed')).toHaveLength(1);
  });

  it('_checkpoint with the current token inserts the step and returns the backend pid', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await session(async (client) => {
      const pid = (await client.query('select pg_backend_pid() as pid')).rows[0].pid;
      expect(await checkpoint(runId, fencing_token, 0, 'load', { output: { id: 7 }, on: client })).toBe(pid);
    });
    expect(await steps(runId)).toEqual([{ seq: 0, name: 'load', status: 'SUCCEEDED', fencing_token: 1 }]);
    const stored = await db.pool.query('select output from runledger.steps where run_id = $1 and seq = 0', [runId]);
    expect(stored.rows[0].output).toEqual({ id: 7 });
    // The checkpoint comes back with the next claim.
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, fencing_token]);
    expect((await claimOne(runId)).checkpoints).toEqual([[0, 'load', 'SUCCEEDED', [{ id: 7 }], null, 'step']]);
  });

  it('_checkpoint with a stale token (run taken over) raises RL001 and inserts nothing', async () => {
    const runId = await startRun();
    const first = await claimOne(runId, 'wk-old');
    await checkpoint(runId, first.fencing_token, 0, 'a');
    // The run is given back and claimed again: the old owner's token is now stale.
    expect((await db.pool.query(`select runledger._release_run($1, $2, 0, 'test') as ok`, [runId, first.fencing_token])).rows[0].ok).toBe(true);
    const second = await claimOne(runId, 'wk-new');
    expect(second.fencing_token).toBe(2);

    expect(await sqlState(checkpoint(runId, first.fencing_token, 1, 'b'))).toBe('RL001');
    expect(await steps(runId)).toEqual([{ seq: 0, name: 'a', status: 'SUCCEEDED', fencing_token: 1 }]);
    expect(await sqlState(db.pool.query('select runledger._fence($1, $2)', [runId, first.fencing_token]))).toBe('RL001');

    // The new owner writes normally.
    await checkpoint(runId, second.fencing_token, 1, 'b');
    expect((await steps(runId)).map((s) => [s.seq, s.fencing_token])).toEqual([[0, 1], [1, 2]]);
  });

  it('_checkpoint on a run that is not executing raises RL001', async () => {
    const pending = await startRun();
    expect(await sqlState(checkpoint(pending, 0, 0, 'a'))).toBe('RL001');
    expect(await steps(pending)).toEqual([]);
  });

  it('_checkpoint_outcome says whether a checkpoint committed and whether the caller still owns the run', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'a', { output: 'out' });
    const outcome = async (stepSeq: number, token: number) =>
      (await db.pool.query('select * from runledger._checkpoint_outcome($1, $2, $3)', [runId, stepSeq, token])).rows;
    expect(await outcome(0, fencing_token)).toEqual([{ committed: true, status: 'SUCCEEDED', output: ['out'], error: null, still_owner: true }]);
    expect(await outcome(1, fencing_token)).toEqual([{ committed: false, status: null, output: null, error: null, still_owner: true }]);
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, fencing_token]);
    await claimOne(runId, 'wk-next');
    expect(await outcome(1, fencing_token)).toEqual([{ committed: false, status: null, output: null, error: null, still_owner: false }]);
  });

  it('_complete_run: SUCCEEDED with output, COMPLETED and evidence {"steps": n}; a stale token raises RL001', async () => {
    await session(async (client) => {
      await setNow(client, '2050-02-01T00:00:00Z');
      const runId = await startRun({}, {}, client);
      const { fencing_token } = await claimOne(runId, 'wk-done', 30_000, client);
      await checkpoint(runId, fencing_token, 0, 'a', { on: client });
      await checkpoint(runId, fencing_token, 1, 'b', { on: client });
      await checkpoint(runId, fencing_token, 2, 'c', { on: client });

      expect(await sqlState(client.query(`select runledger._complete_run($1, $2, '{"no": 1}', 'p/1')`, [runId, fencing_token + 1]))).toBe('RL001');
      expect((await getRun(runId))?.status).toBe('RUNNING');

      await setNow(client, '2050-02-01T00:00:05Z');
      await client.query(`select runledger._complete_run($1, $2, '{"total": 3}', 'p/1')`, [runId, fencing_token]);
      const run = await getRun(runId);
      expect(run).toMatchObject({
        status: 'SUCCEEDED',
        output: { total: 3 },
        error: null,
        termination_reason: 'COMPLETED',
        termination_evidence: { steps: 3, budget_spent: 0 },
        // The policy the run was started under (its limits), not the caller's label.
        policy_version: expect.stringMatching(/^limits:[0-9a-f]{12}$/),
        lease_owner: null,
        lease_expires_at: null,
      });
      expect(run?.finished_at.toISOString()).toBe('2050-02-01T00:00:05.000Z');
      expect(run?.terminated_at.toISOString()).toBe('2050-02-01T00:00:05.000Z');
      expect((await events(runId)).at(-1)).toEqual({ kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence: { steps: 3, budget_spent: 0 } } });

      // Finished: the same token can neither complete again nor checkpoint.
      expect(await sqlState(client.query(`select runledger._complete_run($1, $2, 'null', 'p/1')`, [runId, fencing_token]))).toBe('RL001');
      expect(await sqlState(checkpoint(runId, fencing_token, 3, 'd', { on: client }))).toBe('RL001');
      expect((await getRun(runId))?.output).toEqual({ total: 3 });
    });
  });

  it('_fail_run: FAILED with the error and the FAILED termination record', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    const error = { name: 'Error', message: 'boom' };
    await db.pool.query(`select runledger._fail_run($1, $2, $3::jsonb, 'p/1')`, [runId, fencing_token, JSON.stringify(error)]);
    const run = await getRun(runId);
    expect(run).toMatchObject({ status: 'FAILED', error, output: null, termination_reason: 'FAILED', lease_owner: null });
    expect(run?.finished_at).toBeInstanceOf(Date);
    expect((await events(runId)).at(-1)).toEqual({ kind: 'failed', detail: { status: 'FAILED', reason: 'FAILED', error } });
  });

  it('_dead_letter_run: DEAD_LETTER with the reason and evidence, listed in runledger.dead_letter', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'alpha');
    const evidence = { seq: 0, expected: 'alpha', actual: 'beta' };
    await db.pool.query(`select runledger._dead_letter_run($1, $2, 'NON_DETERMINISM', $3::jsonb, 'p/1')`, [
      runId,
      fencing_token,
      JSON.stringify(evidence),
    ]);
    expect(await getRun(runId)).toMatchObject({ status: 'DEAD_LETTER', termination_reason: 'NON_DETERMINISM', termination_evidence: evidence });
    const view = await db.pool.query('select termination_reason, termination_evidence, steps_done::int from runledger.dead_letter where run_id = $1', [runId]);
    expect(view.rows).toEqual([{ termination_reason: 'NON_DETERMINISM', termination_evidence: evidence, steps_done: 1 }]);
  });

  it('_release_run: RUNNING -> PENDING, lease cleared, claimable again after the delay; only once per token', async () => {
    // A queue of its own, so that its next due time is this run's.
    const queue = newRunId('q-release');
    const runId = await startRun({ queue });
    const { fencing_token } = await claimOne(runId, 'wk-release');
    await checkpoint(runId, fencing_token, 0, 'a');
    expect(await claimable(runId)).toEqual({ claimed: false, nextDueAt: null }); // RUNNING under its lease

    const dbNow = (await db.pool.query('select now() as t')).rows[0].t as Date;
    const { result: released, payloads } = await notified(() =>
      db.pool.query(`select runledger._release_run($1, $2, 60000, 'shutdown') as ok`, [runId, fencing_token]),
    );
    const dbAfter = (await db.pool.query('select now() as t')).rows[0].t as Date;
    expect(released.rows[0].ok).toBe(true);
    const run = await getRun(runId);
    expect(run).toMatchObject({ status: 'PENDING', lease_owner: null, lease_expires_at: null, fencing_token: 1, recovery_attempts: 0 });
    expect((await events(runId)).at(-1)).toEqual({ kind: 'released', detail: { reason: 'shutdown', delay_ms: 60000, counts_attempt: false } });
    // Runnable again 60 s after the release, and announced with that due time (epoch ms).
    const notBefore = run!.not_before as Date;
    expect(notBefore.getTime()).toBeGreaterThanOrEqual(dbNow.getTime() + 60_000);
    expect(notBefore.getTime()).toBeLessThanOrEqual(dbAfter.getTime() + 60_000);
    expect(payloads).toHaveLength(1);
    expect(payloads[0]).toMatch(new RegExp(`^${queue}@\\d+$`));
    expect(Math.abs(Number(payloads[0]!.split('@')[1]) - notBefore.getTime())).toBeLessThanOrEqual(1);
    // Not claimable before then (the next due time says when), claimable after.
    expect(await claimable(runId)).toEqual({ claimed: false, nextDueAt: notBefore });
    await session(async (client) => {
      await setNow(client, new Date(notBefore.getTime() - 1_000).toISOString());
      expect(await claimable(runId, { on: client })).toEqual({ claimed: false, nextDueAt: notBefore });
      await setNow(client, new Date(notBefore.getTime() + 1).toISOString());
      expect(await claimable(runId, { on: client })).toEqual({ claimed: true, nextDueAt: null });
    });
    expect(await steps(runId)).toHaveLength(1);

    // The token is spent: a second release (or a late one from the old owner) does nothing.
    const again = await db.pool.query(`select runledger._release_run($1, $2, 0, 'shutdown') as ok`, [runId, fencing_token]);
    expect(again.rows[0].ok).toBe(false);
    expect((await events(runId)).filter((e) => e.kind === 'released')).toHaveLength(1);
  });
});

// ---------------------------------------------------------------------------------------------

describe('runledger._recover_expired', () => {
  it('sends a RUNNING run whose lease expired back to PENDING (one recovery attempt) and leaves a live lease alone', async () => {
    await session(async (client) => {
      await setNow(client, '2001-01-01T00:00:00Z');
      const expired = await startRun({}, {}, client);
      const live = await startRun({}, {}, client);
      const e = await claimOne(expired, 'wk-dead', 1_000, client);
      await checkpoint(expired, e.fencing_token, 0, 'a', { on: client });
      const l = await claimOne(live, 'wk-alive', 3_600_000, client);

      await setNow(client, '2001-01-01T00:00:02Z');
      // An expired lease alone does not make a run claimable: recovery does.
      expect((await claimable(expired, { on: client })).claimed).toBe(false);
      const { result: handled, payloads } = await notified(() => client.query('select runledger._recover_expired() as n'));
      expect(handled.rows[0].n).toBe(1);

      expect(await getRun(expired)).toMatchObject({
        status: 'PENDING',
        recovery_attempts: 1,
        lease_owner: null,
        lease_expires_at: null,
        fencing_token: 1,
        termination_reason: null,
      });
      expect(await steps(expired)).toHaveLength(1);
      expect((await events(expired)).at(-1)).toEqual({
        kind: 'lease_expired',
        detail: { last_owner: 'wk-dead', lease_expired_at: expect.any(String), recovery_attempt: 1 },
      });
      const detail = (await events(expired)).at(-1)!.detail;
      expect(new Date(detail.lease_expired_at).toISOString()).toBe('2001-01-01T00:00:01.000Z');
      // Announced to the workers of its queue (once: the live run was not touched), and claimable now.
      expect(payloads).toEqual(['default']);
      expect((await getRun(expired))?.not_before).toBeNull();
      expect((await claimable(expired, { on: client })).claimed).toBe(true);

      const untouched = await getRun(live);
      expect(untouched).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-alive', recovery_attempts: 0, fencing_token: 1 });
      expect(untouched?.lease_expires_at.toISOString()).toBe('2001-01-01T01:00:00.000Z');
      expect((await events(live)).map((ev) => ev.kind)).toEqual(['created', 'claimed']);
      expect((await claimable(live, { on: client })).claimed).toBe(false);

      // The recovered run is claimable again, with its checkpoint and a new token.
      const again = await claimOne(expired, 'wk-next', 1_000, client);
      expect(again).toMatchObject({ fencing_token: 2, recovery_attempts: 1 });
      expect(again.checkpoints).toEqual([[0, 'a', 'SUCCEEDED', null, null, 'step']]);

      // Leave nothing RUNNING on the fake 2001 clock for later sweeps.
      await client.query(`select runledger._release_run($1, $2, 0, 'test')`, [live, l.fencing_token]);
      await client.query(`select runledger._release_run($1, $2, 0, 'test')`, [expired, again.fencing_token]);
    });
  });

  it('dead-letters a run whose recovery_attempts already equal max_recovery_attempts, with MAX_RECOVERY_ATTEMPTS and evidence', async () => {
    await session(async (client) => {
      const base = Date.parse('2002-01-01T00:00:00Z');
      const at = (seconds: number) => new Date(base + seconds * 1000).toISOString();
      const runId = await startRun({}, {}, client); // workflow w: max_recovery_attempts 3
      let t = 0;
      for (let attempt = 1; attempt <= 3; attempt++) {
        await setNow(client, at(t));
        const claimed = await claimOne(runId, `wk-${attempt}`, 1_000, client);
        expect(claimed).toMatchObject({ fencing_token: attempt, recovery_attempts: attempt - 1 });
        await setNow(client, at(t + 2));
        expect((await client.query('select runledger._recover_expired() as n')).rows[0].n).toBe(1);
        expect(await getRun(runId)).toMatchObject({ status: 'PENDING', recovery_attempts: attempt });
        t += 10;
      }
      expect(await getRun(runId)).toMatchObject({ recovery_attempts: 3, max_recovery_attempts: 3 });

      // Attempts exhausted: the next expiry parks the run.
      await setNow(client, at(t));
      await claimOne(runId, 'wk-last', 1_000, client);
      await setNow(client, at(t + 2));
      const { result: swept, payloads } = await notified(() => client.query('select runledger._recover_expired() as n'));
      expect(swept.rows[0].n).toBe(1);

      const run = await getRun(runId);
      expect(run).toMatchObject({
        status: 'DEAD_LETTER',
        termination_reason: 'MAX_RECOVERY_ATTEMPTS',
        recovery_attempts: 3,
        lease_owner: null,
        lease_expires_at: null,
        policy_version: expect.stringMatching(/^limits:[0-9a-f]{12}$/),
      });
      expect(run?.finished_at.toISOString()).toBe(at(t + 2));
      expect(run?.terminated_at.toISOString()).toBe(at(t + 2));
      expect(run?.termination_evidence).toMatchObject({ recovery_attempts: 3, max_recovery_attempts: 3, last_owner: 'wk-last' });
      expect(new Date(run?.termination_evidence.lease_expired_at).toISOString()).toBe(at(t + 1));
      expect((await events(runId)).at(-1)).toEqual({
        kind: 'dead_lettered',
        detail: { reason: 'MAX_RECOVERY_ATTEMPTS', recovery_attempts: 3, last_owner: 'wk-last' },
      });
      // Out of the automatic path: not announced, and no worker claims it.
      expect(payloads).toEqual([]);
      expect((await claimable(runId, { on: client })).claimed).toBe(false);

      const view = await db.pool.query(
        'select run_id, termination_reason, termination_evidence, recovery_attempts, max_recovery_attempts from runledger.dead_letter where run_id = $1',
        [runId],
      );
      expect(view.rows).toEqual([
        {
          run_id: runId,
          termination_reason: 'MAX_RECOVERY_ATTEMPTS',
          termination_evidence: run?.termination_evidence,
          recovery_attempts: 3,
          max_recovery_attempts: 3,
        },
      ]);
      const active = await db.pool.query('select 1 from runledger.active where run_id = $1', [runId]);
      expect(active.rows).toEqual([]);
    });
  });

  it('marks a worker silent for two lease lengths as stopped', async () => {
    await session(async (client) => {
      await setNow(client, '2003-01-01T00:00:00Z');
      await client.query(`select runledger._register_worker('wk-silent', 'host', 1, '{w@1}', '{default}', 1, 1000)`);
      await client.query(`select runledger._register_worker('wk-chatty', 'host', 2, '{w@1}', '{default}', 1, 60000)`);
      await setNow(client, '2003-01-01T00:00:03Z');
      await client.query('select runledger._recover_expired()');
      const workers = await db.pool.query(
        `select worker_id, stopped_at from runledger.workers where worker_id in ('wk-silent', 'wk-chatty') order by worker_id`,
      );
      expect(workers.rows.map((w) => [w.worker_id, w.stopped_at?.toISOString() ?? null])).toEqual([
        ['wk-chatty', null],
        ['wk-silent', '2003-01-01T00:00:03.000Z'],
      ]);
    });
  });
});

// ---------------------------------------------------------------------------------------------

describe('claims in a queue with limits follow admission order', () => {
  it('_admit gives each run of a round its own admitted_at, in fair turns; a claim smaller than the round keeps that order', async () => {
    const queue = newRunId('fair-claim');
    await db.pool.query(`select runledger.set_queue($1, '{"concurrency": 4}'::jsonb)`, [queue]);
    // Tenant A's three runs are older than B's one, and A already runs one (claimed below).
    const a = [];
    for (let i = 0; i < 4; i++) a.push(await startRun({ queue, concurrency_key: 'tenant-a' }));
    const first = claimedIds(await claimBatch('wk-fair', [queue], ['w@1'], 1));
    expect(first).toHaveLength(1);
    await db.pool.query(`update runledger.runs set admitted = false, admitted_at = null where queue_name = $1 and status = 'PENDING'`, [queue]);
    const b = await startRun({ queue, concurrency_key: 'tenant-b' });
    await db.pool.query(`update runledger.runs set admitted = false, admitted_at = null where queue_name = $1 and status = 'PENDING'`, [queue]);

    expect((await db.pool.query(`select runledger._admit($1) as n`, [queue])).rows[0].n).toBe(3);
    const admitted = await db.pool.query(
      `select run_id, concurrency_key, admitted_at from runledger.runs where queue_name = $1 and status = 'PENDING' and admitted order by admitted_at`,
      [queue],
    );
    // B's first run has turn 1, A's next ones turns 2 and 3 (A already runs one): B first.
    expect(admitted.rows.map((r) => r.concurrency_key)).toEqual(['tenant-b', 'tenant-a', 'tenant-a']);
    // Three distinct times (microseconds apart, which JavaScript dates cannot show).
    const stamps = (await db.pool.query(
      `select count(distinct admitted_at)::int as n from runledger.runs where queue_name = $1 and status = 'PENDING' and admitted`, [queue],
    )).rows[0].n;
    expect(stamps).toBe(3);

    // One free slot: the claim takes B's run, the first admitted, although A's are older.
    expect(claimedIds(await claimBatch('wk-fair', [queue], ['w@1'], 1))).toEqual([b]);
    expect(claimedIds(await claimBatch('wk-fair', [queue], ['w@1'], 2))).toEqual(admitted.rows.slice(1).map((r) => r.run_id));
  });
});

describe('runledger._claim_batch', () => {
  // Every test has queues of its own (so other runs in this database are not in the way) and,
  // where leases are taken, a fake clock in the 2070s: those leases never expire on the real
  // clock or on the 2001-2004 clocks of the recovery sweeps above.
  beforeAll(async () => {
    await db.pool.query(`select runledger._register_workflow('cb-other', '1', 'default', 3)`);
    await db.pool.query(`select runledger._register_workflow('cb-other', '2', 'default', 3)`);
  });

  const at = (base: string, seconds: number) => new Date(Date.parse(base) + seconds * 1000).toISOString();
  const sentinel = (nextDueAt: Date | null): BatchRow => ({
    run_id: null,
    workflow_name: null,
    workflow_version: null,
    input: null,
    fencing_token: null,
    recovery_attempts: null,
    cancel_requested: null,
    checkpoints: null,
    next_due_at: nextDueAt,
  });
  const claimedEvents = async (runIds: string[]) =>
    (
      await db.pool.query(
        `select run_id, detail, fencing_token::int as fencing_token, at from runledger.events
          where run_id = any($1) and kind = 'claimed' order by event_id`,
        [runIds],
      )
    ).rows;

  it('claims up to the limit, lower priority first and then older: each RUNNING with a new token, a lease and a claimed event', async () => {
    await session(async (client) => {
      const T = '2070-01-01T00:00:00Z';
      const queue = newRunId('cb-order');
      await setNow(client, at(T, 0));
      const late = await startRun({ queue, priority: 5 }, { i: 'late' }, client);
      await setNow(client, at(T, 1));
      const older = await startRun({ queue }, { i: 'older' }, client);
      await setNow(client, at(T, 2));
      const newer = await startRun({ queue }, { i: 'newer' }, client);
      await setNow(client, at(T, 3));
      const urgent = await startRun({ queue, priority: -1 }, { i: 'urgent' }, client);

      await setNow(client, at(T, 10));
      const first = await claimBatch('wk-cb', [queue], ['w@1'], 2, { on: client });
      // The limit was reached: two runs, no sentinel row.
      expect(first).toHaveLength(2);
      expect(claimedIds(first).sort()).toEqual([urgent, older].sort());
      expect(first.find((r) => r.run_id === urgent)).toEqual({
        run_id: urgent,
        workflow_name: 'w',
        workflow_version: '1',
        input: { i: 'urgent' },
        fencing_token: 1,
        recovery_attempts: 0,
        cancel_requested: false,
        checkpoints: [],
        next_due_at: null,
      });
      for (const runId of [urgent, older]) {
        const run = await getRun(runId);
        expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-cb', fencing_token: 1 });
        expect(run?.lease_expires_at.toISOString()).toBe(at(T, 40));
        expect(run?.started_at.toISOString()).toBe(at(T, 10));
      }
      for (const runId of [newer, late]) expect(await getRun(runId)).toMatchObject({ status: 'PENDING', lease_owner: null, fencing_token: 0 });

      // One at a time, the others come in the same order.
      expect(await claimBatch('wk-cb', [queue], ['w@1'], 1, { on: client })).toEqual([expect.objectContaining({ run_id: newer, input: { i: 'newer' } })]);
      expect(await claimBatch('wk-cb', [queue], ['w@1'], 1, { on: client })).toEqual([expect.objectContaining({ run_id: late, input: { i: 'late' } })]);
      // Nothing left: only the sentinel row, with nothing due.
      expect(await claimBatch('wk-cb', [queue], ['w@1'], 3, { on: client })).toEqual([sentinel(null)]);

      // Each claim is in the history once, with the worker, the new token and the time.
      const claimed = await claimedEvents([late, older, newer, urgent]);
      expect(claimed.map((e) => e.run_id).sort()).toEqual([late, older, newer, urgent].sort());
      for (const event of claimed) {
        expect(event).toMatchObject({ detail: { worker: 'wk-cb' }, fencing_token: 1 });
        expect(event.at.toISOString()).toBe(at(T, 10));
      }
      expect((await events(urgent)).map((e) => e.kind)).toEqual(['created', 'claimed']);
    });
  });

  it('two claimers in open transactions never get the same run (SKIP LOCKED), and neither waits for the other', async () => {
    const queue = newRunId('cb-race');
    const runIds = [await startRun({ queue }), await startRun({ queue }), await startRun({ queue })];
    await session(async (a) => {
      await session(async (b) => {
        for (const client of [a, b]) {
          await setNow(client, '2071-01-01T00:00:00Z');
          // A claimer that waited for the other's locks would fail here instead of hanging.
          await client.query(`set statement_timeout = '5s'`);
          await client.query('begin');
        }
        const fromA = await claimBatch('wk-race-a', [queue], ['w@1'], 2, { on: a });
        const fromB = await claimBatch('wk-race-b', [queue], ['w@1'], 3, { on: b });
        expect(claimedIds(fromA)).toHaveLength(2);
        expect(claimedIds(fromB)).toHaveLength(1);
        expect(sentinels(fromB)).toEqual([sentinel(null)]);
        // A looks again while B still holds its run: nothing for A.
        expect(await claimBatch('wk-race-a', [queue], ['w@1'], 3, { on: a })).toEqual([sentinel(null)]);
        await a.query('commit');
        await b.query('commit');

        expect([...claimedIds(fromA), ...claimedIds(fromB)].sort()).toEqual([...runIds].sort());
        for (const runId of claimedIds(fromA)) expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-race-a', fencing_token: 1 });
        for (const runId of claimedIds(fromB)) expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-race-b', fencing_token: 1 });
        expect((await claimedEvents(runIds)).map((e) => e.run_id).sort()).toEqual([...runIds].sort());
      });
    });
  });

  it('many concurrent claimers: every run is claimed by exactly one of them', async () => {
    const queue = newRunId('cb-swarm');
    const runIds: string[] = [];
    for (let i = 0; i < 20; i++) runIds.push(await startRun({ queue }, { i }));
    const results = await Promise.all([1, 2, 3, 4].map((w) => claimBatch(`wk-swarm-${w}`, [queue], ['w@1'], 6)));
    const taken = results.flatMap(claimedIds);
    expect(new Set(taken).size).toBe(taken.length);
    const rest = claimedIds(await claimBatch('wk-swarm-last', [queue], ['w@1'], 20));
    expect([...taken, ...rest].sort()).toEqual([...runIds].sort());
    const claimed = await claimedEvents(runIds);
    expect(claimed.map((e) => e.run_id).sort()).toEqual([...runIds].sort());
    const owners = new Map<string, string>();
    results.forEach((rows, w) => claimedIds(rows).forEach((id) => owners.set(id, `wk-swarm-${w + 1}`)));
    rest.forEach((id) => owners.set(id, 'wk-swarm-last'));
    for (const event of claimed) expect(event.detail.worker, event.run_id).toBe(owners.get(event.run_id));
    const tokens = await db.pool.query(`select distinct status, fencing_token::int as t from runledger.runs where run_id = any($1)`, [runIds]);
    expect(tokens.rows).toEqual([{ status: 'RUNNING', t: 1 }]);
  });

  it('claims only runs of the given queues and workflow@version keys', async () => {
    await session(async (client) => {
      await setNow(client, '2072-01-01T00:00:00Z');
      const qa = newRunId('cb-qa');
      const qb = newRunId('cb-qb');
      const wInA = await startRun({ queue: qa }, {}, client);
      const wInB = await startRun({ queue: qb }, {}, client);
      const otherV1InA = await startRun({ queue: qa, version: '1' }, {}, client, 'cb-other');
      const otherV2InA = await startRun({ queue: qa, version: '2' }, {}, client, 'cb-other');

      expect(claimedIds(await claimBatch('wk-f', [qa], ['w@1'], 10, { on: client }))).toEqual([wInA]);
      expect(claimedIds(await claimBatch('wk-f', [qa], ['cb-other@2', 'w@2'], 10, { on: client }))).toEqual([otherV2InA]);
      expect(await claimBatch('wk-f', ['cb-nobody'], ['w@1', 'cb-other@1'], 10, { on: client })).toEqual([sentinel(null)]);
      expect(await claimBatch('wk-f', [qa, qb], [], 10, { on: client })).toEqual([sentinel(null)]);
      expect(await getRun(wInB)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
      expect(await getRun(otherV1InA)).toMatchObject({ status: 'PENDING', fencing_token: 0 });

      const both = await claimBatch('wk-f', [qa, qb], ['w@1', 'cb-other@1'], 10, { on: client });
      expect(claimedIds(both).sort()).toEqual([wInB, otherV1InA].sort());
      expect(both.find((r) => r.run_id === otherV1InA)).toMatchObject({ workflow_name: 'cb-other', workflow_version: '1' });
      for (const runId of [wInA, wInB, otherV1InA, otherV2InA]) {
        expect(await getRun(runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-f', fencing_token: 1 });
      }
    });
  });

  it('leaves a delayed start or a timer that is not due, and reports the earliest due time in the sentinel row', async () => {
    await session(async (client) => {
      const T = '2073-01-01T00:00:00Z';
      const queue = newRunId('cb-due');
      await setNow(client, at(T, 0));
      const start = await notified(() => startRun({ queue, run_at: at(T, 3600) }, {}, client));
      const delayed = start.result;
      expect((await getRun(delayed))?.not_before.toISOString()).toBe(at(T, 3600));
      expect(start.payloads).toEqual([`${queue}@${Date.parse(at(T, 3600))}`]);

      // A second run goes to sleep for 30 minutes.
      const sleeper = await startRun({ queue }, {}, client);
      expect(await claimBatch('wk-due', [queue], ['w@1'], 1, { on: client })).toEqual([expect.objectContaining({ run_id: sleeper, fencing_token: 1 })]);
      const parked = await notified(() =>
        client.query(`select done from runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 1800000}')`, [sleeper]),
      );
      expect(parked.result.rows).toEqual([{ done: false }]);
      expect(parked.payloads).toEqual([`${queue}@${Date.parse(at(T, 1800))}`]);
      expect(await getRun(sleeper)).toMatchObject({ status: 'WAITING', wait_kind: 'timer', lease_owner: null });

      expect(await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(new Date(at(T, 1800)))]);
      await setNow(client, at(T, 1799));
      expect(await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(new Date(at(T, 1800)))]);
      // The timer is due: the sleeper is claimed, and the delayed start is next.
      await setNow(client, at(T, 1800));
      const woke = await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(woke)).toEqual([sleeper]);
      expect(sentinels(woke)).toEqual([sentinel(new Date(at(T, 3600)))]);
      await setNow(client, at(T, 3599));
      expect(await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(new Date(at(T, 3600)))]);
      expect(await getRun(delayed)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
      await setNow(client, at(T, 3600));
      const started = await claimBatch('wk-due', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(started)).toEqual([delayed]);
      expect(sentinels(started)).toEqual([sentinel(null)]);
    });
  });

  it('claims a WAITING run whose timer is due in a queue without limits (RUNNING, token + 1); with limits it wakes it into admission', async () => {
    await session(async (client) => {
      const T = '2074-01-01T00:00:00Z';
      const queue = newRunId('cb-timer');
      await setNow(client, at(T, 0));
      const runId = await startRun({ queue }, { s: 1 }, client);
      await claimOne(runId, 'wk-sleep-1', 30_000, client);
      await client.query(`select runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 60000}')`, [runId]);
      expect(await getRun(runId)).toMatchObject({ status: 'WAITING', wait_kind: 'timer', fencing_token: 1 });

      await setNow(client, at(T, 61));
      const rows = await claimBatch('wk-sleep-2', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(rows)).toEqual([runId]);
      expect(rows.find((r) => r.run_id === runId)).toMatchObject({
        input: { s: 1 },
        fencing_token: 2,
        recovery_attempts: 0,
        cancel_requested: false,
        // The wait step comes back with the claim: replay finds its timer passed.
        checkpoints: [[0, 'nap', 'WAITING', [expect.objectContaining({ spec: { timeout_ms: 60000 } })], null, 'sleep']],
      });
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-sleep-2', fencing_token: 2, wait_kind: null, wait_key: null, wake_at: null });
      expect(run?.lease_expires_at.toISOString()).toBe(at(T, 91));
      expect((await events(runId)).map((e) => e.kind)).toEqual(['created', 'claimed', 'wait_started', 'claimed']);
      expect((await events(runId)).at(-1)).toEqual({ kind: 'claimed', detail: { worker: 'wk-sleep-2' } });

      // In a queue with a concurrency limit of 1, whose slot another run holds, the due timer
      // only wakes the run: PENDING, waiting for admission, not claimed.
      const limited = newRunId('cb-timer-limited');
      await client.query(`select runledger.set_queue($1, '{"concurrency": 1}')`, [limited]);
      await setNow(client, at(T, 100));
      const sleeper = await startRun({ queue: limited }, {}, client);
      expect(claimedIds(await claimBatch('wk-sleep-1', [limited], ['w@1'], 5, { on: client }))).toEqual([sleeper]);
      await client.query(`select runledger._wait($1, 1, 0, 'nap', 'sleep', '{"timeout_ms": 60000}')`, [sleeper]);
      const holder = await startRun({ queue: limited }, {}, client);
      expect(claimedIds(await claimBatch('wk-sleep-1', [limited], ['w@1'], 5, { on: client }))).toEqual([holder]);
      await setNow(client, at(T, 161));
      expect(await claimBatch('wk-sleep-2', [limited], ['w@1'], 5, { on: client })).toEqual([sentinel(null)]);
      expect(await getRun(sleeper)).toMatchObject({ status: 'PENDING', admitted: false, wait_kind: null, wake_at: null, fencing_token: 1 });
      expect((await events(sleeper)).map((e) => e.kind)).toEqual(['created', 'claimed', 'wait_started', 'woken']);
    });
  });

  it('ends a PENDING run past its deadline TERMINATED (DEADLINE) instead of claiming it', async () => {
    await session(async (client) => {
      const T = '2075-01-01T00:00:00Z';
      const queue = newRunId('cb-deadline');
      await setNow(client, at(T, 0));
      const late = await startRun({ queue, deadline: '1 minute' }, {}, client);
      const onTime = await startRun({ queue, deadline: '1 hour' }, {}, client);

      await setNow(client, at(T, 120));
      const rows = await claimBatch('wk-dl', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(rows)).toEqual([onTime]);
      const run = await getRun(late);
      expect(run).toMatchObject({ status: 'TERMINATED', termination_reason: 'DEADLINE', lease_owner: null, fencing_token: 0 });
      expect(run?.finished_at.toISOString()).toBe(at(T, 120));
      expect(new Date(run?.termination_evidence.deadline_at).toISOString()).toBe(at(T, 60));
      expect(new Date(run?.termination_evidence.noticed_at).toISOString()).toBe(at(T, 120));
      expect((await events(late)).map((e) => e.kind)).toEqual(['created', 'deadline']);
      expect(await claimedEvents([late])).toEqual([]);
    });
  });

  // Runs past their deadline are terminated at most p_limit per queue and call; the ones left
  // over must still never be claimed (as _claim_run never claims one).
  it('claims no run past its deadline, however many of them there are', async () => {
    await session(async (client) => {
      const T = '2075-06-01T00:00:00Z';
      const queue = newRunId('cb-deadlines');
      await setNow(client, at(T, 0));
      const runIds = [await startRun({ queue, deadline: '1 minute' }, {}, client), await startRun({ queue, deadline: '1 minute' }, {}, client)];

      await setNow(client, at(T, 120));
      const rows = await claimBatch('wk-dl', [queue], ['w@1'], 1, { on: client });
      expect(claimedIds(rows)).toEqual([]);
      const statuses = await db.pool.query(`select run_id, status from runledger.runs where run_id = any($1) order by run_id`, [runIds]);
      for (const row of statuses.rows) expect(['PENDING', 'TERMINATED'], row.run_id).toContain(row.status);
      expect(await claimedEvents(runIds)).toEqual([]);
    });
  });

  it('claims a CANCELLING run without an owner (compensations to run) and says so with cancel_requested', async () => {
    await session(async (client) => {
      const T = '2076-01-01T00:00:00Z';
      const queue = newRunId('cb-cancel');
      await setNow(client, at(T, 0));
      const runId = await startRun({ queue }, {}, client);
      const { fencing_token } = await claimOne(runId, 'wk-saga-1', 30_000, client);
      // A compensable operation succeeded, then the run was given back.
      const op = await client.query(
        `select operation_id from runledger._operation_begin($1, $2, 0, 'charge', $3, true, false)`,
        [runId, fencing_token, `charge-${runId}`],
      );
      await client.query(`select runledger._operation_finish($1, $2, $3, 'SUCCEEDED', '{"charged": 1}', null, null, null)`, [
        runId,
        fencing_token,
        op.rows[0].operation_id,
      ]);
      await checkpoint(runId, fencing_token, 0, 'charge', { output: { charged: 1 }, on: client });
      await client.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, fencing_token]);

      const cancel = await notified(() => client.query(`select runledger.cancel_run($1, 'changed my mind') as status`, [runId]));
      expect(cancel.result.rows[0].status).toBe('CANCELLING');
      expect(cancel.payloads).toEqual([queue]);
      expect(await getRun(runId)).toMatchObject({ status: 'CANCELLING', lease_owner: null, fencing_token: 1 });

      await setNow(client, at(T, 5));
      const rows = await claimBatch('wk-saga-2', [queue], ['w@1'], 5, { on: client });
      expect(claimedIds(rows)).toEqual([runId]);
      expect(rows.find((r) => r.run_id === runId)).toMatchObject({
        fencing_token: 2,
        cancel_requested: true,
        checkpoints: [[0, 'charge', 'SUCCEEDED', [{ charged: 1 }], null, 'step']],
      });
      const run = await getRun(runId);
      expect(run).toMatchObject({ status: 'CANCELLING', lease_owner: 'wk-saga-2', fencing_token: 2, cancel_reason: 'changed my mind' });
      expect(run?.lease_expires_at.toISOString()).toBe(at(T, 35));
      expect((await events(runId)).at(-1)).toEqual({ kind: 'claimed', detail: { worker: 'wk-saga-2' } });
      // It has an owner now: nobody else claims it.
      expect(await claimBatch('wk-saga-3', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(null)]);
    });
  });

  it('with p_reclaim_except takes back first this worker\'s RUNNING runs it is not executing, with a new token, never another worker\'s', async () => {
    await session(async (client) => {
      const T = '2077-01-01T00:00:00Z';
      const queue = newRunId('cb-reclaim');
      await setNow(client, at(T, 0));
      const executing = await startRun({ queue }, {}, client);
      const lost = await startRun({ queue }, {}, client);
      const theirs = await startRun({ queue }, {}, client);
      expect(claimedIds(await claimBatch('wk-re', [queue], ['w@1'], 2, { on: client })).sort()).toEqual([executing, lost].sort());
      expect(claimedIds(await claimBatch('wk-re-other', [queue], ['w@1'], 2, { on: client }))).toEqual([theirs]);
      await checkpoint(lost, 1, 0, 'a', { output: 'kept', on: client });
      // Without p_reclaim_except a worker's own RUNNING runs are not claimed again.
      expect(await claimBatch('wk-re', [queue], ['w@1'], 5, { on: client })).toEqual([sentinel(null)]);

      const fresh = await startRun({ queue }, {}, client);
      await setNow(client, at(T, 10));
      // Limit 1: the lost claim is taken back before the PENDING run.
      const reclaimed = await claimBatch('wk-re', [queue], ['w@1'], 1, { on: client, reclaimExcept: [executing] });
      expect(reclaimed).toEqual([
        {
          run_id: lost,
          workflow_name: 'w',
          workflow_version: '1',
          input: {},
          fencing_token: 2,
          recovery_attempts: 0,
          cancel_requested: false,
          checkpoints: [[0, 'a', 'SUCCEEDED', ['kept'], null, 'step']],
          next_due_at: null,
        },
      ]);
      expect(await getRun(lost)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-re', fencing_token: 2 });
      expect((await getRun(lost))?.lease_expires_at.toISOString()).toBe(at(T, 40));
      expect(await getRun(executing)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-re', fencing_token: 1 });
      expect(await getRun(theirs)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-re-other', fencing_token: 1 });
      expect(await getRun(fresh)).toMatchObject({ status: 'PENDING', fencing_token: 0 });
      // The earlier claim's token is stale now.
      expect(await sqlState(checkpoint(lost, 1, 1, 'b', { on: client }))).toBe('RL001');
      expect((await events(lost)).map((e) => e.kind)).toEqual(['created', 'claimed', 'claimed']);

      // Another worker reclaiming (nothing excepted) never gets runs it does not own: only the PENDING one.
      const thief = await claimBatch('wk-re-thief', [queue], ['w@1'], 5, { on: client, reclaimExcept: [] });
      expect(claimedIds(thief)).toEqual([fresh]);
      expect(await getRun(theirs)).toMatchObject({ lease_owner: 'wk-re-other', fencing_token: 1 });
      expect(await getRun(executing)).toMatchObject({ lease_owner: 'wk-re', fencing_token: 1 });
      expect(await getRun(lost)).toMatchObject({ lease_owner: 'wk-re', fencing_token: 2 });
    });
  });

  it('raises RL003 for a limit below 1 (or none) and claims nothing', async () => {
    const queue = newRunId('cb-limit');
    const runId = await startRun({ queue });
    for (const limit of [0, -1, null]) expect(await sqlState(claimBatch('wk-limit', [queue], ['w@1'], limit)), String(limit)).toBe('RL003');
    expect(await getRun(runId)).toMatchObject({ status: 'PENDING', lease_owner: null, fencing_token: 0 });
    expect((await events(runId)).map((e) => e.kind)).toEqual(['created']);
  });

  it('raises RL003 for null queues or workflows and claims nothing', async () => {
    const queue = newRunId('cb-null');
    const runId = await startRun({ queue });
    const raw = (queues: string[] | null, workflows: string[] | null) =>
      db.pool.query(`select * from runledger._claim_batch('wk-null', $1, $2, 5, 30000)`, [queues, workflows]);
    expect(await sqlState(raw(null, ['w@1']))).toBe('RL003');
    expect(await sqlState(raw([queue], null))).toBe('RL003');
    expect(await getRun(runId)).toMatchObject({ status: 'PENDING', lease_owner: null, fencing_token: 0 });
  });
});

describe('runledger._commit_batch input', () => {
  it('raises RL003 for items that are not a JSON array, and writes nothing', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    const item = { op: 'checkpoint', run_id: runId, token, seq: 0, name: 's0', kind: 'step', status: 'SUCCEEDED', attempts: 1, started_at: new Date().toISOString(), charge: 0 };
    for (const items of [item, 'text', null]) {
      const state = await sqlState(db.pool.query('select * from runledger._commit_batch($1::jsonb)', [items === null ? null : JSON.stringify(items)]));
      expect(state, JSON.stringify(items)).toBe('RL003');
    }
    expect(await steps(runId)).toEqual([]);
  });
});

// ---------------------------------------------------------------------------------------------

describe('runledger.retry_run', () => {
  it('brings a DEAD_LETTER run back to PENDING with checkpoints intact and the old termination record in a retried event', async () => {
    await session(async (client) => {
      const runId = await startRun({ max_recovery_attempts: 1 }, {}, client);
      // Claimed, two checkpoints, lease expires (recovery 1), claimed again, expires again: dead-lettered.
      await setNow(client, '2002-06-01T00:00:00Z');
      const c1 = await claimOne(runId, 'wk-a', 1_000, client);
      await checkpoint(runId, c1.fencing_token, 0, 'a', { output: 1, on: client });
      await checkpoint(runId, c1.fencing_token, 1, 'b', { output: 2, on: client });
      await setNow(client, '2002-06-01T00:00:02Z');
      await client.query('select runledger._recover_expired()');
      await claimOne(runId, 'wk-b', 1_000, client);
      await setNow(client, '2002-06-01T00:00:04Z');
      await client.query('select runledger._recover_expired()');
      const dead = await getRun(runId);
      expect(dead).toMatchObject({ status: 'DEAD_LETTER', recovery_attempts: 1, termination_reason: 'MAX_RECOVERY_ATTEMPTS' });
      expect((await claimable(runId, { on: client })).claimed).toBe(false);

      const { result, payloads } = await notified(() => client.query('select runledger.retry_run($1) as status', [runId]));
      expect(result.rows[0].status).toBe('PENDING');

      expect(await getRun(runId)).toMatchObject({
        status: 'PENDING',
        recovery_attempts: 0,
        termination_reason: null,
        termination_evidence: null,
        terminated_at: null,
        finished_at: null,
        policy_version: expect.stringMatching(/^limits:/), // the run keeps the policy it started under
        error: null,
        output: null,
        lease_owner: null,
      });
      expect((await steps(runId)).map((s) => [s.seq, s.name, s.status])).toEqual([
        [0, 'a', 'SUCCEEDED'],
        [1, 'b', 'SUCCEEDED'],
      ]);
      expect((await events(runId)).at(-1)).toEqual({
        kind: 'retried',
        detail: {
          previous_status: 'DEAD_LETTER',
          termination_reason: 'MAX_RECOVERY_ATTEMPTS',
          termination_evidence: dead?.termination_evidence,
        },
      });
      // Announced to the workers of its queue, and claimable at once.
      expect(payloads).toEqual(['default']);
      expect((await claimable(runId, { on: client })).claimed).toBe(true);
      expect(await db.pool.query('select 1 from runledger.dead_letter where run_id = $1', [runId]).then((r) => r.rows)).toEqual([]);

      // The next claim resumes from the checkpoints with a new token.
      const resumed = await claimOne(runId, 'wk-c', 30_000, client);
      expect(resumed).toMatchObject({ fencing_token: 3, recovery_attempts: 0 });
      expect(resumed.checkpoints).toEqual([
        [0, 'a', 'SUCCEEDED', [1], null, 'step'],
        [1, 'b', 'SUCCEEDED', [2], null, 'step'],
      ]);
    });
  });

  it('brings a FAILED run back to PENDING, removing only its last (failed) step', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'a', { output: 'ok' });
    await checkpoint(runId, fencing_token, 1, 'b', { output: 'ok' });
    const stepError = { name: 'Error', message: 'upstream said no' };
    await checkpoint(runId, fencing_token, 2, 'c', { status: 'FAILED', error: stepError });
    const runError = { name: 'StepFailedError', message: 'step "c" failed' };
    await db.pool.query(`select runledger._fail_run($1, $2, $3::jsonb, 'p/1')`, [runId, fencing_token, JSON.stringify(runError)]);

    expect((await db.pool.query('select runledger.retry_run($1) as status', [runId])).rows[0].status).toBe('PENDING');
    expect(await getRun(runId)).toMatchObject({ status: 'PENDING', error: null, termination_reason: null, finished_at: null });
    expect((await steps(runId)).map((s) => [s.seq, s.name, s.status])).toEqual([
      [0, 'a', 'SUCCEEDED'],
      [1, 'b', 'SUCCEEDED'],
    ]);
    expect((await events(runId)).at(-1)).toEqual({
      kind: 'retried',
      detail: {
        previous_status: 'FAILED',
        termination_reason: 'FAILED',
        error: runError,
        dropped_failed_step: { seq: 2, name: 'c', error: stepError },
      },
    });
  });

  it('keeps an earlier failed step that the workflow caught when the last step succeeded', async () => {
    const runId = await startRun();
    const { fencing_token } = await claimOne(runId);
    await checkpoint(runId, fencing_token, 0, 'caught', { status: 'FAILED', error: { message: 'nope' } });
    await checkpoint(runId, fencing_token, 1, 'after', { output: 'fine' });
    await db.pool.query(`select runledger._fail_run($1, $2, '{"message": "thrown outside a step"}', 'p/1')`, [runId, fencing_token]);

    await db.pool.query('select runledger.retry_run($1)', [runId]);
    expect((await steps(runId)).map((s) => [s.seq, s.name, s.status])).toEqual([
      [0, 'caught', 'FAILED'],
      [1, 'after', 'SUCCEEDED'],
    ]);
    expect((await events(runId)).at(-1)?.detail).not.toHaveProperty('dropped_failed_step');
  });

  it('raises RL005 for a SUCCEEDED or RUNNING run and changes nothing', async () => {
    const done = await startRun();
    const c = await claimOne(done);
    await db.pool.query(`select runledger._complete_run($1, $2, '"out"', 'p/1')`, [done, c.fencing_token]);
    const running = await startRun();
    await claimOne(running);

    expect(await sqlState(db.pool.query('select runledger.retry_run($1)', [done]))).toBe('RL005');
    expect(await sqlState(db.pool.query('select runledger.retry_run($1)', [running]))).toBe('RL005');
    expect(await getRun(done)).toMatchObject({ status: 'SUCCEEDED', output: 'out', termination_reason: 'COMPLETED' });
    expect(await getRun(running)).toMatchObject({ status: 'RUNNING' });
    expect((await events(done)).map((e) => e.kind)).toEqual(['created', 'claimed', 'completed']);
  });

  it('raises RL002 for an unknown run', async () => {
    expect(await sqlState(db.pool.query('select runledger.retry_run($1)', ['no-such-run']))).toBe('RL002');
  });
});

// ---------------------------------------------------------------------------------------------

describe('runledger._heartbeat', () => {
  it('renews only the leases of runs this worker owns and returns their ids', async () => {
    await session(async (client) => {
      await setNow(client, '2060-01-01T00:00:00Z');
      await client.query(`select runledger._register_worker('wk-hb-a', 'host', 1, '{w@1}', '{default}', 2, 10000)`);
      const mine1 = await startRun({}, {}, client);
      const mine2 = await startRun({}, {}, client);
      const finished = await startRun({}, {}, client);
      const theirs = await startRun({}, {}, client);
      const pending = await startRun({}, {}, client);
      await claimOne(mine1, 'wk-hb-a', 10_000, client);
      await claimOne(mine2, 'wk-hb-a', 10_000, client);
      const f = await claimOne(finished, 'wk-hb-a', 10_000, client);
      await client.query(`select runledger._complete_run($1, $2, 'null', 'p/1')`, [finished, f.fencing_token]);
      await claimOne(theirs, 'wk-hb-b', 10_000, client);

      await setNow(client, '2060-01-01T00:00:05Z');
      const renewed = (await client.query(`select runledger._heartbeat('wk-hb-a', 60000) as ids`)).rows[0].ids as string[];
      expect([...renewed].sort()).toEqual([mine1, mine2].sort());

      const leases = await db.pool.query(
        `select run_id, status, lease_owner, lease_expires_at from runledger.runs where run_id = any($1)`,
        [[mine1, mine2, finished, theirs, pending]],
      );
      const byId = new Map(leases.rows.map((r) => [r.run_id, r]));
      expect(byId.get(mine1)?.lease_expires_at.toISOString()).toBe('2060-01-01T00:01:05.000Z');
      expect(byId.get(mine2)?.lease_expires_at.toISOString()).toBe('2060-01-01T00:01:05.000Z');
      expect(byId.get(theirs)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-hb-b' });
      expect(byId.get(theirs)?.lease_expires_at.toISOString()).toBe('2060-01-01T00:00:10.000Z');
      expect(byId.get(finished)).toMatchObject({ status: 'SUCCEEDED', lease_owner: null, lease_expires_at: null });
      expect(byId.get(pending)).toMatchObject({ status: 'PENDING', lease_owner: null, lease_expires_at: null });

      const worker = await db.pool.query(`select last_heartbeat_at from runledger.workers where worker_id = 'wk-hb-a'`);
      expect(worker.rows[0].last_heartbeat_at.toISOString()).toBe('2060-01-01T00:00:05.000Z');

      // A worker holding nothing gets an empty list.
      expect((await client.query(`select runledger._heartbeat('wk-hb-none', 60000) as ids`)).rows[0].ids).toEqual([]);
    });
  });
});

// ---------------------------------------------------------------------------------------------

describe('runledger.now()', () => {
  it('returns runledger.fake_now when set, in the session and in defaults of rows written there', async () => {
    await session(async (client) => {
      await setNow(client, '2031-02-03T04:05:06.789Z');
      const now = (await client.query('select runledger.now() as t')).rows[0].t as Date;
      expect(now.toISOString()).toBe('2031-02-03T04:05:06.789Z');
      const runId = await startRun({}, {}, client);
      expect((await getRun(runId))?.created_at.toISOString()).toBe('2031-02-03T04:05:06.789Z');
    });
  });

  it('is the real clock when fake_now is unset or empty', async () => {
    await session(async (client) => {
      const read = async () => (await client.query('select runledger.now() as fake, clock_timestamp() as real')).rows[0];
      const unset = await read();
      expect(Math.abs(unset.fake.getTime() - unset.real.getTime())).toBeLessThan(1_000);

      await setNow(client, '2031-02-03T04:05:06Z');
      expect((await read()).fake.toISOString()).toBe('2031-02-03T04:05:06.000Z');
      await setNow(client, '');
      const empty = await read();
      expect(Math.abs(empty.fake.getTime() - empty.real.getTime())).toBeLessThan(1_000);
    });
  });

  it('honours set local inside a transaction only', async () => {
    await session(async (client) => {
      await client.query('begin');
      await client.query(`set local runledger.fake_now = '2032-01-01T00:00:00Z'`);
      expect((await client.query('select runledger.now() as t')).rows[0].t.toISOString()).toBe('2032-01-01T00:00:00.000Z');
      await client.query('commit');
      const after = (await client.query('select runledger.now() as fake, clock_timestamp() as real')).rows[0];
      expect(Math.abs(after.fake.getTime() - after.real.getTime())).toBeLessThan(1_000);
    });
  });
});

// ---------------------------------------------------------------------------------------------

describe('runs check constraints', () => {
  const insert = (runId: string, columns: Record<string, unknown>) => {
    const all = { run_id: runId, workflow_name: 'w', workflow_version: '1', queue_name: 'default', ...columns };
    const names = Object.keys(all);
    return db.pool.query(
      `insert into runledger.runs (${names.join(', ')}) values (${names.map((_, i) => `$${i + 1}`).join(', ')})`,
      Object.values(all),
    );
  };
  const violation = async (promise: Promise<unknown>) => {
    try {
      await promise;
    } catch (error) {
      const e = error as { code?: string; constraint?: string };
      return { code: e.code, constraint: e.constraint };
    }
    throw new Error('expected a check violation, but the statement succeeded');
  };

  it('rejects a RUNNING run without lease_owner (and accepts one with its lease)', async () => {
    expect(await violation(insert(newRunId('c-running'), { status: 'RUNNING', lease_expires_at: new Date() }))).toEqual({
      code: '23514',
      constraint: 'runs_lease_only_when_executing',
    });
    // The same move by update on an existing run.
    const runId = await startRun();
    expect(await violation(db.pool.query(`update runledger.runs set status = 'RUNNING' where run_id = $1`, [runId]))).toEqual({
      code: '23514',
      constraint: 'runs_lease_only_when_executing',
    });
    // Control: with owner and expiry it is a valid row.
    const ok = newRunId('c-running-ok');
    await insert(ok, { status: 'RUNNING', lease_owner: 'wk', lease_expires_at: new Date() });
    expect((await getRun(ok))?.status).toBe('RUNNING');
  });

  it('rejects a lease on a run that is not executing', async () => {
    expect(await violation(insert(newRunId('c-pending'), { status: 'PENDING', lease_owner: 'wk', lease_expires_at: new Date() }))).toEqual({
      code: '23514',
      constraint: 'runs_lease_only_when_executing',
    });
  });

  it('rejects a terminal status without termination_reason (and accepts one with its record)', async () => {
    for (const status of ['SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER']) {
      expect(await violation(insert(newRunId('c-terminal'), { status, finished_at: new Date() })), status).toEqual({
        code: '23514',
        constraint: 'runs_terminal_has_record',
      });
    }
    const runId = await startRun();
    expect(
      await violation(db.pool.query(`update runledger.runs set status = 'SUCCEEDED', finished_at = now() where run_id = $1`, [runId])),
    ).toEqual({ code: '23514', constraint: 'runs_terminal_has_record' });
    const ok = newRunId('c-terminal-ok');
    await insert(ok, { status: 'SUCCEEDED', finished_at: new Date(), termination_reason: 'COMPLETED' });
    expect((await getRun(ok))?.status).toBe('SUCCEEDED');
  });

  it('rejects a termination_reason outside the documented list', async () => {
    expect(await violation(insert(newRunId('c-reason'), { status: 'FAILED', finished_at: new Date(), termination_reason: 'OOPS' }))).toEqual({
      code: '23514',
      constraint: 'runs_termination_reason_check',
    });
  });
});

// ---------------------------------------------------------------------------------------------
// Group commit and the completion fast path (sql/0011_hot_path.sql)

interface BatchResultRow {
  item: number;
  code: string | null;
  message: string | null;
  run_status: string | null;
}

/** runledger._commit_batch over a JSON array of items (plain objects here). */
async function commitBatch(items: unknown[], on: Queryable = db.pool): Promise<BatchResultRow[]> {
  const result = await on.query('select item, code, message, run_status from runledger._commit_batch($1::jsonb)', [JSON.stringify(items)]);
  return result.rows;
}

/** The step fields of a batch item: a SUCCEEDED 'step' at its first attempt, started now, no charge. */
function stepItem(runId: string, token: number, stepSeq: number, name: string, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    run_id: runId, token, seq: stepSeq, name, kind: 'step', status: 'SUCCEEDED', attempts: 1,
    started_at: new Date().toISOString(), charge: 0, ...extra,
  };
}

async function stepRows(runId: string): Promise<Array<Record<string, any>>> {
  const result = await db.pool.query(
    `select seq, name, kind, status, output, error, attempts, fencing_token::int as fencing_token, output_hash
       from runledger.steps where run_id = $1 order by seq`,
    [runId],
  );
  return result.rows;
}

/** Everything a failed commit must not have touched: the run row, its steps and its events. */
async function snapshot(runId: string): Promise<{ run: Record<string, any> | undefined; steps: unknown[]; events: unknown[] }> {
  return { run: await getRun(runId), steps: await stepRows(runId), events: await events(runId) };
}

/** A run claimed, given back and claimed again: its first token (1) is stale, its current one is 2. */
async function reclaimedRun(options: Record<string, unknown> = {}, on: Queryable = db.pool): Promise<{ runId: string; stale: number; token: number }> {
  const runId = await startRun(options, { n: 1 }, on);
  const first = await claimOne(runId, 'wk-first', 30_000, on);
  await on.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, first.fencing_token]);
  const second = await claimOne(runId, 'wk-second', 30_000, on);
  expect(second.fencing_token).toBe(first.fencing_token + 1);
  return { runId, stale: first.fencing_token, token: second.fencing_token };
}

describe('runledger._commit_batch', () => {
  it('writes the common items together (_commit_fast) with the results one-by-one writes give, and the rest one by one', async () => {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      // X: a plain checkpoint. Y: a completion with its last step. Z: the same, at a seq
      // that a durable retry left WAITING (counted once). W: a stale token (the careful path).
      const x = await startRun();
      const tx = (await claimOne(x)).fencing_token;
      const y = await startRun();
      const ty = (await claimOne(y)).fencing_token;
      await checkpoint(y, ty, 0, 'y0');
      const z = await startRun();
      const tz = (await claimOne(z)).fencing_token;
      await db.pool.query(`select runledger._retry_wait($1, $2, 0, 'z0', 'step', 1, 1)`, [z, tz]);
      await db.pool.query(`update runledger.runs set status = 'RUNNING', wait_kind = null, wait_key = null, wake_at = null,
                                  lease_owner = 'wk-1', lease_expires_at = runledger.now() + interval '1 minute' where run_id = $1`, [z]);
      expect((await stepRows(z)).map((row) => row.status)).toEqual(['WAITING']);
      const w = await reclaimedRun();
      // P waits for its child C; C completes in the batch and wakes P.
      const p = await startRun();
      const tp = (await claimOne(p)).fencing_token;
      const c = (await db.pool.query(`select runledger._start_child($1, $2, 0, 'child', 'w', '{}'::jsonb, '{}'::jsonb) as id`, [p, tp])).rows[0].id;
      await db.pool.query(`select * from runledger._wait($1, $2, 1, 'wait-child', 'child', jsonb_build_object('child_run_id', $3::text))`, [p, tp, c]);
      expect((await getRun(p))?.status).toBe('WAITING');
      const tc = (await claimOne(c)).fencing_token;

      await client.query(`set track_functions = 'pl'`);
      await client.query('begin');
      const rows = (await commitBatch([
        { op: 'checkpoint', ...stepItem(x, tx, 0, 'x0', { output: { x: 1 } }) },
        { op: 'complete', ...stepItem(y, ty, 1, 'y1', { step_output: 'last' }), output: { done: 'Y' }, policy_version: 'p/1' },
        { op: 'complete', ...stepItem(z, tz, 0, 'z0', { step_output: 'after retry', attempts: 2 }), output: null, policy_version: 'p/1' },
        { op: 'complete', ...stepItem(w.runId, w.stale, 1, 'w1'), output: 1, policy_version: 'p/1' },
        { op: 'complete', ...stepItem(c, tc, 0, 'c0', { step_output: 7 }), output: { child: true }, policy_version: 'p/1' },
      ], client));
      const calls = await client.query(
        `select p.proname, coalesce(pg_stat_get_xact_function_calls(p.oid), 0)::int as n
           from pg_proc p where p.pronamespace = 'runledger'::regnamespace
            and p.proname in ('_commit_fast', '_checkpoint_row', '_complete_with_checkpoint') order by 1`,
      );
      await client.query('commit');
      expect(rows.map((row) => [row.item, row.code, row.run_status])).toEqual([
        [0, null, 'RUNNING'], [1, null, null], [2, null, null], [3, 'RL001', null], [4, null, null],
      ]);
      // One fast call wrote X, Y, Z and C: none of them went through the one-by-one functions.
      // (W did, and failed its fence there: a call that raises is not counted.)
      expect(Object.fromEntries(calls.rows.map((row) => [row.proname, row.n]))).toEqual({
        _commit_fast: 1, _checkpoint_row: 0, _complete_with_checkpoint: 0,
      });

      expect(await stepRows(x)).toEqual([
        { seq: 0, name: 'x0', kind: 'step', status: 'SUCCEEDED', output: { x: 1 }, error: null, attempts: 1, fencing_token: tx, output_hash: null },
      ]);
      expect((await getRun(x))?.status).toBe('RUNNING');
      expect(await getRun(y)).toMatchObject({
        status: 'SUCCEEDED', output: { done: 'Y' }, termination_reason: 'COMPLETED', policy_version: expect.any(String),
        termination_evidence: { steps: 2, budget_spent: 0 }, lease_owner: null, lease_expires_at: null,
      });
      expect((await events(y)).filter((e) => e.kind === 'completed')).toEqual([
        { kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence: { steps: 2, budget_spent: 0 } } },
      ]);
      expect((await stepRows(z)).map((row) => [row.seq, row.status, row.output, row.attempts])).toEqual([[0, 'SUCCEEDED', 'after retry', 2]]);
      expect(await getRun(z)).toMatchObject({ status: 'SUCCEEDED', output: null, termination_evidence: { steps: 1, budget_spent: 0 } });
      expect((await getRun(w.runId))?.status).toBe('RUNNING');
      expect(await getRun(c)).toMatchObject({ status: 'SUCCEEDED', output: { child: true } });
      // The parent was woken by its child's completion, as _finished does.
      expect((await getRun(p))?.status).toBe('PENDING');
      expect((await events(p)).map((e) => e.kind)).toContain('woken');
    } finally {
      await client.end();
    }
  });

  it('commits each item on its own: rows in order with their codes; the failed items change nothing, the others commit', async () => {
    // A: a plain checkpoint.
    const a = await startRun();
    const ta = (await claimOne(a)).fencing_token;
    // B: its last step and its completion together.
    const b = await startRun();
    const tb = (await claimOne(b)).fencing_token;
    await checkpoint(b, tb, 0, 'b0', { output: 'first' });
    // C: a completion under a token that is no longer the run's.
    const c = await reclaimedRun();
    await checkpoint(c.runId, c.token, 0, 'c0');
    // D: a checkpoint at a position that already has one.
    const d = await startRun();
    const td = (await claimOne(d)).fencing_token;
    await checkpoint(d, td, 0, 'd0', { output: 'original' });

    const beforeC = await snapshot(c.runId);
    const beforeD = await snapshot(d);

    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(a, ta, 0, 'a0', { output: { a: 1 } }) },
      { op: 'complete', ...stepItem(b, tb, 1, 'b1', { step_output: { last: true } }), output: { done: 'B' }, policy_version: 'p/1' },
      { op: 'complete', ...stepItem(c.runId, c.stale, 1, 'c1', { step_output: 'late' }), output: { done: 'C' }, policy_version: 'p/1' },
      { op: 'checkpoint', ...stepItem(d, td, 0, 'd0', { output: 'overwritten?' }) },
    ]);
    expect(rows.map((r) => [r.item, r.code])).toEqual([[0, null], [1, null], [2, 'RL001'], [3, 'RL010']]);
    expect(rows[0]).toEqual({ item: 0, code: null, message: null, run_status: 'RUNNING' });
    expect(rows[1]).toEqual({ item: 1, code: null, message: null, run_status: null });
    expect(rows[2]!.message).toMatch(/lease lost/);
    expect(rows[2]!.run_status).toBeNull();
    expect(rows[3]!.message).toMatch(/already has a checkpoint/);
    expect(rows[3]!.run_status).toBeNull();

    // A's step committed, under its token; A still runs.
    expect(await stepRows(a)).toEqual([
      { seq: 0, name: 'a0', kind: 'step', status: 'SUCCEEDED', output: { a: 1 }, error: null, attempts: 1, fencing_token: ta, output_hash: null },
    ]);
    expect((await getRun(a))?.status).toBe('RUNNING');

    // B: its last step and its completion committed together.
    expect((await stepRows(b)).map((s) => [s.seq, s.name, s.status, s.output, s.fencing_token])).toEqual([
      [0, 'b0', 'SUCCEEDED', 'first', tb],
      [1, 'b1', 'SUCCEEDED', { last: true }, tb],
    ]);
    expect(await getRun(b)).toMatchObject({
      status: 'SUCCEEDED', output: { done: 'B' }, termination_reason: 'COMPLETED',
      termination_evidence: { steps: 2, budget_spent: 0 }, lease_owner: null,
    });
    expect((await events(b)).filter((e) => e.kind === 'completed')).toEqual([
      { kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence: { steps: 2, budget_spent: 0 } } },
    ]);

    // C and D: nothing changed.
    expect(await snapshot(c.runId)).toEqual(beforeC);
    expect(await snapshot(d)).toEqual(beforeD);
  });

  it('an unknown op gives RL003 for that item only', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(runId, token, 0, 's0') },
      { op: 'frobnicate', ...stepItem(runId, token, 1, 's1') },
      { ...stepItem(runId, token, 1, 's1') }, // no op at all
      { op: 'checkpoint', ...stepItem(runId, token, 1, 's1') },
    ]);
    expect(rows.map((r) => [r.item, r.code, r.run_status])).toEqual([
      [0, null, 'RUNNING'],
      [1, 'RL003', null],
      [2, 'RL003', null],
      [3, null, 'RUNNING'],
    ]);
    expect(rows[1]!.message).toMatch(/unknown op/);
    expect((await steps(runId)).map((s) => [s.seq, s.name])).toEqual([[0, 's0'], [1, 's1']]);
    expect(await commitBatch([])).toEqual([]);
  });

  it('undoes all the writes of an item that fails half-way (fast-path completion at a taken seq) and keeps the rest of the batch', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    await checkpoint(runId, token, 0, 'x', { output: 'kept' });
    const other = await startRun();
    const otherToken = (await claimOne(other)).fencing_token;
    const before = await snapshot(runId);

    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(other, otherToken, 0, 'o0') },
      // Charge 0 and RUNNING: the fast path updates the run to SUCCEEDED, then finds seq 0 taken.
      { op: 'complete', ...stepItem(runId, token, 0, 'x', { step_output: 'dup' }), output: 'never', policy_version: 'p/1' },
      { op: 'checkpoint', ...stepItem(other, otherToken, 1, 'o1') },
    ]);
    expect(rows.map((r) => r.code)).toEqual([null, 'RL010', null]);
    expect(await snapshot(runId)).toEqual(before);
    expect((await getRun(runId))?.status).toBe('RUNNING');
    expect((await steps(other)).map((s) => s.name)).toEqual(['o0', 'o1']);

    // Still RUNNING inside the same batch too: a later item of the same run commits.
    const again = await commitBatch([
      { op: 'complete', ...stepItem(runId, token, 0, 'x'), output: 'never', policy_version: 'p/1' },
      { op: 'checkpoint', ...stepItem(runId, token, 1, 'y') },
    ]);
    expect(again.map((r) => [r.code, r.run_status])).toEqual([['RL010', null], [null, 'RUNNING']]);
    expect((await steps(runId)).map((s) => s.name)).toEqual(['x', 'y']);
  });

  it('a complete item without seq completes the run like _complete_run', async () => {
    const runId = await startRun();
    const token = (await claimOne(runId)).fencing_token;
    await checkpoint(runId, token, 0, 'a');
    await checkpoint(runId, token, 1, 'b');
    const rows = await commitBatch([{ op: 'complete', run_id: runId, token, output: { total: 2 }, policy_version: 'p/1', charge: 0 }]);
    expect(rows).toEqual([{ item: 0, code: null, message: null, run_status: null }]);
    expect(await getRun(runId)).toMatchObject({
      status: 'SUCCEEDED', output: { total: 2 }, termination_reason: 'COMPLETED', termination_evidence: { steps: 2, budget_spent: 0 },
    });
    expect((await steps(runId)).length).toBe(2);
    // Finished: the same item again is a lost lease.
    expect((await commitBatch([{ op: 'complete', run_id: runId, token, output: null, policy_version: 'p/1', charge: 0 }]))[0]!.code).toBe('RL001');
  });

  it('reports the run status after a checkpoint: TERMINATED by a charge over budget, CANCELLING after a cancel request', async () => {
    const budgeted = await startRun({ budget: 5 });
    const tb = (await claimOne(budgeted)).fencing_token;
    const cancelled = await startRun();
    const tc = (await claimOne(cancelled)).fencing_token;
    const startedBefore = new Date(Date.now() - 60_000).toISOString();
    expect((await db.pool.query('select runledger.cancel_run($1) as s', [cancelled])).rows[0].s).toBe('CANCELLING');

    const rows = await commitBatch([
      { op: 'checkpoint', ...stepItem(budgeted, tb, 0, 'cheap', { charge: 2 }) },
      { op: 'checkpoint', ...stepItem(budgeted, tb, 1, 'dear', { charge: 4 }) },
      { op: 'checkpoint', ...stepItem(cancelled, tc, 0, 'in-flight', { started_at: startedBefore }) },
    ]);
    expect(rows.map((r) => [r.code, r.run_status])).toEqual([[null, 'RUNNING'], [null, 'TERMINATED'], [null, 'CANCELLING']]);
    expect(await getRun(budgeted)).toMatchObject({ status: 'TERMINATED', termination_reason: 'BUDGET', budget_spent: '6' });
    expect((await steps(budgeted)).map((s) => s.name)).toEqual(['cheap', 'dear']);
    expect((await steps(cancelled)).map((s) => s.name)).toEqual(['in-flight']);
  });
});

// ---------------------------------------------------------------------------------------------

/**
 * Calls runledger._complete_with_checkpoint in `client` and says which path it took: the
 * general path goes through _checkpoint_row, the fast path does not (counted with
 * track_functions, per transaction). A call that raises rejects with its SQLSTATE.
 */
async function completeWithCheckpoint(
  client: pg.Client,
  args: {
    runId: string; token: number; seq: number; name: string; charge?: number; stepOutput?: unknown; output?: unknown;
    attempts?: number; startedAt?: string; status?: string;
  },
): Promise<'fast' | 'general'> {
  await client.query(`set track_functions = 'pl'`);
  await client.query('begin');
  try {
    await client.query(
      `select runledger._complete_with_checkpoint($1, $2, $3, $4, 'step', $5, $6::jsonb, null, $7,
                                                 coalesce($8::timestamptz, runledger.now()), $9, $10::jsonb, 'p/1')`,
      [
        args.runId, args.token, args.seq, args.name, args.status ?? 'SUCCEEDED',
        args.stepOutput === undefined ? null : JSON.stringify(args.stepOutput), args.attempts ?? 1, args.startedAt ?? null,
        args.charge ?? 0, args.output === undefined ? null : JSON.stringify(args.output),
      ],
    );
    const calls = await client.query(
      `select coalesce(pg_stat_get_xact_function_calls(
                'runledger._checkpoint_row(text, bigint, int, text, text, text, jsonb, jsonb, int, timestamptz, numeric)'::regprocedure), 0)::int as n`,
    );
    await client.query('commit');
    return calls.rows[0].n === 0 ? 'fast' : 'general';
  } catch (error) {
    await client.query('rollback');
    throw error;
  }
}

async function completedEvents(runId: string): Promise<Array<{ kind: string; detail: any }>> {
  return (await events(runId)).filter((e) => e.kind === 'completed');
}

describe('runledger._complete_with_checkpoint', () => {
  const variants = [
    { label: 'fast path (charge 0, RUNNING, no no_progress limit, before its deadline)', path: 'fast', charge: 0, options: {}, spent: 0 },
    { label: 'general path (a charge)', path: 'general', charge: 1.5, options: {}, spent: 1.5 },
    { label: 'general path (a no_progress limit)', path: 'general', charge: 0, options: { no_progress: 5 }, spent: 0 },
  ] as const;

  for (const v of variants) describe(v.label, () => {
    it('SUCCEEDED, COMPLETED, evidence {steps, budget_spent}, one completed event, the step row under the token', async () => {
      await session(async (client) => {
        await setNow(client, '2070-01-01T00:00:00Z');
        const { runId, token } = await reclaimedRun({ ...v.options, deadline: '1 hour' }, client);
        await checkpoint(runId, token, 0, 'a', { output: 1, on: client });
        await checkpoint(runId, token, 1, 'b', { output: 2, on: client });
        await setNow(client, '2070-01-01T00:00:07Z');
        const path = await completeWithCheckpoint(client, {
          runId, token, seq: 2, name: 'c', charge: v.charge, stepOutput: { c: 3 }, output: { total: 6 }, attempts: 2,
          startedAt: '2070-01-01T00:00:06Z',
        });
        expect(path).toBe(v.path);

        const evidence = { steps: 3, budget_spent: v.spent };
        const run = await getRun(runId);
        expect(run).toMatchObject({
          status: 'SUCCEEDED', output: { total: 6 }, error: null, termination_reason: 'COMPLETED', termination_evidence: evidence,
          lease_owner: null, lease_expires_at: null, wait_kind: null, fencing_token: token,
          policy_version: expect.stringMatching(/^limits:[0-9a-f]{12}$/),
        });
        expect(Number(run?.budget_spent)).toBe(v.spent);
        expect(run?.finished_at.toISOString()).toBe('2070-01-01T00:00:07.000Z');
        expect(run?.terminated_at.toISOString()).toBe('2070-01-01T00:00:07.000Z');
        const rows = await stepRows(runId);
        expect(rows.map((s) => [s.seq, s.name, s.status, s.output, s.attempts, s.fencing_token])).toEqual([
          [0, 'a', 'SUCCEEDED', 1, 1, token],
          [1, 'b', 'SUCCEEDED', 2, 1, token],
          [2, 'c', 'SUCCEEDED', { c: 3 }, 2, token],
        ]);
        expect(evidence.steps).toBe(rows.length);
        expect(await completedEvents(runId)).toEqual([
          { kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence } },
        ]);
        expect((await events(runId)).at(-1)?.kind).toBe('completed');
        const finishedAt = await db.pool.query('select finished_at from runledger.steps where run_id = $1 and seq = 2', [runId]);
        expect(finishedAt.rows[0].finished_at.toISOString()).toBe('2070-01-01T00:00:07.000Z');
      });
    });

    it('counts once the step whose durable retry left a WAITING row at the last seq', async () => {
      await session(async (client) => {
        await setNow(client, '2070-02-01T00:00:00Z');
        const runId = await startRun(v.options, {}, client);
        const first = (await claimOne(runId, 'wk-retry', 30_000, client)).fencing_token;
        await checkpoint(runId, first, 0, 'a', { output: 'a', on: client });
        await client.query(`select runledger._retry_wait($1, $2, 1, 'flaky', 'step', 1, 5000)`, [runId, first]);
        expect(await getRun(runId)).toMatchObject({ status: 'WAITING', wait_kind: 'retry' });
        expect((await steps(runId)).map((s) => [s.seq, s.status])).toEqual([[0, 'SUCCEEDED'], [1, 'WAITING']]);
        await setNow(client, '2070-02-01T00:00:06Z');
        const token = (await claimOne(runId, 'wk-retry', 30_000, client)).fencing_token;
        expect(token).toBe(first + 1);

        const path = await completeWithCheckpoint(client, {
          runId, token, seq: 1, name: 'flaky', charge: v.charge, stepOutput: 'ok at last', output: 'done', attempts: 2,
        });
        expect(path).toBe(v.path);
        const rows = await stepRows(runId);
        expect(rows.map((s) => [s.seq, s.name, s.status, s.output, s.attempts, s.fencing_token])).toEqual([
          [0, 'a', 'SUCCEEDED', 'a', 1, first],
          [1, 'flaky', 'SUCCEEDED', 'ok at last', 2, token],
        ]);
        const evidence = { steps: 2, budget_spent: v.spent };
        expect(await getRun(runId)).toMatchObject({ status: 'SUCCEEDED', output: 'done', termination_reason: 'COMPLETED', termination_evidence: evidence });
        expect(await completedEvents(runId)).toEqual([{ kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence } }]);
      });
    });

    it('a stale token raises RL001 and writes nothing', async () => {
      await session(async (client) => {
        const { runId, stale, token } = await reclaimedRun(v.options, client);
        await checkpoint(runId, token, 0, 'a', { on: client });
        const before = await snapshot(runId);
        expect(await sqlState(completeWithCheckpoint(client, { runId, token: stale, seq: 1, name: 'b', charge: v.charge, output: 'x' }))).toBe('RL001');
        expect(await snapshot(runId)).toEqual(before);
        // A finished run: its own token is spent too.
        await completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x' });
        const done = await snapshot(runId);
        expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 2, name: 'c', charge: v.charge, output: 'y' }))).toBe('RL001');
        expect(await snapshot(runId)).toEqual(done);
      });
    });

    it('a seq that already has a checkpoint raises RL010 and writes nothing', async () => {
      await session(async (client) => {
        const runId = await startRun(v.options, {}, client);
        const token = (await claimOne(runId, 'wk-dup', 30_000, client)).fencing_token;
        await checkpoint(runId, token, 0, 'a', { output: 'first', on: client });
        await checkpoint(runId, token, 1, 'b', { output: 'second', on: client });
        const before = await snapshot(runId);
        // The same step again, and another step at a taken position.
        expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, stepOutput: 'again', output: 'x' }))).toBe('RL010');
        expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 0, name: 'z', charge: v.charge, stepOutput: 'again', output: 'x' }))).toBe('RL010');
        expect(await snapshot(runId)).toEqual(before);
        expect((await getRun(runId))?.status).toBe('RUNNING');
      });
    });

    it('past the deadline (or at it) raises RL009 and writes nothing', async () => {
      await session(async (client) => {
        await setNow(client, '2070-03-01T00:00:00Z');
        const runId = await startRun({ ...v.options, deadline: '10 seconds' }, {}, client);
        const token = (await claimOne(runId, 'wk-late', 30_000, client)).fencing_token;
        await checkpoint(runId, token, 0, 'a', { on: client });
        const before = await snapshot(runId);
        await setNow(client, '2070-03-01T00:00:10Z');
        expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x' }))).toBe('RL009');
        await setNow(client, '2070-03-01T00:00:20Z');
        expect(await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x' }))).toBe('RL009');
        expect(await snapshot(runId)).toEqual(before);
      });
    });

    it('a CANCELLING run whose step started before the cancel request still completes; one started after raises RL008', async () => {
      await session(async (client) => {
        await setNow(client, '2070-04-01T00:00:00Z');
        const runId = await startRun(v.options, {}, client);
        const token = (await claimOne(runId, 'wk-cancel', 30_000, client)).fencing_token;
        await checkpoint(runId, token, 0, 'a', { output: 'a', on: client });
        await setNow(client, '2070-04-01T00:00:02Z');
        expect((await client.query('select runledger.cancel_run($1) as s', [runId])).rows[0].s).toBe('CANCELLING');
        await setNow(client, '2070-04-01T00:00:03Z');

        const before = await snapshot(runId);
        expect(
          await sqlState(completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, output: 'x', startedAt: '2070-04-01T00:00:02Z' })),
        ).toBe('RL008');
        expect(await snapshot(runId)).toEqual(before);

        // Only the general path handles a cancel under way.
        expect(
          await completeWithCheckpoint(client, { runId, token, seq: 1, name: 'b', charge: v.charge, stepOutput: 'b', output: 'x', startedAt: '2070-04-01T00:00:01Z' }),
        ).toBe('general');
        const evidence = { steps: 2, budget_spent: v.spent };
        expect(await getRun(runId)).toMatchObject({
          status: 'SUCCEEDED', output: 'x', termination_reason: 'COMPLETED', termination_evidence: evidence, lease_owner: null,
        });
        expect((await stepRows(runId)).map((s) => [s.seq, s.name, s.fencing_token])).toEqual([[0, 'a', token], [1, 'b', token]]);
        expect(await completedEvents(runId)).toEqual([{ kind: 'completed', detail: { status: 'SUCCEEDED', reason: 'COMPLETED', evidence } }]);
      });
    });
  });
});

// ---------------------------------------------------------------------------------------------

/** The SQLSTATE and constraint name of a statement's error (it must fail). */
async function checkViolation(promise: Promise<unknown>): Promise<{ code?: string; constraint?: string }> {
  try {
    await promise;
  } catch (error) {
    const e = error as { code?: string; constraint?: string };
    return { code: e.code, constraint: e.constraint };
  }
  throw new Error('expected a check violation, but the statement succeeded');
}

function insertRunRow(columns: Record<string, unknown>): Promise<unknown> {
  const all = { workflow_name: 'w', workflow_version: '1', queue_name: 'default', ...columns };
  const names = Object.keys(all);
  return db.pool.query(
    `insert into runledger.runs (${names.join(', ')}) values (${names.map((_, i) => `$${i + 1}`).join(', ')})`,
    Object.values(all),
  );
}

describe('runs invariants: the other rule names of runledger._check_run', () => {
  const violated = (constraint: string) => ({ code: '23514', constraint });
  const update = (runId: string, set: string) => db.pool.query(`update runledger.runs set ${set} where run_id = $1`, [runId]);

  it('runs_wait_kind_check: a wait_kind outside the list', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-wk'), status: 'WAITING', wait_kind: 'nap' }))).toEqual(violated('runs_wait_kind_check'));
    const runId = await startRun();
    expect(await checkViolation(update(runId, `status = 'WAITING', wait_kind = 'snooze'`))).toEqual(violated('runs_wait_kind_check'));
    // Every listed kind is accepted.
    for (const kind of ['timer', 'signal', 'approval', 'child', 'retry', 'reconcile']) {
      const ok = newRunId('i-wk-ok');
      await insertRunRow({ run_id: ok, status: 'WAITING', wait_kind: kind });
      expect((await getRun(ok))?.wait_kind).toBe(kind);
    }
  });

  it('runs_wait_kind_only_when_waiting: a wait_kind exactly when WAITING', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-wkw'), status: 'PENDING', wait_kind: 'timer' }))).toEqual(
      violated('runs_wait_kind_only_when_waiting'),
    );
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-wkw'), status: 'WAITING' }))).toEqual(violated('runs_wait_kind_only_when_waiting'));
    const runId = await startRun();
    expect(await checkViolation(update(runId, `status = 'WAITING'`))).toEqual(violated('runs_wait_kind_only_when_waiting'));
    expect(await checkViolation(update(runId, `wait_kind = 'timer'`))).toEqual(violated('runs_wait_kind_only_when_waiting'));
    expect((await getRun(runId))).toMatchObject({ status: 'PENDING', wait_kind: null });
  });

  it('runs_budget_check: budget below 0 (0 and null are accepted)', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-budget'), budget: -0.01 }))).toEqual(violated('runs_budget_check'));
    const runId = await startRun({ budget: 10 });
    expect(await checkViolation(update(runId, 'budget = -1'))).toEqual(violated('runs_budget_check'));
    await update(runId, 'budget = 0');
    await update(runId, 'budget = null');
    expect((await getRun(runId))?.budget).toBeNull();
  });

  it('runs_max_steps_check: max_steps 0 or below (1 and null are accepted)', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-steps'), max_steps: 0 }))).toEqual(violated('runs_max_steps_check'));
    const runId = await startRun();
    expect(await checkViolation(update(runId, 'max_steps = -5'))).toEqual(violated('runs_max_steps_check'));
    await update(runId, 'max_steps = 1');
    expect((await getRun(runId))?.max_steps).toBe(1);
  });

  it('runs_no_progress_check: no_progress below 2 (2 and null are accepted)', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-np'), no_progress: 1 }))).toEqual(violated('runs_no_progress_check'));
    const runId = await startRun();
    expect(await checkViolation(update(runId, 'no_progress = 0'))).toEqual(violated('runs_no_progress_check'));
    await update(runId, 'no_progress = 2');
    expect((await getRun(runId))?.no_progress).toBe(2);
  });

  it('runs_retry_budget_check: retry_budget below 0 (0 and null are accepted)', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-rb'), retry_budget: -1 }))).toEqual(violated('runs_retry_budget_check'));
    const runId = await startRun();
    expect(await checkViolation(update(runId, 'retry_budget = -3'))).toEqual(violated('runs_retry_budget_check'));
    await update(runId, 'retry_budget = 0');
    expect((await getRun(runId))?.retry_budget).toBe(0);
  });

  it('runs_max_recovery_attempts_check: max_recovery_attempts below 0 (0 is accepted)', async () => {
    expect(await checkViolation(insertRunRow({ run_id: newRunId('i-mra'), max_recovery_attempts: -1 }))).toEqual(
      violated('runs_max_recovery_attempts_check'),
    );
    const runId = await startRun();
    expect(await checkViolation(update(runId, 'max_recovery_attempts = -1'))).toEqual(violated('runs_max_recovery_attempts_check'));
    await update(runId, 'max_recovery_attempts = 0');
    expect((await getRun(runId))?.max_recovery_attempts).toBe(0);
  });

  it('reports the table and schema of the rule with it', async () => {
    try {
      await insertRunRow({ run_id: newRunId('i-table'), budget: -1 });
      expect.unreachable('the insert should fail');
    } catch (error) {
      expect(error).toMatchObject({ code: '23514', constraint: 'runs_budget_check', table: 'runs', schema: 'runledger' });
      expect((error as Error).message).toMatch(/violates check constraint "runs_budget_check"/);
    }
  });
});

describe('steps invariants: runledger._check_step', () => {
  const insertStep = (runId: string, columns: Record<string, unknown>) => {
    const all = { run_id: runId, seq: 0, name: 's', kind: 'step', status: 'SUCCEEDED', started_at: new Date(), fencing_token: 1, ...columns };
    const names = Object.keys(all);
    return db.pool.query(
      `insert into runledger.steps (${names.join(', ')}) values (${names.map((_, i) => `$${i + 1}`).join(', ')})`,
      Object.values(all),
    );
  };
  const violated = (constraint: string) => ({ code: '23514', constraint });

  it('steps_seq_check: seq below 0', async () => {
    const runId = await startRun();
    expect(await checkViolation(insertStep(runId, { seq: -1 }))).toEqual(violated('steps_seq_check'));
    await insertStep(runId, { seq: 0 });
    expect(await checkViolation(db.pool.query('update runledger.steps set seq = -2 where run_id = $1', [runId]))).toEqual(violated('steps_seq_check'));
    expect((await steps(runId)).map((s) => s.seq)).toEqual([0]);
  });

  it('steps_kind_check: a kind outside the list (every listed kind is accepted)', async () => {
    const runId = await startRun();
    expect(await checkViolation(insertStep(runId, { kind: 'bogus' }))).toEqual(violated('steps_kind_check'));
    const kinds = ['step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child'];
    for (const [i, kind] of kinds.entries()) await insertStep(runId, { seq: i, kind });
    expect(await checkViolation(db.pool.query(`update runledger.steps set kind = 'job' where run_id = $1 and seq = 0`, [runId]))).toEqual(
      violated('steps_kind_check'),
    );
    expect((await steps(runId)).length).toBe(kinds.length);
  });

  it('steps_status_check: a status other than SUCCEEDED, FAILED or WAITING', async () => {
    const runId = await startRun();
    expect(await checkViolation(insertStep(runId, { status: 'RUNNING' }))).toEqual(violated('steps_status_check'));
    for (const [i, status] of ['SUCCEEDED', 'FAILED', 'WAITING'].entries()) await insertStep(runId, { seq: i, status });
    expect(await checkViolation(db.pool.query(`update runledger.steps set status = 'PENDING' where run_id = $1 and seq = 2`, [runId]))).toEqual(
      violated('steps_status_check'),
    );
    expect((await steps(runId)).map((s) => s.status)).toEqual(['SUCCEEDED', 'FAILED', 'WAITING']);
  });

  it('reports the table and schema of the rule with it', async () => {
    const runId = await startRun();
    try {
      await insertStep(runId, { kind: 'bogus' });
      expect.unreachable('the insert should fail');
    } catch (error) {
      expect(error).toMatchObject({ code: '23514', constraint: 'steps_kind_check', table: 'steps', schema: 'runledger' });
    }
  });
});

describe('runs.run_id validation (triggers runs_run_id_insert and runs_run_id_update)', () => {
  const invalid = ['', '-leading-dash', '_leading_underscore', 'has space', 'slash/inside', 'é-accent', `a${'b'.repeat(200)}`];

  it('rejects an invalid run_id on insert with 23514 and stores nothing', async () => {
    for (const runId of invalid) {
      expect(await sqlState(insertRunRow({ run_id: runId })), JSON.stringify(runId)).toBe('23514');
    }
    const stored = await db.pool.query('select count(*)::int as n from runledger.runs where run_id = any($1)', [invalid]);
    expect(stored.rows[0].n).toBe(0);
    // The longest and the odd-but-valid ones are accepted.
    for (const runId of [`a${'b'.repeat(199)}`, newRunId('ok.run:id_with-all'), `9${newRunId('x')}`]) {
      await insertRunRow({ run_id: runId });
      expect((await getRun(runId))?.run_id).toBe(runId);
    }
  });

  it('rejects an invalid run_id set by update, and leaves updates of other columns alone', async () => {
    const runId = newRunId('rename-me');
    await insertRunRow({ run_id: runId });
    for (const bad of invalid) {
      expect(await sqlState(db.pool.query('update runledger.runs set run_id = $2 where run_id = $1', [runId, bad])), JSON.stringify(bad)).toBe('23514');
    }
    expect((await getRun(runId))?.run_id).toBe(runId);
    try {
      await db.pool.query('update runledger.runs set run_id = $2 where run_id = $1', [runId, 'bad id']);
      expect.unreachable('the update should fail');
    } catch (error) {
      expect((error as Error).message).toMatch(/run_id 'bad id' is invalid/);
    }
    // A valid new id is accepted, and so is any update that does not touch the id.
    const renamed = newRunId('renamed');
    await db.pool.query('update runledger.runs set run_id = $2 where run_id = $1', [runId, renamed]);
    await db.pool.query('update runledger.runs set priority = 7 where run_id = $1', [renamed]);
    expect(await getRun(renamed)).toMatchObject({ run_id: renamed, priority: 7 });
    expect(await getRun(runId)).toBeUndefined();
  });
});
