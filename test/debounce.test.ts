import { describe, expect, it } from 'vitest';
import { InvalidInputError } from '../src/index.js';
import { useTestEngine } from './helpers/test-engine.js';
import { queueWorkers } from './helpers/cleanup.js';
import { waitFor } from './helpers/database.js';

/**
 * Debounce (sql/0018_debounce.sql): starts with the same key closer together than the delay
 * become one run with the last input, starting the delay after the last start; from
 * TypeScript and from start_run; per workflow and tenant.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'debounce');

describe('debounce', () => {
  it('a burst of 20 debounced starts gives one run with the last input, started the delay after the last start', async () => {
    const seen: number[] = [];
    const wf = t.engine.workflow({ name: 'reindex', queue: 'debounce' }, async (_ctx, input: { n: number }) => {
      seen.push(input.n);
      return input.n;
    });
    await worker();
    const ids = new Set<string>();
    for (let n = 1; n <= 20; n++) ids.add((await t.engine.start(wf, { n }, { debounce: { key: 'user-7', delay: '400ms' } })).runId);
    const lastStartAt = Date.now();
    expect(ids.size).toBe(1);
    const [runId] = [...ids];
    await expect(t.engine.handle(wf, runId!).result()).resolves.toBe(20);
    expect(seen).toEqual([20]);
    const run = (
      await db.pool.query(
        `select started_at, debounce_key, (select count(*)::int from runledger.events e where e.run_id = r.run_id and kind = 'debounced') as debounced from runledger.runs r where run_id = $1`,
        [runId],
      )
    ).rows[0];
    expect(run.debounce_key).toBe('user-7');
    expect(run.debounced).toBe(19);
    // Started no earlier than the delay after the last start (the database's clock and ours agree within a few ms here).
    expect(run.started_at.getTime()).toBeGreaterThanOrEqual(lastStartAt + 400 - 50);
    const runs = await db.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'reindex'`);
    expect(runs.rows[0].n).toBe(1);
  });

  it('another key, another workflow, or a start after the run began gives a run of its own', async () => {
    const wf = t.engine.workflow({ name: 'notify-user', queue: 'debounce' }, async (ctx, input: { n: number }) => {
      await ctx.waitForSignal('go');
      return input.n;
    });
    await worker();
    const a = await t.engine.start(wf, { n: 1 }, { debounce: { key: 'a', delay: 50 } });
    const b = await t.engine.start(wf, { n: 2 }, { debounce: { key: 'b', delay: 50 } });
    expect(a.runId).not.toBe(b.runId);
    await waitFor(
      'run a started',
      async () => (await db.pool.query(`select status from runledger.runs where run_id = $1`, [a.runId])).rows[0].status === 'WAITING',
    );
    // Run a has begun (it waits for a signal): a start with its key is a new run.
    const c = await t.engine.start(wf, { n: 3 }, { debounce: { key: 'a', delay: 50 } });
    expect(c.runId).not.toBe(a.runId);
    for (const h of [a, b, c]) {
      await waitFor(
        'the run waiting',
        async () => (await db.pool.query(`select status from runledger.runs where run_id = $1`, [h.runId])).rows[0].status === 'WAITING',
      );
      await t.engine.signal(h.runId, 'go');
    }
    expect(await Promise.all([a.result(), b.result(), c.result()])).toEqual([1, 2, 3]);
  });

  it('maxWait: a burst that never pauses still starts its run, no later than maxWait after its first start', async () => {
    const wf = t.engine.workflow({ name: 'max-wait', queue: 'debounce-max-wait' }, async (_ctx, input: { n: number }) => input.n);
    await t.engine.start(wf, { n: 0 }, { runAt: '1h' }); // registers the workflow; no worker serves this queue
    // The start set, in ms after the run's creation (the first start), by the database's clock.
    const times = async (runId: string) =>
      (
        await db.pool.query(
          `select extract(epoch from not_before - created_at) * 1000 as after_ms, input from runledger.runs where run_id = $1`,
          [runId],
        )
      ).rows[0] as { after_ms: string; input: { n: number } };
    // maxWait equal to the delay: every later start of the burst keeps the start the first one set.
    const capped = await t.engine.start(wf, { n: 1 }, { debounce: { key: 'capped', delay: '1m', maxWait: '1m' } });
    const free = await t.engine.start(wf, { n: 1 }, { debounce: { key: 'free', delay: '1m' } });
    // The rest of the burst at least 50 ms later (by the database's clock, which sets the times).
    await waitFor(
      '50 ms past the first starts',
      async () =>
        (
          await db.pool.query(
            `select runledger.now() > created_at + interval '50 milliseconds' as past from runledger.runs where run_id = $1`,
            [free.runId],
          )
        ).rows[0].past,
    );
    for (let n = 2; n <= 5; n++) {
      expect((await t.engine.start(wf, { n }, { debounce: { key: 'capped', delay: '1m', maxWait: '1m' } })).runId).toBe(capped.runId);
      expect((await t.engine.start(wf, { n }, { debounce: { key: 'free', delay: '1m' } })).runId).toBe(free.runId);
    }
    const c = await times(capped.runId);
    expect(c.input).toEqual({ n: 5 });
    // A minute after the first start (the first start's clock readings may differ by a millisecond).
    expect(Math.abs(Number(c.after_ms) - 60_000)).toBeLessThan(2);
    // Without maxWait the later starts moved it: more than a minute after the first.
    const f = await times(free.runId);
    expect(Number(f.after_ms)).toBeGreaterThan(60_000 + 50);
    // From SQL, and refused when shorter than the delay.
    const id = (
      await db.pool.query(
        `select runledger.start_run('max-wait', '{"n": 6}', '{"debounce": {"key": "capped", "delay_ms": 60000, "max_wait_ms": 60000}}') as id`,
      )
    ).rows[0].id;
    expect(id).toBe(capped.runId);
    expect(Math.abs(Number((await times(capped.runId)).after_ms) - 60_000)).toBeLessThan(2);
    await expect(
      db.pool.query(
        `select runledger.start_run('max-wait', '{"n": 7}', '{"debounce": {"key": "k2", "delay_ms": 60000, "max_wait_ms": 1000}}')`,
      ),
    ).rejects.toMatchObject({ code: 'RL003' });
    await expect(t.engine.start(wf, { n: 7 }, { debounce: { key: 'k2', delay: '1m', maxWait: '1s' } })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
    });
  });

  it('works from SQL: start_run with debounce collapses into the pending run; bad options are RL003', async () => {
    const wf = t.engine.workflow({ name: 'sql-debounced', queue: 'debounce-sql' }, async (_ctx, input: { v: string }) => input.v);
    await t.engine.start(wf, { v: 'register' }, { runAt: '1h' }); // registers the workflow; never runs in this test
    const first = (
      await db.pool.query(`select runledger.start_run('sql-debounced', '{"v":"x"}', '{"debounce":{"key":"k","delay_ms":60000}}') as id`)
    ).rows[0].id;
    const second = (
      await db.pool.query(`select runledger.start_run('sql-debounced', '{"v":"y"}', '{"debounce":{"key":"k","delay_ms":60000}}') as id`)
    ).rows[0].id;
    expect(second).toBe(first);
    const row = (
      await db.pool.query(`select input, not_before > now() + interval '50 seconds' as later from runledger.runs where run_id = $1`, [
        first,
      ])
    ).rows[0];
    expect(row).toEqual({ input: { v: 'y' }, later: true });
    for (const bad of [
      '{"debounce":{"key":"k"}}',
      '{"debounce":{"key":"","delay_ms":1}}',
      '{"debounce":{"key":"k","delay_ms":-1}}',
      '{"debounce":{"key":"k","delay_ms":1},"run_in_ms":5}',
      '{"debounce":{"key":"k","delay_ms":1,"extra":1}}',
    ]) {
      await expect(db.pool.query(`select runledger.start_run('sql-debounced', '{"v":"z"}', $1::jsonb)`, [bad])).rejects.toMatchObject({
        code: 'RL003',
      });
    }
    await expect(t.engine.start(wf, { v: 'z' }, { debounce: { key: 'k', delay: '1s' }, runId: 'mine' })).rejects.toBeInstanceOf(
      InvalidInputError,
    );
    await expect(t.engine.start(wf, { v: 'z' }, { debounce: { key: '', delay: '1s' } })).rejects.toBeInstanceOf(InvalidInputError);
    // A key jsonb cannot hold (a NUL) is refused before anything is sent: coded, nothing stored.
    await expect(t.engine.start(wf, { v: 'z' }, { debounce: { key: 'a\u0000b', delay: '1s' } })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
    });
    await expect(t.engine.startMany(wf, [{ v: 'z' }], { debounce: { key: 'k', delay: '1s' } } as never)).rejects.toBeInstanceOf(
      InvalidInputError,
    );
  });

  it('keys are per tenant: the same key in two tenants gives two runs', async () => {
    const wf = t.engine.workflow({ name: 'tenant-debounced', queue: 'debounce-tenants' }, async (_ctx, input: { v: string }) => input.v);
    const a = await t.engine.start(wf, { v: 'a' }, { debounce: { key: 'same', delay: '1h' }, tenantId: 'tenant-a' });
    const b = await t.engine.start(wf, { v: 'b' }, { debounce: { key: 'same', delay: '1h' }, tenantId: 'tenant-b' });
    expect(a.runId).not.toBe(b.runId);
    const rows = await db.pool.query(`select tenant_id, input from runledger.runs where run_id = any($1) order by tenant_id`, [
      [a.runId, b.runId],
    ]);
    expect(rows.rows).toEqual([
      { tenant_id: 'tenant-a', input: { v: 'a' } },
      { tenant_id: 'tenant-b', input: { v: 'b' } },
    ]);
  });
});
