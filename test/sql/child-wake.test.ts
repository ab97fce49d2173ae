/**
 * A parent parks WAITING for its child in the same moment the child ends: the child's
 * wake-up must not be lost. Under READ COMMITTED an UPDATE ... WHERE status = 'WAITING'
 * skips a row whose committed version is still RUNNING, without waiting for the
 * transaction that is parking it; so the waker must lock the row first.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { registerWorkflowW, runHelpers } from '../helpers/runs.js';
import { claimHelpers } from '../helpers/claim.js';
import { waitFor } from '../helpers/database.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun, getRun } = runHelpers(db);
const { claimOne } = claimHelpers(db);

describe('a child ending while its parent parks to wait for it', () => {
  it('wakes the parent: the waker waits for the parking transaction instead of skipping the row', async () => {
    const parent = await startRun({ queue: 'child-wake-parent' });
    const p = await claimOne(parent, 'wk-parent');
    const child = (
      await db.pool.query(
        `select runledger._start_child(p_run_id => $1, p_token => $2, p_seq => 0, p_name => 'child:w', p_workflow => 'w',
                                       p_input => '{}'::jsonb, p_options => '{"queue": "child-wake-child"}'::jsonb) as id`,
        [parent, p.fencing_token],
      )
    ).rows[0].id as string;
    const c = await claimOne(child, 'wk-child');

    // The parent's worker parks it, and has not committed yet.
    const parking = new pg.Client({ connectionString: db.url });
    await parking.connect();
    try {
      await parking.query('begin');
      const waited = await parking.query(
        `select done from runledger._wait(p_run_id => $1, p_token => $2, p_seq => 1, p_name => 'child:w', p_kind => 'child',
                                          p_spec => jsonb_build_object('child_run_id', $3::text))`,
        [parent, p.fencing_token, child],
      );
      expect(waited.rows[0].done).toBe(false);
      // The child ends meanwhile, on another connection.
      const completing = db.pool.query(
        `select runledger._complete_run(p_run_id => $1, p_token => $2, p_output => '"done"'::jsonb, p_policy_version => 'w@1')`,
        [child, c.fencing_token],
      );
      await waitFor('the completion to wait for the parked parent row, or to finish', async () => {
        const blocked = await db.pool.query(
          `select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and query like '%_complete_run%'`,
        );
        const finished = (await getRun(child))?.status === 'SUCCEEDED';
        return blocked.rows[0].n === 1 || finished;
      });
      await parking.query('commit');
      await completing;
    } finally {
      await parking.end();
    }
    expect((await getRun(child))?.status).toBe('SUCCEEDED');
    expect(await getRun(parent)).toMatchObject({ status: 'PENDING', wait_kind: null });
  });
});
