/**
 * runledger._heartbeat: a worker renews the leases of the runs it owns, and only those.
 *
 * The test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts), on a workflow named after the file, with the transaction's
 * clock (runledger.fake_now, set local) in 2060.
 */
import { describe, expect } from 'vitest';
import { txTest } from '../helpers/test-tx.js';
import { setNowLocal } from '../helpers/session.js';
import { runHelpers, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';

const WORKFLOW = 'heartbeat';

const it = txTest.extend<{ db: TxDb }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
});

describe('runledger._heartbeat', () => {
  it('renews only the leases of runs this worker owns and returns their ids', async ({ db }) => {
    const { startRun } = runHelpers(db, { workflow: WORKFLOW });
    const { claimOne } = claimHelpers(db);
    const client = db.pool;
    await setNowLocal(client, '2060-01-01T00:00:00Z');
    await client.query(`select runledger._register_worker('wk-hb-a', 'host', 1, $1, '{default}', 2, 10000)`, [[`${WORKFLOW}@1`]]);
    // Each run is claimed as it is started: in the test's transaction no other session can
    // hold the others back from the claim (claimRun).
    const mine1 = await startRun({}, {}, client);
    await claimOne(mine1, 'wk-hb-a', 10_000, client);
    const mine2 = await startRun({}, {}, client);
    await claimOne(mine2, 'wk-hb-a', 10_000, client);
    const finished = await startRun({}, {}, client);
    const f = await claimOne(finished, 'wk-hb-a', 10_000, client);
    await client.query(`select runledger._complete_run($1, $2, 'null', 'p/1')`, [finished, f.fencing_token]);
    const theirs = await startRun({}, {}, client);
    await claimOne(theirs, 'wk-hb-b', 10_000, client);
    const pending = await startRun({}, {}, client);

    await setNowLocal(client, '2060-01-01T00:00:05Z');
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
