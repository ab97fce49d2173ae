import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';

/**
 * Approvals that need several people (requires: { count, of }), and approvers that are
 * database roles, checked against the deciding connection's role, never the name given.
 */
const t = useTestEngine();
const { db } = t;
const startWorker = queueWorkers(() => t.engine, 'approvals');
const SENIOR = `rl_senior_${process.pid}`;
const MEMBER = `rl_senior_member_${process.pid}`;
const OUTSIDER = `rl_outsider_${process.pid}`;
const ROLES = [SENIOR, MEMBER, OUTSIDER];

beforeAll(async () => {
  for (const role of ROLES) {
    await db.pool.query(`create role ${role} nologin`);
    // What an operator's login is given (sql/0014_security.sql): the operator actions and reads.
    await db.pool.query(`grant runledger_operator to ${role}`);
  }
  await db.pool.query(`grant ${SENIOR} to ${MEMBER}`);
});
afterAll(async () => {
  for (const role of ROLES) await db.pool.query(`drop owned by ${role}`);
  for (const role of ROLES) await db.pool.query(`drop role ${role}`);
});

/** A connection acting as `role` (SET ROLE), as an operator's login would. */
async function as<T>(role: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: db.url });
  await client.connect();
  try {
    await client.query(`set role ${role}`);
    return await fn(client);
  } finally {
    await client.end();
  }
}

const statusOf = async (runId: string) =>
  (await db.pool.query('select status from runledger.runs where run_id = $1', [runId])).rows[0].status;
async function pendingRequest(runId: string): Promise<string> {
  return waitFor('the approval request', async () => {
    const r = await db.pool.query(`select request_id from runledger.approvals where run_id = $1 and decision is null`, [runId]);
    return r.rows[0]?.request_id as string | undefined;
  });
}
const decide = (request: string, approved: boolean, by: string, note?: string) =>
  t.engine.decideApproval(request, { approved, decidedBy: by, ...(note ? { note } : {}) });

describe('an approval that needs two of three', () => {
  it('waits for the second approval, counts each person once, and hands the run every decision', async () => {
    const wf = t.engine.workflow({ name: 'two-of-three', queue: 'approvals' }, async (ctx) =>
      ctx.requestApproval('release', { action: 'release 2.0', requires: { count: 2, of: ['alice', 'bob', 'carol'] } }),
    );
    await startWorker();
    const handle = await t.engine.start(wf, undefined);
    const request = await pendingRequest(handle.runId);

    const first = await decide(request, true, 'alice', 'tests pass');
    expect(first).toMatchObject({ recorded: true, approved: null, required: 2, votes: [{ decidedBy: 'alice', approved: true }] });
    expect(await decide(request, true, 'alice')).toMatchObject({ recorded: false, approved: null, votes: [expect.anything()] });
    await expect(decide(request, true, 'mallory')).rejects.toMatchObject({ code: 'NOT_ALLOWED' });
    expect(await statusOf(handle.runId)).toBe('WAITING');

    const second = await decide(request, true, 'bob', 'ship it');
    expect(second).toMatchObject({ recorded: true, approved: true, decidedBy: 'bob', required: 2 });
    const output = (await handle.result()) as {
      approved: boolean;
      decidedBy: string;
      votes: Array<{ decidedBy: string; approved: boolean }>;
    };
    expect(output).toMatchObject({ approved: true, decidedBy: 'bob', requestId: request });
    expect(output.votes.map((v) => [v.decidedBy, v.approved])).toEqual([
      ['alice', true],
      ['bob', true],
    ]);
    // Decided: later decisions change nothing.
    expect(await decide(request, false, 'carol')).toMatchObject({ recorded: false, approved: true });
    const votes = await db.pool.query(
      'select voter, approved from runledger.approval_votes where request_id = $1 order by decided_at, voter',
      [request],
    );
    expect(votes.rows).toEqual([
      { voter: 'alice', approved: true },
      { voter: 'bob', approved: true },
    ]);
  });

  it('ends at the first rejection', async () => {
    const wf = t.engine.workflow({ name: 'two-of-three-rejected', queue: 'approvals' }, async (ctx) =>
      ctx.requestApproval('release', { action: 'release 2.1', requires: { count: 2, of: ['alice', 'bob', 'carol'] } }),
    );
    await startWorker();
    const handle = await t.engine.start(wf, undefined);
    const request = await pendingRequest(handle.runId);
    await decide(request, true, 'alice');
    expect(await decide(request, false, 'carol', 'not this week')).toMatchObject({ recorded: true, approved: false, decidedBy: 'carol' });
    expect(await handle.result()).toMatchObject({
      approved: false,
      decidedBy: 'carol',
      note: 'not this week',
      votes: [{ decidedBy: 'alice' }, { decidedBy: 'carol' }],
    });
  });

  it('refuses a bad policy', async () => {
    const bad = [
      [{ count: 0, of: ['a'] }, 'requires.count must be a whole number from 1 to 1'],
      [{ count: 3, of: ['a', 'b'] }, 'from 1 to 2'],
      [{ count: 1, of: [] }, 'requires.of must be a non-empty list'],
    ] as const;
    for (const [requires, message] of bad) {
      const wf = t.engine.workflow({ name: `bad-policy-${requires.count}-${requires.of.length}`, queue: 'approvals' }, async (ctx) =>
        ctx.requestApproval('x', { action: 'x', requires: requires as never }),
      );
      await startWorker();
      const handle = await t.engine.start(wf, undefined);
      await expect(handle.result()).rejects.toMatchObject({ details: { status: 'FAILED' } });
      expect((await t.engine.getRun(handle.runId))?.error).toMatchObject({ code: 'CONFIG', message: expect.stringContaining(message) });
    }
  });
});

describe('an approver that is a database role', () => {
  it('is met by the deciding role being a member, not by the name given', async () => {
    const wf = t.engine.workflow({ name: 'role-approval', queue: 'approvals' }, async (ctx) =>
      ctx.requestApproval('refund', { action: 'refund 500 EUR', approvers: [SENIOR] }),
    );
    await startWorker();
    const handle = await t.engine.start(wf, undefined);
    const request = await pendingRequest(handle.runId);
    // An outsider giving the role's name as its own is refused.
    await expect(as(OUTSIDER, (c) => c.query('select runledger.decide_approval($1, true, $2)', [request, SENIOR]))).rejects.toMatchObject({
      code: 'RL007',
      message: expect.stringContaining(`role ${OUTSIDER}`),
    });
    expect(await statusOf(handle.runId)).toBe('WAITING');
    await as(MEMBER, (c) => c.query(`select runledger.decide_approval($1, true, 'dana', 'checked the invoice')`, [request]));
    expect(await handle.result()).toMatchObject({ approved: true, decidedBy: 'dana' });
    const row = await db.pool.query('select decided_by, decided_db_role from runledger.approvals where request_id = $1', [request]);
    expect(row.rows).toEqual([{ decided_by: 'dana', decided_db_role: MEMBER }]);
  });
});
