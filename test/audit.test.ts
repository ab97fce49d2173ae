import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Workflow } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';
import { queueWorkers } from './helpers/cleanup.js';
import { runCli } from './helpers/cli.js';

/**
 * The audit log: every operator action leaves exactly one row, written in its own
 * transaction, naming the login (session_user), the role it acted as (current_user) and
 * the name the caller gave; a refused action leaves none; the engine's own follow-ups (a
 * cancel cascading to a child, migrate_runs marking runs) are part of the one action.
 */
const t = useTestEngine();
const { db } = t;
const startWorker = queueWorkers(() => t.engine, 'audited');
// An operator role, assumed with SET ROLE by the login the tests connect as.
const ROLE = `rl_audit_operator_${process.pid}`;
let operator: pg.Client;

let waiter: Workflow<any, any>;
let approver: Workflow<any, any>;
let parent: Workflow<any, any>;
let failing: Workflow<any, any>;
beforeAll(async () => {
  await db.pool.query(`create role ${ROLE} nologin`);
  // What an operator's login is given (sql/0014_security.sql): the operator actions and reads.
  await db.pool.query(`grant runledger_operator to ${ROLE}`);
  operator = new pg.Client({ connectionString: db.url });
  await operator.connect();
  await operator.query(`set role ${ROLE}`);

  waiter = t.engine.workflow({ name: 'audit-waiter', queue: 'audited' }, async (ctx) => ctx.waitForSignal('go'));
  approver = t.engine.workflow({ name: 'audit-approver', queue: 'audited' }, async (ctx) =>
    ctx.requestApproval('ship', { action: 'ship it', evidence: { n: 1 } }),
  );
  const child = t.engine.workflow({ name: 'audit-child', queue: 'audited' }, async (ctx) => ctx.waitForSignal('never'));
  parent = t.engine.workflow({ name: 'audit-parent', queue: 'audited' }, async (ctx) => ctx.runChild(child, undefined));
  failing = t.engine.workflow({ name: 'audit-failing', queue: 'audited' }, async (ctx) => {
    await ctx.step('fails', () => {
      throw new Error('boom');
    });
  });
  t.engine.workflow({ name: 'audit-moving', version: '2', queue: 'audited', migrations: { '1': () => undefined } }, async (ctx) =>
    ctx.waitForSignal('go'),
  );
  t.engine.workflow({ name: 'audit-moving', version: '1', queue: 'audited' }, async (ctx) => ctx.waitForSignal('go'));
});
afterAll(async () => {
  await operator?.end();
  await db.pool.query(`drop owned by ${ROLE}`);
  await db.pool.query(`drop role ${ROLE}`);
});

interface AuditRow {
  action: string;
  run_id: string | null;
  target: string | null;
  asserted_by: string | null;
  db_user: string;
  db_role: string;
  arguments: Record<string, unknown>;
  result: unknown;
}
let seen = 0;
/** The audit rows written since the last call. */
async function newRows(): Promise<AuditRow[]> {
  const { rows } = await db.pool.query(
    'select audit_id, action, run_id, target, asserted_by, db_user, db_role, arguments, result from runledger.audit_log where audit_id > $1 order by audit_id',
    [seen],
  );
  if (rows.length > 0) seen = Number(rows[rows.length - 1].audit_id);
  return rows.map(({ audit_id: _id, ...rest }) => rest as AuditRow);
}
const status = async (runId: string) =>
  (await db.pool.query('select status from runledger.runs where run_id = $1', [runId])).rows[0]?.status;
const waiting = (runId: string) => waitFor(`${runId} waits`, async () => ((await status(runId)) === 'WAITING' ? true : undefined));
const as = { db_user: expect.any(String), db_role: ROLE };

describe('the audit log', () => {
  it('records every operator action once, with the login, the role and the name given; a refused action leaves no row', async () => {
    await startWorker();
    const login = (await db.pool.query('select session_user as u')).rows[0].u as string;
    as.db_user = login;
    await newRows();

    const signalled = (await t.engine.start(waiter, undefined)).runId;
    await waiting(signalled);
    await operator.query(`select runledger.send_signal($1, 'go', '{"secret": "payload"}', 'sig-1')`, [signalled]);
    const [signal] = await newRows();
    expect(signal).toEqual({
      ...as,
      action: 'send_signal',
      run_id: signalled,
      target: 'go',
      asserted_by: null,
      arguments: { signal_id: 'sig-1' },
      result: true,
    });
    // The payload is the caller's data: the record does not copy it.
    expect(JSON.stringify(signal)).not.toContain('payload');

    const approved = (await t.engine.start(approver, undefined)).runId;
    await waiting(approved);
    const request = (await db.pool.query('select request_id from runledger.approvals where run_id = $1', [approved])).rows[0].request_id;
    await operator.query(`select runledger.decide_approval($1, true, 'alice', 'looks right')`, [request]);
    expect(await newRows()).toEqual([
      expect.objectContaining({
        ...as,
        action: 'decide_approval',
        run_id: approved,
        target: request,
        asserted_by: 'alice',
        arguments: { approved: true, note: 'looks right' },
      }),
    ]);
    // The approval itself records who decided as the database knows it, beside the name given.
    const decided = await db.pool.query(
      'select decided_by, decided_db_user, decided_db_role from runledger.approvals where request_id = $1',
      [request],
    );
    expect(decided.rows).toEqual([{ decided_by: 'alice', decided_db_user: login, decided_db_role: ROLE }]);

    // A cancel that cascades to a child run is one action.
    const parentRun = (await t.engine.start(parent, undefined)).runId;
    await waiting(parentRun);
    const childRun = (await db.pool.query('select run_id from runledger.runs where parent_run_id = $1', [parentRun])).rows[0].run_id;
    await waiting(childRun);
    await operator.query(`select runledger.cancel_run($1, 'not needed')`, [parentRun]);
    expect(await newRows()).toEqual([
      expect.objectContaining({ ...as, action: 'cancel_run', run_id: parentRun, arguments: { reason: 'not needed' } }),
    ]);
    expect(await status(childRun)).toBe('CANCELLED');

    const failed = (await t.engine.start(failing, undefined)).runId;
    await waitFor('failed', async () => ((await status(failed)) === 'FAILED' ? true : undefined));
    await operator.query('select runledger.fork_run($1, 0)', [failed]);
    const [fork] = await newRows();
    expect(fork).toMatchObject({ ...as, action: 'fork_run', run_id: failed, arguments: { from_step: 0 } });
    expect(fork!.target).toBe(fork!.result);
    await operator.query('select runledger.compensate_run($1)', [failed]);
    await operator.query('select runledger.retry_run($1)', [failed]);
    expect((await newRows()).map((r) => [r.action, r.run_id])).toEqual([
      ['compensate_run', failed],
      ['retry_run', failed],
    ]);

    // An operation left STARTED (its worker died mid-call), settled by the operator.
    await db.pool.query(
      `insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status) values ('op-audit', $1, 9, 'charge', 'key-audit', 'STARTED')`,
      [signalled],
    );
    await operator.query(`select runledger.resolve_operation('op-audit', 'SUCCEEDED', '{"card": "4242"}', 'bob')`);
    const [resolved] = await newRows();
    expect(resolved).toEqual({
      ...as,
      action: 'resolve_operation',
      run_id: signalled,
      target: 'op-audit',
      asserted_by: 'bob',
      arguments: { status: 'SUCCEEDED', with_result: true },
      result: 'SUCCEEDED',
    });

    // migrate_runs marks runs through migrate_run's body: one action, the ids in its result.
    const old1 = (await db.pool.query(`select runledger.start_run('audit-moving', '{}', '{"version": "1"}') as id`)).rows[0].id;
    const old2 = (await db.pool.query(`select runledger.start_run('audit-moving', '{}', '{"version": "1"}') as id`)).rows[0].id;
    await waiting(old1);
    await waiting(old2);
    await operator.query(`select runledger.migrate_run($1, '2')`, [old1]);
    await operator.query(`select * from runledger.migrate_runs('audit-moving', '1', '2')`);
    const migrations = await newRows();
    expect(migrations.map((r) => [r.action, r.run_id])).toEqual([
      ['migrate_run', old1],
      ['migrate_runs', null],
    ]);
    expect(migrations[1]!.result).toMatchObject({ marked: expect.any(Number), run_ids: expect.arrayContaining([old2]) });

    await operator.query(`select runledger.set_queue('audited-slow', '{"concurrency": 2}')`);
    await db.pool.query(`insert into runledger.sessions (session_id) values ('audit-session')`);
    await operator.query(`select runledger.release_session('audit-session')`);
    await operator.query(`select runledger.delete_session('audit-session')`);
    await operator.query(`select runledger.prune_artifact_blobs()`);
    await operator.query(`select runledger.prune('1000 years')`);
    expect((await newRows()).map((r) => [r.action, r.target, r.db_role])).toEqual([
      ['set_queue', 'audited-slow', ROLE],
      ['release_session', 'audit-session', ROLE],
      ['delete_session', 'audit-session', ROLE],
      ['prune_artifact_blobs', null, ROLE],
      ['prune', null, ROLE],
    ]);

    // Refused: nothing happened, nothing recorded.
    await expect(operator.query(`select runledger.retry_run('no-such-run')`)).rejects.toMatchObject({ code: 'RL002' });
    await expect(operator.query(`select runledger.decide_approval($1, false, 'mallory')`, [request])).resolves.toBeDefined(); // already decided: answered, recorded
    await expect(operator.query(`select runledger.send_signal($1, 'go', null)`, [parentRun])).rejects.toMatchObject({ code: 'RL005' });
    expect((await newRows()).map((r) => [r.action, r.asserted_by, (r.result as { recorded?: boolean }).recorded])).toEqual([
      ['decide_approval', 'mallory', false],
    ]);

    // The CLI reads it.
    const cli = await runCli(db.url, ['audit', '--run', approved]);
    expect(cli.code).toBe(0);
    expect(cli.stdout).toContain('decide_approval');
    expect(cli.stdout).toContain(`alice (${login} as ${ROLE})`);
    const json = await runCli(db.url, ['audit', '--action', 'cancel_run', '--json']);
    expect(JSON.parse(json.stdout)).toEqual([expect.objectContaining({ action: 'cancel_run', run_id: parentRun, db_role: ROLE })]);
  });
});
