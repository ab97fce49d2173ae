import { describe, expect, it } from 'vitest';
import { ConfigError, InvalidInputError, RetryAfterError, type Engine } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';

/**
 * Shared rate limits (sql/0017_rate_limits.sql, src/steps/rate-limit.ts): the calls that
 * name a key stay within its limit across every run and worker, measured where the calls
 * land; a Retry-After pauses the key for every run; a wait too long for memory parks the
 * run (no worker held) and an operation waiting so is PLANNED in the ledger, never UNKNOWN.
 */
const t = useTestEngine();
const { db } = t;
const { workers } = stoppedAfterEach();

async function startWorkers(engine: Engine, queue: string, count: number, concurrency: number): Promise<void> {
  for (let i = 0; i < count; i++)
    workers.push(await engine.runWorker({ queues: [queue], concurrency, leaseMs: 5_000, pollIntervalMs: 50 }));
}

/** The most calls in any window of `windowMs` (the time a provider counts them by). */
function mostInAnyWindow(times: number[], windowMs: number): number {
  const sorted = [...times].sort((a, b) => a - b);
  let most = 0;
  for (let i = 0, j = 0; j < sorted.length; j++) {
    while (sorted[j]! - sorted[i]! >= windowMs) i++;
    most = Math.max(most, j - i + 1);
  }
  return most;
}

/** A provider's rate-limit answer as the AI SDK's APICallError carries it. */
function tooManyRequests(retryAfterSeconds: number): Error {
  return Object.assign(new Error('429 Too Many Requests'), {
    statusCode: 429,
    responseHeaders: { 'retry-after': String(retryAfterSeconds) },
  });
}

describe('shared rate limits', () => {
  it('30 runs on two workers on a key limited to 5 per second never put more than 5 calls in any second at the provider', async () => {
    await t.engine.setRateLimit('provider-a', { max: 5, per: '1s' });
    const calls: number[] = [];
    const wf = t.engine.workflow({ name: 'limited-30', queue: 'rl-a' }, async (ctx) =>
      ctx.step('call', () => calls.push(performance.now()), { rateLimit: 'provider-a' }),
    );
    const other = t.newEngine();
    other.workflow({ name: 'limited-30', queue: 'rl-a' }, async (ctx) =>
      ctx.step('call', () => calls.push(performance.now()), { rateLimit: 'provider-a' }),
    );
    await startWorkers(t.engine, 'rl-a', 1, 15);
    await startWorkers(other, 'rl-a', 1, 15);
    const handles = await t.engine.startMany(
      wf,
      Array.from({ length: 30 }, () => undefined),
    );
    await Promise.all(handles.map((h) => h.result()));

    expect(calls).toHaveLength(30);
    expect(mostInAnyWindow(calls, 1_000)).toBeLessThanOrEqual(5);
    // 30 calls at 5 a second: the last one at least 5 windows after the first.
    expect(Math.max(...calls) - Math.min(...calls)).toBeGreaterThanOrEqual(5_000);
    // The runs refused for longer than an in-memory wait were parked, holding no worker.
    const parked = await db.pool.query(
      `select count(*)::int as n from runledger.events where kind = 'rate_limit_wait' and detail->>'key' = 'provider-a'`,
    );
    expect(parked.rows[0].n).toBeGreaterThan(0);
    const steps = await db.pool.query(
      `select count(*)::int as n, max(attempts) as most from runledger.steps s join runledger.runs r using (run_id)
        where r.workflow_name = 'limited-30' and s.name = 'call' and s.status = 'SUCCEEDED'`,
    );
    expect(steps.rows[0]).toEqual({ n: 30, most: 1 });
  });

  it('after a 429 with Retry-After: 2 no run calls for 2 s, and then the calls go through', async () => {
    const calls: Array<{ at: number; ok: boolean }> = [];
    let refused = false;
    const body = () => {
      if (!refused) {
        refused = true;
        calls.push({ at: Date.now(), ok: false });
        throw tooManyRequests(2);
      }
      calls.push({ at: Date.now(), ok: true });
      return 'ok';
    };
    const options = { rateLimit: 'provider-b', retry: { maxAttempts: 3, initialDelayMs: 10 } };
    const wf = t.engine.workflow({ name: 'paused-by-429', queue: 'rl-b' }, async (ctx) => ctx.step('call', body, options));
    await startWorkers(t.engine, 'rl-b', 1, 10);
    const first = await t.engine.start(wf, undefined);
    await waitFor('the first call, refused', async () => calls.length === 1);
    const rest = await t.engine.startMany(
      wf,
      Array.from({ length: 9 }, () => undefined),
    );

    // While the pause lasts, psql shows it: the key, until when, why, and who waits.
    await waitFor('the pause and its waiters in rate_limits', async () => {
      const row = (await db.pool.query(`select * from runledger.rate_limits where key = 'provider-b'`)).rows[0];
      return row?.paused_until !== null && row?.waiters >= 5;
    });
    const shown = (await db.pool.query(`select max_calls, paused_until, pause_reason from runledger.rate_limits where key = 'provider-b'`))
      .rows[0];
    expect(shown.max_calls).toBeNull();
    expect(shown.pause_reason).toMatchObject({ retry_after_ms: 2_000, error: { message: '429 Too Many Requests' } });

    await Promise.all([first, ...rest].map((h) => h.result()));
    const refusedAt = calls[0]!.at;
    expect(calls[0]!.ok).toBe(false);
    const after = calls.slice(1);
    expect(after).toHaveLength(10);
    // The pause is recorded just after the refusal returns: nobody calls within 2 s of it.
    for (const call of after) expect(call.at - refusedAt).toBeGreaterThanOrEqual(2_000);
    const paused = await db.pool.query(
      `select count(*)::int as n from runledger.events where kind = 'rate_limit_paused' and detail->>'key' = 'provider-b'`,
    );
    expect(paused.rows[0].n).toBe(1);
  });

  it('a permit too far off parks the run holding no worker; a higher limit wakes it and it calls once', async () => {
    await t.engine.setRateLimit('provider-c', { max: 1, per: '1h' });
    const calls: string[] = [];
    const limited = t.engine.workflow({ name: 'parked-step', queue: 'rl-c' }, async (ctx) =>
      ctx.step('call', () => (calls.push(ctx.runId), ctx.runId), { rateLimit: 'provider-c' }),
    );
    const free = t.engine.workflow({ name: 'unlimited', queue: 'rl-c' }, async () => 'done');
    await startWorkers(t.engine, 'rl-c', 1, 1);
    const a = await t.engine.start(limited, undefined);
    await a.result();
    const b = await t.engine.start(limited, undefined);
    await waitFor(
      'the run parked for its permit',
      async () =>
        (await db.pool.query(`select wait_kind from runledger.runs where run_id = $1`, [b.runId])).rows[0].wait_kind === 'rate_limit',
    );
    const view = (await db.pool.query(`select calls_in_window, waiters, paused_until from runledger.rate_limits where key = 'provider-c'`))
      .rows[0];
    expect(view).toEqual({ calls_in_window: 1, waiters: 1, paused_until: null });
    const waiting = (
      await db.pool.query(`select wait_key, wake_at > now() + interval '50 minutes' as far from runledger.runs where run_id = $1`, [
        b.runId,
      ])
    ).rows[0];
    expect(waiting).toEqual({ wait_key: 'provider-c', far: true });
    // The worker has one slot and the parked run does not hold it.
    await expect((await t.engine.start(free, undefined)).result()).resolves.toBe('done');

    await t.engine.setRateLimit('provider-c', { max: 10, per: '1h' });
    await expect(b.result()).resolves.toBe(b.runId);
    expect(calls).toEqual([a.runId, b.runId]);
    const step = (await db.pool.query(`select status, attempts from runledger.steps where run_id = $1 and name = 'call'`, [b.runId]))
      .rows[0];
    expect(step).toEqual({ status: 'SUCCEEDED', attempts: 1 });
    expect((await db.pool.query(`select waiters from runledger.rate_limits where key = 'provider-c'`)).rows[0].waiters).toBe(0);
  });

  it('an operation waiting for a permit is PLANNED in the ledger, not UNKNOWN, and is called once when let through', async () => {
    await t.engine.setRateLimit('provider-d', { max: 1, per: '1h' });
    const calls: string[] = [];
    const wf = t.engine.workflow({ name: 'parked-operation', queue: 'rl-d' }, async (ctx) =>
      ctx.operation('charge', { rateLimit: 'provider-d', idempotencyKey: `charge-${ctx.runId}` }, async ({ idempotencyKey }) => {
        calls.push(idempotencyKey);
        return { charged: idempotencyKey };
      }),
    );
    await startWorkers(t.engine, 'rl-d', 1, 2);
    const a = await t.engine.start(wf, undefined);
    await a.result();
    const b = await t.engine.start(wf, undefined);
    await waitFor(
      'the run parked for its permit',
      async () =>
        (await db.pool.query(`select wait_kind from runledger.runs where run_id = $1`, [b.runId])).rows[0].wait_kind === 'rate_limit',
    );
    const planned = (await db.pool.query(`select status, attempts from runledger.operations where run_id = $1`, [b.runId])).rows[0];
    expect(planned).toEqual({ status: 'PLANNED', attempts: 0 });
    expect(
      (await db.pool.query(`select count(*)::int as n from runledger.unknown_operations where run_id = $1`, [b.runId])).rows[0].n,
    ).toBe(0);

    await db.pool.query(`select runledger.set_rate_limit('provider-d', null, null)`);
    await expect(b.result()).resolves.toEqual({ charged: `charge-${b.runId}` });
    expect(calls).toEqual([`charge-${a.runId}`, `charge-${b.runId}`]);
    const done = (await db.pool.query(`select status, attempts from runledger.operations where run_id = $1`, [b.runId])).rows[0];
    expect(done).toEqual({ status: 'SUCCEEDED', attempts: 1 });
  });

  it('a RetryAfterError makes the next attempt wait at least that long, with or without a key', async () => {
    const attempts: number[] = [];
    const wf = t.engine.workflow({ name: 'retry-after', queue: 'rl-e' }, async (ctx) =>
      ctx.step(
        'call',
        ({ attempt }) => {
          attempts.push(Date.now());
          if (attempt === 1) throw new RetryAfterError('400ms');
          return attempt;
        },
        { retry: { maxAttempts: 2, initialDelayMs: 1, jitter: false } },
      ),
    );
    await startWorkers(t.engine, 'rl-e', 1, 1);
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toBe(2);
    expect(attempts[1]! - attempts[0]!).toBeGreaterThanOrEqual(400);
  });

  it('operators manage keys from SQL: pause, resume, delete, each in the audit log; bad input is refused with its code', async () => {
    await db.pool.query(`select runledger.set_rate_limit('provider-f', 3, interval '10 seconds')`);
    await db.pool.query(`select runledger.pause_rate_limit('provider-f', now() + interval '1 minute', 'provider outage')`);
    let row = (
      await db.pool.query(
        `select max_calls, per, pause_reason, paused_until > now() as paused from runledger.rate_limits where key = 'provider-f'`,
      )
    ).rows[0];
    expect(row).toMatchObject({ max_calls: 3, paused: true, pause_reason: { note: 'provider outage' } });
    await db.pool.query(`select runledger.resume_rate_limit('provider-f')`);
    row = (await db.pool.query(`select paused_until from runledger.rate_limits where key = 'provider-f'`)).rows[0];
    expect(row.paused_until).toBeNull();
    expect((await db.pool.query(`select runledger.delete_rate_limit('provider-f') as gone`)).rows[0].gone).toBe(true);
    const audited = await db.pool.query(`select action from runledger.audit_log where target = 'provider-f' order by at`);
    expect(audited.rows.map((r) => r.action)).toEqual(['set_rate_limit', 'pause_rate_limit', 'resume_rate_limit', 'delete_rate_limit']);

    await expect(db.pool.query(`select runledger.set_rate_limit('provider-f', 0, interval '1 second')`)).rejects.toMatchObject({
      code: 'RL003',
    });
    await expect(db.pool.query(`select runledger.set_rate_limit('bad key', 1, interval '1 second')`)).rejects.toMatchObject({
      code: 'RL003',
    });
    await expect(db.pool.query(`select runledger.set_rate_limit('provider-f', 1, null)`)).rejects.toMatchObject({ code: 'RL003' });
    await expect(db.pool.query(`select runledger.resume_rate_limit('no-such-key')`)).rejects.toMatchObject({ code: 'RL002' });
    await expect(t.engine.setRateLimit('provider-f', { max: 0, per: '1s' })).rejects.toBeInstanceOf(ConfigError);
    await expect(t.engine.setRateLimit('provider-f', { max: 1, per: '2d' })).rejects.toBeInstanceOf(ConfigError);
    await expect(t.engine.setRateLimit('bad key', { max: 1, per: '1s' })).rejects.toBeInstanceOf(InvalidInputError);
    await expect(t.engine.pauseRateLimit('bad key', '1s')).rejects.toBeInstanceOf(InvalidInputError);
    const wf = t.engine.workflow({ name: 'bad-key', queue: 'rl-f' }, async (ctx) => ctx.step('call', () => 1, { rateLimit: 'no spaces' }));
    await startWorkers(t.engine, 'rl-f', 1, 1);
    await expect((await t.engine.start(wf, undefined)).result()).rejects.toMatchObject({ details: { error: { code: 'CONFIG' } } });
  });
});
