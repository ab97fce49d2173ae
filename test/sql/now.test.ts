/**
 * runledger.now(): the clock every SQL function reads, moved per session or transaction
 * with runledger.fake_now (a frozen instant) or runledger.clock_offset (a running clock
 * ahead of or behind the real one), in a database whose owner switched the test clock on
 * (runledger.owner_settings.test_clock, as runledger/testing does for its databases);
 * elsewhere neither setting moves it.
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { sessionHelpers, setNow } from '../helpers/session.js';
import { runHelpers, registerWorkflowW } from '../helpers/runs.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { session } = sessionHelpers(db);
const { startRun, getRun } = runHelpers(db);

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

  it('runs ahead or behind by runledger.clock_offset, in the session and in defaults of rows written there; fake_now wins', async () => {
    await session(async (client) => {
      const skew = async () => {
        const row = (await client.query('select runledger.now() as moved, clock_timestamp() as real')).rows[0];
        return row.moved.getTime() - row.real.getTime();
      };
      await client.query(`set runledger.clock_offset = '5 minutes'`);
      expect(Math.abs((await skew()) - 300_000)).toBeLessThan(1_000);
      const runId = await startRun({}, {}, client);
      expect(Math.abs((await getRun(runId))!.created_at.getTime() - (Date.now() + 300_000))).toBeLessThan(5_000);
      await client.query(`set runledger.clock_offset = '-00:05:00'`);
      expect(Math.abs((await skew()) + 300_000)).toBeLessThan(1_000);
      await setNow(client, '2031-02-03T04:05:06Z');
      expect((await client.query('select runledger.now() as t')).rows[0].t.toISOString()).toBe('2031-02-03T04:05:06.000Z');
      await setNow(client, '');
      await client.query(`set runledger.clock_offset = ''`);
      expect(Math.abs(await skew())).toBeLessThan(1_000);
    });
  });

  it('follows neither setting while the owner has not switched the test clock on, and is inlined either way', async () => {
    const skewOf = async (client: import('pg').Client) => {
      const row = (await client.query('select runledger.now() as moved, clock_timestamp() as real')).rows[0];
      return row.moved.getTime() - row.real.getTime();
    };
    await db.pool.query('update runledger.owner_settings set test_clock = false');
    try {
      await session(async (client) => {
        await setNow(client, '2031-02-03T04:05:06Z');
        await client.query(`set runledger.clock_offset = '-2 days'`);
        expect(Math.abs(await skewOf(client))).toBeLessThan(1_000);
        const runId = await startRun({}, {}, client);
        expect(Math.abs((await getRun(runId))!.created_at.getTime() - Date.now())).toBeLessThan(5_000);
        // Switched on by the owner, the same session's settings move the clock at once.
        await db.pool.query('update runledger.owner_settings set test_clock = true');
        expect((await client.query('select runledger.now() as t')).rows[0].t.toISOString()).toBe('2031-02-03T04:05:06.000Z');
        await setNow(client, '');
        expect(Math.abs((await skewOf(client)) + 2 * 86_400_000)).toBeLessThan(1_000);
      });
    } finally {
      await db.pool.query('update runledger.owner_settings set test_clock = true where not test_clock');
    }
    // Each switch is recorded, with the login that made it.
    const { rows } = await db.pool.query(
      `select db_user, arguments from runledger.audit_log where action = 'owner_settings' order by audit_id desc limit 2`,
    );
    expect(rows.map((r) => [r.arguments.old.test_clock, r.arguments.new.test_clock])).toEqual([
      [false, true],
      [true, false],
    ]);
    // Still inlined: the plan holds the expression, not a call of runledger.now().
    const plan = (await db.pool.query('explain verbose select runledger.now()')).rows.map((r) => r['QUERY PLAN']).join('\n');
    expect(plan).toContain('clock_timestamp()');
    expect(plan).not.toMatch(/runledger\.now\(\)/);
  });
});
