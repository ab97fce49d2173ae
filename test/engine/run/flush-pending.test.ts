/**
 * A run's last finished step is checkpointed lazily (with the next step, or with the
 * completion). When a halt (a cancel, a shutdown) comes while that write is on its way,
 * the halt must wait for it: otherwise the run can end (CANCELLED) before the step's
 * result is kept, and the result is lost although the step finished before the cancel.
 */
import pg from 'pg';
import { describe, expect, it } from 'vitest';
import { Execution } from '../../../src/engine/run/execution.js';
import { flushPending } from '../../../src/engine/run/checkpoint.js';
import { GroupCommit } from '../../../src/engine/worker/group-commit.js';
import { monotonicMark } from '../../../src/engine/core/duration.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { registerWorkflowW, runHelpers } from '../../helpers/runs.js';
import { claimHelpers } from '../../helpers/claim.js';
import { waitFor } from '../../helpers/database.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun, steps } = runHelpers(db);
const { claimOne } = claimHelpers(db);

describe('flushPending', () => {
  it('a second call (the halt) waits for the write the first call (the next step) has on its way', async () => {
    const runId = await startRun();
    const claimed = await claimOne(runId, 'wk-flush');
    // The checkpoint goes as a worker sends it: an item of a group commit (here a batch of one).
    const commits = new GroupCommit(db.pool, 1, 64);
    const deps = {
      pool: db.pool,
      db: undefined as never,
      maxPayloadBytes: 1 << 20,
      log: () => {},
      registerWorkflow: async () => {},
      commits,
    };
    const exec = new Execution(
      {
        runId,
        fencingToken: BigInt(claimed.fencing_token),
        attempt: 1,
        checkpoints: [],
        claimedAt: Date.now(),
        workflowName: claimed.workflow_name,
        workflowVersion: claimed.workflow_version,
      },
      deps,
    );
    exec.pendingCheckpoint = {
      seq: 0,
      name: 'a',
      kind: 'step',
      status: 'SUCCEEDED',
      outputText: '1',
      error: undefined,
      attempts: 1,
      startedAt: monotonicMark(),
    };

    // Another session holds the run's row lock, so the checkpoint write (fenced by that lock) waits.
    const blocker = new pg.Client({ connectionString: db.url });
    await blocker.connect();
    try {
      await blocker.query('begin');
      await blocker.query('select 1 from runledger.runs where run_id = $1 for update', [runId]);
      const first = flushPending(exec);
      await waitFor('the checkpoint write to wait for the row lock', async () => {
        const waiting = await db.pool.query(
          `select count(*)::int as n from pg_stat_activity where wait_event_type = 'Lock' and query like '%runledger._commit_batch%'`,
        );
        return waiting.rows[0].n === 1;
      });
      let secondSettled = false;
      const second = flushPending(exec).then((ok) => ((secondSettled = true), ok));
      for (let i = 0; i < 20; i++) await new Promise((resolve) => setImmediate(resolve));
      expect(secondSettled).toBe(false);
      expect(await steps(runId)).toEqual([]);
      await blocker.query('commit');
      expect(await first).toBe(true);
      expect(await second).toBe(true);
      expect((await steps(runId)).map((s) => s.name)).toEqual(['a']);
    } finally {
      await blocker.end();
    }
  });
});
