/**
 * runledger._rate_limit_acquire: how long a caller refused a permit is told to wait. The
 * places of a key free once a window, max_calls a round: a caller with many ahead of it
 * waits about (ahead / max_calls) windows however few calls the current window holds (a
 * nearly empty window, just after a pause ended, once told it ahead / calls windows: a run
 * parked for 80 s behind a queue that drained in 5).
 *
 * In a transaction rolled back at its end (test/helpers/test-tx.ts), with the transaction's
 * clock (runledger.fake_now) in 2060.
 */
import { describe, expect } from 'vitest';
import { txTest } from '../helpers/test-tx.js';
import { setNowLocal } from '../helpers/session.js';
import { runHelpers, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';

const WORKFLOW = 'rate-limit-places';

const it = txTest.extend<{ db: TxDb }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
});

async function claimedRun(db: TxDb): Promise<{ runId: string; token: string }> {
  const { startRun } = runHelpers(db, { workflow: WORKFLOW });
  const { claimOne } = claimHelpers(db);
  const runId = await startRun({}, {}, db.pool);
  const claimed = await claimOne(runId, 'wk-places', 60_000, db.pool);
  return { runId, token: String(claimed.fencing_token) };
}

const acquire = async (db: TxDb, run: { runId: string; token: string }, seq: number) =>
  (
    await db.pool.query<{ granted: boolean; wait_ms: string }>(`select * from runledger._rate_limit_acquire($1, $2, $3, 'places')`, [
      run.runId,
      run.token,
      seq,
    ])
  ).rows[0]!;

describe('runledger._rate_limit_acquire: the wait it tells', () => {
  it('behind 90 waiters on a key of 20 per second whose window holds one call: about four windows, not 72', async ({ db }) => {
    await setNowLocal(db.pool, '2060-01-01T00:00:00Z');
    await db.pool.query(`select runledger._register_worker('wk-places', 'host', 1, $1, '{default}', 2, 10000)`, [[`${WORKFLOW}@1`]]);
    await db.pool.query(`select runledger.set_rate_limit('places', 20, interval '1 second')`);
    const first = await claimedRun(db);
    expect(await acquire(db, first, 1)).toMatchObject({ granted: true });
    // 90 callers already in line (one run's positions, waiting since before the next caller).
    await db.pool.query(
      `insert into runledger.rate_limit_waiters (run_id, seq, key, since, until)
       select $1, 100 + i, 'places', runledger.now(), runledger.now() + interval '1 hour' from generate_series(1, 90) i`,
      [first.runId],
    );
    await setNowLocal(db.pool, '2060-01-01T00:00:00.100Z');
    const caller = await claimedRun(db);
    // Its place is the 72nd to free (1 call + 90 ahead - 20 places): round 3 of 20 places a
    // window of 1.1 s (per and a tenth), from now: 4 windows, 4.4 s.
    expect(await acquire(db, caller, 1)).toEqual({ granted: false, wait_ms: '4400' });
  });

  it('waiters whose run ended without a permit (or is gone) hold no place, and their rows go when the next caller meets them', async ({ db }) => {
    await setNowLocal(db.pool, '2060-01-01T00:00:00Z');
    await db.pool.query(`select runledger._register_worker('wk-places', 'host', 1, $1, '{default}', 2, 10000)`, [[`${WORKFLOW}@1`]]);
    await db.pool.query(`select runledger.set_rate_limit('places', 1, interval '1 second')`);
    const ended = await claimedRun(db);
    await db.pool.query(
      `insert into runledger.rate_limit_waiters (run_id, seq, key, since, until)
       select $1, i, 'places', runledger.now(), runledger.now() + interval '1 hour' from generate_series(1, 5) i
       union all select 'pruned-run', 1, 'places', runledger.now(), runledger.now() + interval '1 hour'`,
      [ended.runId],
    );
    await db.pool.query(`select runledger._complete_run($1, $2, 'null', 'p/1')`, [ended.runId, ended.token]);
    const caller = await claimedRun(db);
    // Nobody ahead of it and no call in the window: let through at once.
    expect(await acquire(db, caller, 1)).toEqual({ granted: true, wait_ms: '0' });
    const left = await db.pool.query(`select run_id from runledger.rate_limit_waiters where key = 'places'`);
    expect(left.rows).toEqual([]);
  });

  it('with a full window and nobody ahead: the place of the oldest call in the window, a window after it', async ({ db }) => {
    await setNowLocal(db.pool, '2060-01-01T00:00:00Z');
    await db.pool.query(`select runledger._register_worker('wk-places', 'host', 1, $1, '{default}', 2, 10000)`, [[`${WORKFLOW}@1`]]);
    await db.pool.query(`select runledger.set_rate_limit('places', 20, interval '1 second')`);
    const first = await claimedRun(db);
    for (let i = 0; i < 20; i++) {
      await setNowLocal(db.pool, `2060-01-01T00:00:00.${String(i * 40).padStart(3, '0')}Z`);
      expect(await acquire(db, first, i)).toMatchObject({ granted: true });
    }
    await setNowLocal(db.pool, '2060-01-01T00:00:00.900Z');
    const caller = await claimedRun(db);
    // The oldest call (at 0.000) frees its place at 1.100: 200 ms from 0.900.
    expect(await acquire(db, caller, 1)).toEqual({ granted: false, wait_ms: '200' });
  });
});
