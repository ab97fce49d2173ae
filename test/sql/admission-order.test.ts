/**
 * Claims in a queue with limits take admitted runs in the order admission chose
 * (runledger._admit: fair turns across concurrency keys), not by age.
 *
 * Each test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts); the workflow is named after the file.
 */
import { describe, expect } from 'vitest';
import { txTest } from '../helpers/test-tx.js';
import { runHelpers, newRunId, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { claimHelpers, claimedIds } from '../helpers/claim.js';

const WORKFLOW = 'admission-order';

const it = txTest.extend<{ db: TxDb }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
});

describe('claims in a queue with limits follow admission order', () => {
  it('_admit gives each run of a round its own admitted_at, in fair turns; a claim smaller than the round keeps that order', async ({ db }) => {
    const { startRun } = runHelpers(db, { workflow: WORKFLOW });
    const { claimBatch } = claimHelpers(db);
    const queue = newRunId('admission-order-fair');
    await db.pool.query(`select runledger.set_queue($1, '{"concurrency": 4}'::jsonb)`, [queue]);
    // Tenant A's three runs are older than B's one, and A already runs one (claimed below).
    const a = [];
    for (let i = 0; i < 4; i++) a.push(await startRun({ queue, concurrency_key: 'tenant-a' }));
    const first = claimedIds(await claimBatch('wk-fair', [queue], [`${WORKFLOW}@1`], 1));
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
    expect(claimedIds(await claimBatch('wk-fair', [queue], [`${WORKFLOW}@1`], 1))).toEqual([b]);
    expect(claimedIds(await claimBatch('wk-fair', [queue], [`${WORKFLOW}@1`], 2))).toEqual(admitted.rows.slice(1).map((r) => r.run_id));
  });
});
