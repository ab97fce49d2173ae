/**
 * runledger.start_run from SQL: ids, idempotency, validation, versions and deadlines, and the
 * announcement on runledger_runnable that makes a new run claimable.
 */
import { describe, expect, it } from 'vitest';
import { decodeTime } from 'ulid';
import { useTestEngine } from '../helpers/test-engine.js';
import { sessionHelpers, setNow } from '../helpers/session.js';
import { runHelpers, newRunId, ULID, registerWorkflowW } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';
import { notifyHelpers } from '../helpers/notify.js';
import { sqlState } from '../helpers/sql-errors.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { session } = sessionHelpers(db);
const { startRun, getRun, events, countRuns } = runHelpers(db);
const { claimable } = claimHelpers(db);
const { notified } = notifyHelpers(db);

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
    ['a queue name over 40 characters', { queue: 'q'.repeat(41) }],
    ['an invalid run_id', { run_id: 'has space' }],
    ['a run_id over 200 characters', { run_id: 'r'.repeat(201) }],
    ['a deadline that is neither interval nor timestamp', { deadline: 'tomorrowish' }],
    ['both run_at and run_in_ms', { run_at: '2040-01-01T00:00:00Z', run_in_ms: 1000 }],
    ['a negative run_in_ms', { run_in_ms: -1 }],
    ['a run_in_ms that is not a whole number', { run_in_ms: 1.5 }],
    ['a run_in_ms given as text', { run_in_ms: '10m' }],
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

  it('notify false starts a claimable run without announcing it; a delayed run is announced all the same', async () => {
    const quiet = await notified(() => startRun({ notify: false }, { quiet: true }));
    expect(quiet.payloads).toEqual([]);
    expect((await getRun(quiet.result))?.status).toBe('PENDING');
    expect(await claimable(quiet.result)).toMatchObject({ claimed: true });
    // The delay travels in the notification (a worker arms a timer for it): never left out.
    const delayed = await notified(() => startRun({ notify: false, run_in_ms: 60_000 }));
    expect(delayed.payloads).toEqual(['default+60000']);
    for (const notify of ['no', 0, null]) {
      expect(await sqlState(startRun({ notify }))).toBe('RL003');
    }
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

  it('names the policy by the md5 of its limits as jsonb prints them, on the short path for runs without limits too', async () => {
    // The name as every build made it: jsonb_build_object of the limits, printed, hashed.
    const named = async (limits: Record<string, unknown>, mra: number): Promise<string> =>
      (
        await db.pool.query(
          `select 'limits:' || left(md5(jsonb_build_object('deadline', ($1::jsonb->>'deadline')::timestamptz,
                    'max_steps', $1::jsonb->'max_steps', 'budget', $1::jsonb->'budget', 'no_progress', $1::jsonb->'no_progress',
                    'max_recovery_attempts', to_jsonb($2::int))::text), 12) as name`,
          [JSON.stringify(limits), mra],
        )
      ).rows[0].name;
    const cases: Array<[Record<string, unknown>, Record<string, unknown>, number]> = [
      [{}, {}, 3], // w@1 registers 3 recovery attempts
      [{ max_recovery_attempts: 0 }, {}, 0],
      [{ max_recovery_attempts: 123456789 }, {}, 123456789],
      [{ max_steps: 5 }, { max_steps: 5 }, 3],
      [{ budget: 100, no_progress: 4 }, { budget: 100, no_progress: 4 }, 3],
      [{ deadline: '2041-05-06T07:08:09Z' }, { deadline: '2041-05-06T07:08:09Z' }, 3],
    ];
    const names = new Set<string>();
    for (const [options, limits, mra] of cases) {
      const run = await getRun(await startRun(options));
      expect(run?.policy_version, JSON.stringify(options)).toBe(await named(limits, mra));
      names.add(run?.policy_version);
    }
    expect(names.size).toBe(cases.length);
  });

  it('run_in_ms delays the start from now on the database clock; run_at is an instant compared with it', async () => {
    await session(async (client) => {
      const queue = newRunId('q-run-in');
      await setNow(client, '2040-03-04T05:06:07Z');
      const { result: delayed, payloads } = await notified(() => startRun({ queue, run_in_ms: 90_000 }, {}, client));
      expect((await getRun(delayed))?.not_before.toISOString()).toBe('2040-03-04T05:07:37.000Z');
      expect(payloads).toEqual([`${queue}+90000`]); // the delay, not a time: a worker's clock plays no part
      const at = await startRun({ queue, run_at: '2040-03-04T05:06:17Z' }, {}, client);
      expect((await getRun(at))?.not_before.toISOString()).toBe('2040-03-04T05:06:17.000Z');
      expect(await claimable(delayed, { on: client })).toEqual({ claimed: false, nextDueInMs: 10_000 });
      await setNow(client, '2040-03-04T05:07:37Z');
      expect((await claimable(delayed, { on: client })).claimed).toBe(true);
    });
  });
});
