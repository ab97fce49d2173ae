/**
 * runs_session_release fires only for runs marked in_sessions (sql/0012_agents.sql):
 * a run that never held a session nor queued for one ends without the trigger's query, and
 * every path that makes a run a holder or a waiter marks it. Runs are claimed and completed
 * through the engine's SQL functions; the trigger's calls are counted in the transaction that
 * ends the run (pg_stat_xact_user_functions, track_functions = all).
 */
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { registerWorkflowW, runHelpers } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun } = runHelpers(db);
const { claimOne } = claimHelpers(db);

/**
 * Completes a claimed run and returns how often the trigger function ran meanwhile. The
 * backend's not yet reported function counts can hold earlier transactions' calls too, so
 * the figure is the difference of two reads around the completion.
 */
async function completeCounting(runId: string, token: number): Promise<number> {
  const client = await db.pool.connect();
  const calls = async () =>
    (
      await client.query(
        `select coalesce(sum(calls), 0)::int as n from pg_stat_xact_user_functions where schemaname = 'runledger' and funcname = '_session_on_terminal'`,
      )
    ).rows[0].n as number;
  try {
    await client.query('begin');
    await client.query(`set local track_functions = 'all'`);
    const before = await calls();
    await client.query(`select runledger._complete_run(p_run_id => $1, p_token => $2, p_output => '1'::jsonb, p_policy_version => 'w@1')`, [
      runId,
      token,
    ]);
    const after = await calls();
    await client.query('commit');
    return after - before;
  } finally {
    client.release();
  }
}

const inSessions = async (runId: string) =>
  (await db.pool.query(`select in_sessions from runledger.runs where run_id = $1`, [runId])).rows[0].in_sessions as boolean | null;

describe('runs_session_release', () => {
  it('does not run for a run that never held a session nor queued for one', async () => {
    const plain = await startRun({ queue: 'session-mark-plain' });
    const claimed = await claimOne(plain, 'sm-plain');
    expect(await inSessions(plain)).toBeNull();
    expect(await completeCounting(plain, claimed.fencing_token)).toBe(0);
  });

  it('runs for a holder and a waiter, each marked when it took its place; the session goes to the waiter', async () => {
    const holder = await startRun({ queue: 'session-mark-a' });
    const waiter = await startRun({ queue: 'session-mark-b' });
    const h = await claimOne(holder, 'sm-holder');
    const w = await claimOne(waiter, 'sm-waiter');
    const held = await db.pool.query(`select runledger._session_acquire('mark-1', $1) as r`, [holder]);
    expect(held.rows[0].r).toMatchObject({ held: true });
    const queued = await db.pool.query(`select runledger._session_acquire('mark-1', $1) as r`, [waiter]);
    expect(queued.rows[0].r).toMatchObject({ held: false, holder, position: 1 });
    expect(await inSessions(holder)).toBe(true);
    expect(await inSessions(waiter)).toBe(true);

    // The holder ends: the trigger runs once and hands the session to the waiter.
    expect(await completeCounting(holder, h.fencing_token)).toBe(1);
    const session = await db.pool.query(`select holder_run_id, last_holder_run_id, release_reason from runledger.sessions where session_id = 'mark-1'`);
    expect(session.rows[0]).toEqual({ holder_run_id: waiter, last_holder_run_id: holder, release_reason: 'ended' });
    // The waiter, now the holder, ends: the session is free and nobody waits.
    expect(await completeCounting(waiter, w.fencing_token)).toBe(1);
    const freed = await db.pool.query(
      `select holder_run_id, (select count(*)::int from runledger.session_waiters where session_id = 'mark-1') as waiting
         from runledger.sessions where session_id = 'mark-1'`,
    );
    expect(freed.rows[0]).toEqual({ holder_run_id: null, waiting: 0 });
  });

  it('lets a marked run keep its session when its status changes to anything but an end (the status test is in the function)', async () => {
    const holder = await startRun({ queue: 'session-mark-e' });
    const waiter = await startRun({ queue: 'session-mark-f' });
    await claimOne(holder, 'sm-holder-3');
    await claimOne(waiter, 'sm-waiter-3');
    await db.pool.query(`select runledger._session_acquire('mark-3', $1)`, [holder]);
    await db.pool.query(`select runledger._session_acquire('mark-3', $1)`, [waiter]);
    // Both marked runs go from RUNNING to WAITING (a wait, not an end): the trigger fires for
    // each, and neither lets go of its place.
    await db.pool.query(
      `update runledger.runs set status = 'WAITING', wait_kind = 'signal', wait_key = 'later',
                                 lease_owner = null, lease_expires_at = null
        where run_id = any($1)`,
      [[holder, waiter]],
    );
    const session = await db.pool.query(
      `select holder_run_id, (select array_agg(run_id) from runledger.session_waiters where session_id = 'mark-3') as waiting
         from runledger.sessions where session_id = 'mark-3'`,
    );
    expect(session.rows[0]).toEqual({ holder_run_id: holder, waiting: [waiter] });
  });

  it('runs for a run that queued and gave up its place: it ends without leaving anything behind', async () => {
    const holder = await startRun({ queue: 'session-mark-c' });
    const leaver = await startRun({ queue: 'session-mark-d' });
    await claimOne(holder, 'sm-holder-2');
    const l = await claimOne(leaver, 'sm-leaver');
    await db.pool.query(`select runledger._session_acquire('mark-2', $1)`, [holder]);
    await db.pool.query(`select runledger._session_acquire('mark-2', $1)`, [leaver]);
    await db.pool.query(`select runledger._session_leave('mark-2', $1)`, [leaver]);
    expect(await inSessions(leaver)).toBe(true);
    // Marked once, it stays marked: the trigger runs and finds nothing to do.
    expect(await completeCounting(leaver, l.fencing_token)).toBe(1);
    const session = await db.pool.query(`select holder_run_id from runledger.sessions where session_id = 'mark-2'`);
    expect(session.rows[0].holder_run_id).toBe(holder);
  });
});
