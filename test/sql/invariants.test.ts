/**
 * The invariants of runs and steps rows (the trigger runs_invariants and its function
 * runledger._check_run: the row's rules, its run_id and its status changes; the constraint
 * steps_invariants, runledger._check_step): each broken rule is reported with its own name.
 *
 * Each test runs in a transaction on the shared database, rolled back at its end
 * (test/helpers/test-tx.ts), on a workflow and run ids named after the file. A statement
 * meant to fail goes through `guarded`, which runs it under a savepoint so that the test
 * can go on after it.
 */
import type pg from 'pg';
import { describe, expect } from 'vitest';
import { inSavepoint, txTest } from '../helpers/test-tx.js';
import { runHelpers, newRunId as newId, registerWorkflow, type TxDb } from '../helpers/runs.js';
import { sqlState, checkViolation } from '../helpers/sql-errors.js';
import { insertRun as insertAnyRun, type RunFields } from '../helpers/run-factory.js';

const WORKFLOW = 'invariants';

/** The test's transaction, each statement under a savepoint (inSavepoint). */
type Guarded = Pick<pg.Pool, 'query'>;

const it = txTest.extend<{ db: TxDb; guarded: Guarded }>({
  db: async ({ tx }, use) => {
    await registerWorkflow(tx, WORKFLOW);
    await use({ pool: tx });
  },
  guarded: async ({ db }, use) => {
    const query = (text: string, values?: unknown[]) => inSavepoint(db.pool, () => db.pool.query(text, values));
    await use({ query } as Guarded);
  },
});

/** A run id of this file. */
const newRunId = (label: string) => newId(`invariants-${label}`);
/** A run of this file's workflow (test/helpers/run-factory.ts). */
const insertRun = (on: Pick<pg.Pool, 'query'>, fields: RunFields) => insertAnyRun(on, { workflow: WORKFLOW, ...fields });
const helpers = (db: TxDb) => runHelpers(db, { workflow: WORKFLOW });

describe('runs check constraints', () => {
  it('rejects a RUNNING run without lease_owner (and accepts one with its lease)', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('c-running'), status: 'RUNNING', leaseOwner: null, leaseExpiresAt: new Date() }))).toEqual({
      code: '23514',
      constraint: 'runs_lease_only_when_executing',
    });
    // The same move by update on an existing run.
    const runId = await startRun();
    expect(await checkViolation(guarded.query(`update runledger.runs set status = 'RUNNING' where run_id = $1`, [runId]))).toEqual({
      code: '23514',
      constraint: 'runs_lease_only_when_executing',
    });
    // Control: with owner and expiry it is a valid row.
    const ok = newRunId('c-running-ok');
    await insertRun(db.pool, { runId: ok, status: 'RUNNING', leaseOwner: 'wk', leaseExpiresAt: new Date() });
    expect((await getRun(ok))?.status).toBe('RUNNING');
  });

  it('rejects a lease on a run that is not executing', async ({ guarded }) => {
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('c-pending'), status: 'PENDING', leaseOwner: 'wk', leaseExpiresAt: new Date() }))).toEqual({
      code: '23514',
      constraint: 'runs_lease_only_when_executing',
    });
  });

  it('rejects a terminal status without termination_reason (and accepts one with its record)', async ({ db, guarded }) => {
    const { getRun } = helpers(db);
    for (const status of ['SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER']) {
      expect(await checkViolation(insertRun(guarded, { runId: newRunId('c-terminal'), status, finishedAt: new Date(), terminationReason: null })), status).toEqual({
        code: '23514',
        constraint: 'runs_terminal_has_record',
      });
    }
    // From RUNNING, a transition the state machine allows (runs_transition), so the row rule is what refuses it.
    const runId = await insertRun(db.pool, { runId: newRunId('c-terminal-upd'), status: 'RUNNING' });
    expect(
      await checkViolation(
        guarded.query(`update runledger.runs set status = 'SUCCEEDED', finished_at = now(), lease_owner = null, lease_expires_at = null where run_id = $1`, [runId]),
      ),
    ).toEqual({ code: '23514', constraint: 'runs_terminal_has_record' });
    const ok = newRunId('c-terminal-ok');
    await insertRun(db.pool, { runId: ok, status: 'SUCCEEDED', finishedAt: new Date(), terminationReason: 'COMPLETED' });
    expect((await getRun(ok))?.status).toBe('SUCCEEDED');
  });

  it('rejects a termination_reason outside the documented list', async ({ guarded }) => {
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('c-reason'), status: 'FAILED', finishedAt: new Date(), terminationReason: 'OOPS' }))).toEqual({
      code: '23514',
      constraint: 'runs_termination_reason_check',
    });
  });
});

describe('runs invariants: the other rule names of runledger._check_run', () => {
  const violated = (constraint: string) => ({ code: '23514', constraint });
  const update = (on: Guarded, runId: string, set: string) => on.query(`update runledger.runs set ${set} where run_id = $1`, [runId]);

  it('runs_wait_kind_check: a wait_kind outside the list', async ({ db, guarded }) => {
    const { getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-wk'), status: 'WAITING', waitKind: 'nap' }))).toEqual(violated('runs_wait_kind_check'));
    // From RUNNING (RUNNING -> WAITING is a transition the state machine allows), giving up the lease as a wait does.
    const runId = await insertRun(db.pool, { runId: newRunId('i-wk-upd'), status: 'RUNNING' });
    expect(await checkViolation(update(guarded, runId, `status = 'WAITING', wait_kind = 'snooze', lease_owner = null, lease_expires_at = null`))).toEqual(
      violated('runs_wait_kind_check'),
    );
    // Every listed kind is accepted.
    for (const kind of ['timer', 'signal', 'approval', 'child', 'retry', 'reconcile']) {
      const ok = newRunId('i-wk-ok');
      await insertRun(db.pool, { runId: ok, status: 'WAITING', waitKind: kind });
      expect((await getRun(ok))?.wait_kind).toBe(kind);
    }
  });

  it('runs_wait_kind_only_when_waiting: a wait_kind exactly when WAITING', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-wkw'), status: 'PENDING', waitKind: 'timer' }))).toEqual(
      violated('runs_wait_kind_only_when_waiting'),
    );
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-wkw'), status: 'WAITING', waitKind: null }))).toEqual(violated('runs_wait_kind_only_when_waiting'));
    const running = await insertRun(db.pool, { runId: newRunId('i-wkw-upd'), status: 'RUNNING' });
    expect(await checkViolation(update(guarded, running, `status = 'WAITING', lease_owner = null, lease_expires_at = null`))).toEqual(
      violated('runs_wait_kind_only_when_waiting'),
    );
    const runId = await startRun();
    expect(await checkViolation(update(guarded, runId, `wait_kind = 'timer'`))).toEqual(violated('runs_wait_kind_only_when_waiting'));
    expect((await getRun(runId))).toMatchObject({ status: 'PENDING', wait_kind: null });
  });

  it('runs_budget_check: budget below 0 (0 and null are accepted)', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-budget'), columns: { budget: -0.01 } }))).toEqual(violated('runs_budget_check'));
    const runId = await startRun({ budget: 10 });
    expect(await checkViolation(update(guarded, runId, 'budget = -1'))).toEqual(violated('runs_budget_check'));
    await update(guarded, runId, 'budget = 0');
    await update(guarded, runId, 'budget = null');
    expect((await getRun(runId))?.budget).toBeNull();
  });

  it('runs_max_steps_check: max_steps 0 or below (1 and null are accepted)', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-steps'), columns: { max_steps: 0 } }))).toEqual(violated('runs_max_steps_check'));
    const runId = await startRun();
    expect(await checkViolation(update(guarded, runId, 'max_steps = -5'))).toEqual(violated('runs_max_steps_check'));
    await update(guarded, runId, 'max_steps = 1');
    expect((await getRun(runId))?.max_steps).toBe(1);
  });

  it('runs_no_progress_check: no_progress below 2 (2 and null are accepted)', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-np'), columns: { no_progress: 1 } }))).toEqual(violated('runs_no_progress_check'));
    const runId = await startRun();
    expect(await checkViolation(update(guarded, runId, 'no_progress = 0'))).toEqual(violated('runs_no_progress_check'));
    await update(guarded, runId, 'no_progress = 2');
    expect((await getRun(runId))?.no_progress).toBe(2);
  });

  it('runs_retry_budget_check: retry_budget below 0 (0 and null are accepted)', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-rb'), columns: { retry_budget: -1 } }))).toEqual(violated('runs_retry_budget_check'));
    const runId = await startRun();
    expect(await checkViolation(update(guarded, runId, 'retry_budget = -3'))).toEqual(violated('runs_retry_budget_check'));
    await update(guarded, runId, 'retry_budget = 0');
    expect((await getRun(runId))?.retry_budget).toBe(0);
  });

  it('runs_max_recovery_attempts_check: max_recovery_attempts below 0 (0 is accepted)', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    expect(await checkViolation(insertRun(guarded, { runId: newRunId('i-mra'), columns: { max_recovery_attempts: -1 } }))).toEqual(
      violated('runs_max_recovery_attempts_check'),
    );
    const runId = await startRun();
    expect(await checkViolation(update(guarded, runId, 'max_recovery_attempts = -1'))).toEqual(violated('runs_max_recovery_attempts_check'));
    await update(guarded, runId, 'max_recovery_attempts = 0');
    expect((await getRun(runId))?.max_recovery_attempts).toBe(0);
  });

  it('reports the table and schema of the rule with it', async ({ guarded }) => {
    try {
      await insertRun(guarded, { runId: newRunId('i-table'), columns: { budget: -1 } });
      expect.unreachable('the insert should fail');
    } catch (error) {
      expect(error).toMatchObject({ code: '23514', constraint: 'runs_budget_check', table: 'runs', schema: 'runledger' });
      expect((error as Error).message).toMatch(/violates check constraint "runs_budget_check"/);
    }
  });
});

describe('steps invariants: runledger._check_step', () => {
  const insertStep = (on: Guarded, runId: string, columns: Record<string, unknown>) => {
    const all = { run_id: runId, seq: 0, name: 's', kind: 'step', status: 'SUCCEEDED', started_at: new Date(), fencing_token: 1, ...columns };
    const names = Object.keys(all);
    return on.query(
      `insert into runledger.steps (${names.join(', ')}) values (${names.map((_, i) => `$${i + 1}`).join(', ')})`,
      Object.values(all),
    );
  };
  const violated = (constraint: string) => ({ code: '23514', constraint });

  it('steps_seq_check: seq below 0', async ({ db, guarded }) => {
    const { startRun, steps } = helpers(db);
    const runId = await startRun();
    expect(await checkViolation(insertStep(guarded, runId, { seq: -1 }))).toEqual(violated('steps_seq_check'));
    await insertStep(guarded, runId, { seq: 0 });
    expect(await checkViolation(guarded.query('update runledger.steps set seq = -2 where run_id = $1', [runId]))).toEqual(violated('steps_seq_check'));
    expect((await steps(runId)).map((s) => s.seq)).toEqual([0]);
  });

  it('steps_kind_check: a kind outside the list (every listed kind is accepted)', async ({ db, guarded }) => {
    const { startRun, steps } = helpers(db);
    const runId = await startRun();
    expect(await checkViolation(insertStep(guarded, runId, { kind: 'bogus' }))).toEqual(violated('steps_kind_check'));
    const kinds = ['step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child'];
    for (const [i, kind] of kinds.entries()) await insertStep(guarded, runId, { seq: i, kind });
    expect(await checkViolation(guarded.query(`update runledger.steps set kind = 'job' where run_id = $1 and seq = 0`, [runId]))).toEqual(
      violated('steps_kind_check'),
    );
    expect((await steps(runId)).length).toBe(kinds.length);
  });

  it('steps_status_check: a status other than SUCCEEDED, FAILED or WAITING', async ({ db, guarded }) => {
    const { startRun, steps } = helpers(db);
    const runId = await startRun();
    expect(await checkViolation(insertStep(guarded, runId, { status: 'RUNNING' }))).toEqual(violated('steps_status_check'));
    for (const [i, status] of ['SUCCEEDED', 'FAILED', 'WAITING'].entries()) await insertStep(guarded, runId, { seq: i, status });
    expect(await checkViolation(guarded.query(`update runledger.steps set status = 'PENDING' where run_id = $1 and seq = 2`, [runId]))).toEqual(
      violated('steps_status_check'),
    );
    expect((await steps(runId)).map((s) => s.status)).toEqual(['SUCCEEDED', 'FAILED', 'WAITING']);
  });

  it('reports the table and schema of the rule with it', async ({ db, guarded }) => {
    const { startRun } = helpers(db);
    const runId = await startRun();
    try {
      await insertStep(guarded, runId, { kind: 'bogus' });
      expect.unreachable('the insert should fail');
    } catch (error) {
      expect(error).toMatchObject({ code: '23514', constraint: 'steps_kind_check', table: 'steps', schema: 'runledger' });
    }
  });
});

describe('runs.run_id validation (rule runs_run_id_check of the trigger runs_invariants)', () => {
  const invalid = ['', '-leading-dash', '_leading_underscore', 'has space', 'slash/inside', 'é-accent', `a${'b'.repeat(200)}`];

  it('rejects an invalid run_id on insert with 23514 and stores nothing', async ({ db, guarded }) => {
    const { getRun } = helpers(db);
    for (const runId of invalid) {
      expect(await sqlState(insertRun(guarded, { runId })), JSON.stringify(runId)).toBe('23514');
    }
    const stored = await db.pool.query('select count(*)::int as n from runledger.runs where run_id = any($1)', [invalid]);
    expect(stored.rows[0].n).toBe(0);
    // The longest and the odd-but-valid ones are accepted.
    for (const runId of [`invariants-${'b'.repeat(189)}`, newRunId('ok.run:id_with-all'), `9${newRunId('x')}`]) {
      await insertRun(db.pool, { runId });
      expect((await getRun(runId))?.run_id).toBe(runId);
    }
  });

  it('rejects an invalid run_id set by update, and leaves updates of other columns alone', async ({ db, guarded }) => {
    const { getRun } = helpers(db);
    const runId = newRunId('rename-me');
    await insertRun(db.pool, { runId });
    for (const bad of invalid) {
      expect(await sqlState(guarded.query('update runledger.runs set run_id = $2 where run_id = $1', [runId, bad])), JSON.stringify(bad)).toBe('23514');
    }
    expect((await getRun(runId))?.run_id).toBe(runId);
    try {
      await guarded.query('update runledger.runs set run_id = $2 where run_id = $1', [runId, 'bad id']);
      expect.unreachable('the update should fail');
    } catch (error) {
      expect((error as Error).message).toMatch(/run_id 'bad id' is invalid/);
      expect(error).toMatchObject({ code: '23514', constraint: 'runs_run_id_check', table: 'runs', schema: 'runledger' });
    }
    // A valid new id is accepted, and so is any update that does not touch the id.
    const renamed = newRunId('renamed');
    await db.pool.query('update runledger.runs set run_id = $2 where run_id = $1', [runId, renamed]);
    await db.pool.query('update runledger.runs set priority = 7 where run_id = $1', [renamed]);
    expect(await getRun(renamed)).toMatchObject({ run_id: renamed, priority: 7 });
    expect(await getRun(runId)).toBeUndefined();
  });
});

describe('the state machine is enforced (rule runs_transition of the trigger runs_invariants, runledger.run_transitions())', () => {
  const update = (on: Guarded, runId: string, set: string) => on.query(`update runledger.runs set ${set} where run_id = $1`, [runId]);

  it('refuses a status change that run_transitions() does not list, with 23514 runs_transition, and changes nothing', async ({ db, guarded }) => {
    const { startRun, getRun } = helpers(db);
    const pending = await startRun();
    expect(
      await checkViolation(update(guarded, pending, `status = 'SUCCEEDED', finished_at = now(), termination_reason = 'COMPLETED'`)),
    ).toEqual({ code: '23514', constraint: 'runs_transition' });
    const done = await insertRun(db.pool, { runId: newRunId('t-done'), status: 'SUCCEEDED', finishedAt: new Date(), terminationReason: 'COMPLETED' });
    expect(
      await checkViolation(update(guarded, done, `status = 'PENDING', finished_at = null, termination_reason = null`)),
    ).toEqual({ code: '23514', constraint: 'runs_transition' });
    expect((await getRun(pending))?.status).toBe('PENDING');
    expect((await getRun(done))?.status).toBe('SUCCEEDED');
  });

  it('allows exactly the changes run_transitions() lists, for every pair of statuses', async ({ db }) => {
    // Every one of the 81 changes is tried on a runs row, each update also giving the row
    // the shape its new status needs (a lease, a wait, a termination record), so that the
    // row's other rules never refuse a change the state machine allows.
    const client = db.pool;
    const statuses = (await client.query<{ s: string }>(`select unnest(enum_range(null::runledger.run_status))::text as s`)).rows.map((r) => r.s);
    const listed = new Set(
      (await client.query<{ pair: string }>(`select from_status::text || '>' || to_status::text as pair from runledger.run_transitions()`)).rows.map((r) => r.pair),
    );
    const terminal = ['SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'];
    const allowed: string[] = [];
    for (const from of statuses) {
      for (const to of statuses) {
        if (from === to) continue;
        await client.query('savepoint probe');
        const runId = await insertRun(client, { runId: newRunId('t-probe'), status: from });
        const executing = to === 'RUNNING' || to === 'CANCELLING';
        try {
          await client.query(
            `update runledger.runs
                set status = $2, lease_owner = $3, lease_expires_at = $4, wait_kind = $5, finished_at = $6, termination_reason = $7
              where run_id = $1`,
            [
              runId,
              to,
              executing ? 'wk-probe' : null,
              executing ? new Date(Date.now() + 60_000) : null,
              to === 'WAITING' ? 'signal' : null,
              terminal.includes(to) ? new Date() : null,
              terminal.includes(to) ? 'COMPLETED' : null,
            ],
          );
          allowed.push(`${from}>${to}`);
        } catch (err) {
          expect((err as { code?: string; constraint?: string }).code).toBe('23514');
          expect((err as { constraint?: string }).constraint, `${from}>${to}: ${(err as Error).message}`).toBe('runs_transition');
        }
        await client.query('rollback to savepoint probe');
      }
    }
    expect(statuses).toHaveLength(9);
    expect(allowed.sort()).toEqual([...listed].sort());
  });

  it('accepts a listed one, and an update that keeps the status never asks', async ({ db, guarded }) => {
    const { getRun } = helpers(db);
    const running = await insertRun(db.pool, { runId: newRunId('t-run'), status: 'RUNNING' });
    await update(guarded, running, `status = 'SUCCEEDED', finished_at = now(), termination_reason = 'COMPLETED', lease_owner = null, lease_expires_at = null`);
    expect((await getRun(running))?.status).toBe('SUCCEEDED');
    await update(guarded, running, `cancel_reason = 'kept'`);
    expect((await getRun(running))?.cancel_reason).toBe('kept');
  });
});
