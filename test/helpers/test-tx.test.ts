/**
 * test/helpers/test-tx.ts: each test's `tx` is a transaction on the shared database that is
 * rolled back at the test's end. The tests of this file run in order: what the first writes,
 * the second must not find.
 */
import pg from 'pg';
import { describe, expect, inject } from 'vitest';
import { inSavepoint, txTest as it } from './test-tx.js';

const WORKFLOW = 'test-tx-probe';

async function probeRuns(on: pg.ClientBase): Promise<number> {
  const result = await on.query('select count(*)::int as n from runledger.runs where workflow_name = $1', [WORKFLOW]);
  return result.rows[0].n;
}

describe('a test transaction', () => {
  it('holds what the test writes: a registered workflow, a started run, a table', async ({ tx }) => {
    await tx.query(`select runledger._register_workflow($1, '1', 'default', 3)`, [WORKFLOW]);
    await tx.query(`select runledger.start_run($1, '{"n": 1}'::jsonb, '{}'::jsonb)`, [WORKFLOW]);
    await tx.query('create table test_tx_probe (id int primary key)');
    await tx.query('insert into test_tx_probe values (1)');
    await tx.query(`set runledger.fake_now = '2031-01-01T00:00:00Z'`);
    expect(await probeRuns(tx)).toBe(1);
    expect((await tx.query('select count(*)::int as n from test_tx_probe')).rows[0].n).toBe(1);
    expect(((await tx.query('select runledger.now() as t')).rows[0].t as Date).toISOString()).toBe('2031-01-01T00:00:00.000Z');
  });

  it('is rolled back when the test ends: the next test finds none of it', async ({ tx }) => {
    expect(await probeRuns(tx)).toBe(0);
    expect((await tx.query(`select to_regclass('public.test_tx_probe') as t`)).rows[0].t).toBeNull();
    const clock = (await tx.query('select runledger.now() as moved, clock_timestamp() as real')).rows[0];
    expect(Math.abs(clock.moved.getTime() - clock.real.getTime())).toBeLessThan(60_000);
  });

  it('is not seen by another connection to the shared database while it is open', async ({ tx }) => {
    await tx.query(`select runledger._register_workflow($1, '1', 'default', 3)`, [WORKFLOW]);
    await tx.query(`select runledger.start_run($1, '{"n": 1}'::jsonb, '{}'::jsonb)`, [WORKFLOW]);
    const other = new pg.Client({ connectionString: inject('sharedDatabaseUrl') });
    await other.connect();
    try {
      expect(await probeRuns(tx)).toBe(1);
      expect(await probeRuns(other)).toBe(0);
    } finally {
      await other.end();
    }
  });

  it('goes on after a statement that fails inside inSavepoint, keeping what came before', async ({ tx }) => {
    await tx.query(`select runledger._register_workflow($1, '1', 'default', 3)`, [WORKFLOW]);
    const failed = await inSavepoint(tx, () => tx.query(`select runledger.start_run('no-such-workflow', '{}'::jsonb, '{}'::jsonb)`)).catch(
      (error: unknown) => error,
    );
    expect(failed).toMatchObject({ code: 'RL006' });
    await tx.query(`select runledger.start_run($1, '{"n": 1}'::jsonb, '{}'::jsonb)`, [WORKFLOW]);
    expect(await probeRuns(tx)).toBe(1);
  });

  it('each test gets a transaction of its own', async ({ tx }) => {
    expect(tx.getTransactionStatus()).toBe('T');
    expect(await probeRuns(tx)).toBe(0);
  });
});
