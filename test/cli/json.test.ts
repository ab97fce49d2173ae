import { rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ulid } from 'ulid';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Engine } from '../../src/index.js';
import { claimRun } from '../helpers/claim.js';
import { runCli, runCliProcess } from '../helpers/cli.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { register as registerOrders } from '../fixtures/cli-workflows.js';

/**
 * The CLI as a script uses it (issue 17, item 6): `--json` on every read command, output
 * piped (never cut), input from a file or stdin and checked against the module's schema,
 * `approve --run`, the "N of M" line of `runs`, lost workers told from stopped ones, exit
 * codes and `--help`. The command runs in this process (runCliMain) against this file's
 * database, and as a real `runledger` process where the process is the point: a pipe that
 * FORCE_COLOR cannot colour, an exit that a module's open handle cannot hold up.
 */

const t = useTestEngine();
const { db } = t;
const cli = (args: string[], env: Record<string, string> = {}, stdin?: string) => runCli(db.url, args, env, stdin);
const cliProcess = (args: string[], env: Record<string, string> = {}) => runCliProcess(db.url, args, env);
const MODULE = 'test/fixtures/cli-workflows.ts';
const LONG_NAME = 'support-agent-escalation-with-long-name';

function defineFlows(e: Engine) {
  const two = e.workflow({ name: 'cj-two', queue: 'cj' }, async (ctx, input: { n: number }) => {
    const a = await ctx.step('a', async () => input.n);
    const b = await ctx.step('b', async () => a * 2);
    return { a, b };
  });
  const waiter = e.workflow({ name: 'cj-waiter', queue: 'cj' }, async (ctx) => ctx.waitForSignal('reply'));
  const gate = e.workflow({ name: 'cj-gate', queue: 'cj' }, async (ctx) => {
    const decision = await ctx.requestApproval('ok', { action: 'deploy', evidence: { version: '2.0' }, approvers: ['alice'] });
    return { approved: decision?.approved, by: decision?.decidedBy };
  });
  const order = registerOrders(e);
  return { two, waiter, gate, order };
}
let flows: ReturnType<typeof defineFlows>;

beforeAll(async () => {
  flows = defineFlows(t.engine);
  await t.engine.runWorker({ queues: ['cj', 'cli-orders'], concurrency: 8, leaseMs: 2_000, pollIntervalMs: 100 });
});

const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const json = (out: { code: number | null; stdout: string; stderr: string }) => {
  expect(out, out.stderr).toMatchObject({ code: 0 });
  return JSON.parse(out.stdout);
};
/** A run of a workflow no worker serves: it stays PENDING. */
const unserved = async (workflow: string, input: unknown = {}) => {
  await db.pool.query(`select runledger._register_workflow($1, '1', 'cj-nobody', 0)`, [workflow]);
  return (await db.pool.query(`select runledger.start_run($1, $2::jsonb) as id`, [workflow, JSON.stringify(input)])).rows[0].id as string;
};

describe('--json on every read command', () => {
  it('runs, show, waiting, approvals, queues, workers, versions: one JSON document with the rows psql shows', async () => {
    const done = await t.engine.start(flows.two, { n: 3 });
    await done.result();
    const waiter = await t.engine.start(flows.waiter, undefined);
    const gate = await t.engine.start(flows.gate, undefined);
    await waitFor('both waiting', async () => {
      const r = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'WAITING'`, [
        [waiter.runId, gate.runId],
      ]);
      return r.rows[0].n === 2;
    });
    await cli(['set-queue', 'cj-paused', '--pause', '--concurrency', '3']);
    await t.engine.start(flows.two, { n: 1 }, { queue: 'cj-paused' });

    const [runs, show, waiting, approvals, queues, workers, versions, doctor, audit] = await Promise.all([
      cli(['runs', '--json', '--workflow', 'cj-two']),
      cli(['show', done.runId, '--json']),
      cli(['waiting', '--json']),
      cli(['approvals', '--json']),
      cli(['queues', '--json']),
      cli(['workers', '--json']),
      cli(['versions', '--json', '--workflow', 'cj-two']),
      cli(['doctor', '--json']),
      cli(['audit', '--json']),
    ]);
    const listed = json(runs) as Array<Record<string, unknown>>;
    expect(listed.find((r) => r.run_id === done.runId)).toMatchObject({
      run_id: done.runId,
      workflow_name: 'cj-two',
      workflow_version: '1',
      status: 'SUCCEEDED',
      termination_reason: 'COMPLETED',
      created_at: expect.stringMatching(/^\d{4}-\d{2}-\d{2}T/),
    });
    const shown = json(show);
    expect(shown).toMatchObject({ run_id: done.runId, status: 'SUCCEEDED', input: { n: 3 }, output: { a: 3, b: 6 }, wait: null });
    expect(shown.steps.map((s: { seq: number; name: string; status: string }) => [s.seq, s.name, s.status])).toEqual([
      [0, 'a', 'SUCCEEDED'],
      [1, 'b', 'SUCCEEDED'],
    ]);
    expect(shown.events.map((e: { kind: string }) => e.kind)).toContain('completed');
    expect(json(waiting)).toEqual(
      expect.arrayContaining([
        expect.objectContaining({ run_id: waiter.runId, workflow_name: 'cj-waiter', wait_kind: 'signal', waiting_for: 'signal reply' }),
        expect.objectContaining({ run_id: gate.runId, wait_kind: 'approval' }),
      ]),
    );
    expect(json(approvals)).toEqual([
      expect.objectContaining({ run_id: gate.runId, action: 'deploy', evidence: { version: '2.0' }, approvers: ['alice'] }),
    ]);
    expect(json(queues)).toEqual(
      expect.arrayContaining([expect.objectContaining({ queue_name: 'cj-paused', waiting_admission: 1, paused: true, concurrency: 3 })]),
    );
    expect(json(workers)).toEqual([
      expect.objectContaining({ state: 'live', workflows: expect.arrayContaining(['cj-two@1']), queues: ['cj', 'cli-orders'] }),
    ]);
    expect(json(versions)).toEqual([expect.objectContaining({ workflow_name: 'cj-two', workflow_version: '1', runs: 2, live_workers: 1 })]);
    // doctor exits 1 when a check warns; its JSON document is printed either way.
    expect(JSON.parse(doctor.stdout)).toEqual(
      expect.arrayContaining([expect.objectContaining({ check: 'workers', ok: true, detail: '1 live' })]),
    );
    expect(json(audit)).toEqual(expect.arrayContaining([expect.objectContaining({ action: 'set_queue', target: 'cj-paused' })]));

    await Promise.all([t.engine.cancel(waiter.runId), t.engine.cancel(gate.runId)]);
  });

  it('dead-letter and unknown', async () => {
    const dead = await unserved('cj-orphan');
    await claimRun(db, dead, { worker: 'dead-worker', leaseMs: 1 });
    await waitFor('dead-lettered', async () => {
      await db.pool.query('select runledger._recover_expired()');
      return (await runRow(dead)).status === 'DEAD_LETTER';
    });
    const pending = await unserved('cj-ticket');
    const operationId = `op-${ulid()}`;
    await db.pool.query(
      `insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status)
       values ($1, $2, 0, 'create-ticket', $1, 'UNKNOWN')`,
      [operationId, pending],
    );
    const [deadLetter, unknown, none] = await Promise.all([
      cli(['dead-letter', '--json']),
      cli(['unknown', '--json']),
      cli(['waiting', '--json', '--kind', 'child']),
    ]);
    expect(json(deadLetter)).toEqual([
      expect.objectContaining({ run_id: dead, workflow_name: 'cj-orphan', termination_reason: 'MAX_RECOVERY_ATTEMPTS' }),
    ]);
    expect(json(unknown)).toEqual([
      expect.objectContaining({ operation_id: operationId, run_id: pending, name: 'create-ticket', idempotency_key: operationId }),
    ]);
    expect(json(none)).toEqual([]); // nothing to list is an empty array, not a sentence
  });
});

describe('runs', () => {
  it('piped, a long workflow name is never cut, whatever COLUMNS says, and nothing is coloured', async () => {
    const runId = await unserved(LONG_NAME);
    const listed = await cliProcess(['runs', '--workflow', LONG_NAME], { COLUMNS: '80', FORCE_COLOR: '1' });
    expect(listed.code).toBe(0);
    expect(listed.stdout).toMatch(new RegExp(`${runId}\\s+${LONG_NAME}@1\\s+PENDING\\s+-\\s+\\S+ ago\\n`));
    expect(listed.stdout).not.toContain('…');
    expect(listed.stdout).not.toContain('\x1b[');
    expect(Math.max(...listed.stdout.split('\n').map((l) => l.length))).toBeGreaterThan(80);
  });

  it('says how many runs match beyond the page: "showing 20 of 23 runs"', async () => {
    for (let i = 0; i < 23; i++) await unserved('cj-many', { i });
    const [page, all, asJson] = await Promise.all([
      cli(['runs', '--workflow', 'cj-many']),
      cli(['runs', '--workflow', 'cj-many', '--limit', '23']),
      cli(['runs', '--workflow', 'cj-many', '--json', '--limit', '5']),
    ]);
    expect(page.code).toBe(0);
    expect(page.stdout.trim().split('\n')).toHaveLength(1 + 20 + 1);
    expect(page.stdout).toMatch(/\nshowing 20 of 23 runs; --limit N for more\n$/);
    expect(all.stdout).not.toContain('showing');
    expect(all.stdout.trim().split('\n')).toHaveLength(1 + 23);
    expect(json(asJson)).toHaveLength(5);
    expect(asJson.stderr).toBe('showing 5 of 23 runs; --limit N for more\n');
  });
});

describe('start', () => {
  it('--module refuses input that fails the workflow schema (INVALID_INPUT, exit 1) and starts nothing', async () => {
    const [bad, missing, unknownWorkflow] = await Promise.all([
      cli(['start', 'cli-order', '{"item":"book","amount":-1}', '--module', MODULE]),
      cli(['start', 'cli-order', '--module', MODULE]),
      cli(['start', 'cli-nothing', '{}', '--module', MODULE]),
    ]);
    expect(bad).toMatchObject({ code: 1, stdout: '' });
    expect(bad.stderr).toMatch(/^error \[INVALID_INPUT\]: start: input of cli-order@1 is invalid: amount: .*\n$/);
    expect(missing.code).toBe(1);
    expect(missing.stderr).toMatch(/^error \[INVALID_INPUT\]: start: input of cli-order@1 is invalid: \(the input\): /);
    expect(unknownWorkflow.code).toBe(1);
    expect(unknownWorkflow.stderr).toContain('error [MODULE]: test/fixtures/cli-workflows.ts does not define workflow cli-nothing');
    const started = await db.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'cli-order'`);
    expect(started.rows[0].n).toBe(0);
  });

  it('reads the input from @FILE (larger than a command line may be) or from stdin with -, checked by --module', async () => {
    const file = join(tmpdir(), `runledger-cli-${ulid()}.json`);
    const big = 'x'.repeat(300_000); // one argument over 128 KiB fails with E2BIG ("Argument list too long")
    await writeFile(file, JSON.stringify({ item: big, amount: 2 }));
    const [fromFile, fromStdin, noFile, badStdin] = await Promise.all([
      cli(['start', 'cli-order', `@${file}`, '--module', MODULE]),
      cli(['start', 'cli-order', '-', '--module', MODULE], {}, '{"item":"pen","amount":1}\n'),
      cli(['start', 'cli-order', '@/nonexistent/input.json']),
      cli(['start', 'cli-order', '-'], {}, '{"item":'),
    ]);
    expect(fromFile.code, fromFile.stderr).toBe(0);
    expect(fromStdin.code, fromStdin.stderr).toBe(0);
    const fileRun = fromFile.stdout.trim();
    const stdinRun = fromStdin.stdout.trim();
    // Stored as the schema's output (the default filled in), as engine.start stores it; then run by the worker.
    expect((await runRow(fileRun)).input).toEqual({ item: big, amount: 2, note: 'none' });
    expect((await runRow(stdinRun)).input).toEqual({ item: 'pen', amount: 1, note: 'none' });
    await expect(t.engine.handle(flows.order, stdinRun).result()).resolves.toEqual({ item: 'pen', amount: 1, note: 'none' });
    expect(noFile.code).toBe(2);
    expect(noFile.stderr).toMatch(/^error \[USAGE\]: cannot read JSON_INPUT from \/nonexistent\/input.json: ENOENT/);
    expect(badStdin.code).toBe(2);
    expect(badStdin.stderr).toMatch(/^error \[USAGE\]: JSON_INPUT \(from stdin\) is not valid JSON/);
  });
});

describe('approve', () => {
  it("--run decides the run's one pending request; a run id given as the request id points to it; several are refused", async () => {
    const gate = await t.engine.start(flows.gate, undefined);
    const other = await t.engine.start(flows.gate, undefined);
    await waitFor('both wait for approval', async () => {
      const r = await db.pool.query(`select count(*)::int as n from runledger.approval_inbox where run_id = any($1)`, [
        [gate.runId, other.runId],
      ]);
      return r.rows[0].n === 2;
    });
    const requestOf = async (runId: string) =>
      (await db.pool.query('select request_id from runledger.approvals where run_id = $1', [runId])).rows[0].request_id as string;
    const requestId = await requestOf(other.runId);
    // A second pending request on `other` (as parallel approvals leave it): --run cannot pick one.
    const extra = `req-${ulid()}`;
    await db.pool.query(
      `insert into runledger.approvals (request_id, run_id, seq, name, action) values ($1, $2, 99, 'extra', 'rollback')`,
      [extra, other.runId],
    );

    const [byRunId, ambiguous, neither, noPending] = await Promise.all([
      cli(['approve', gate.runId, '--by', 'alice']),
      cli(['approve', '--run', other.runId, '--by', 'alice']),
      cli(['approve', '--by', 'alice']),
      cli(['approve', '--run', (await unserved('cj-plain')) as string, '--by', 'alice']),
    ]);
    const gateRequest = await requestOf(gate.runId);
    expect(byRunId).toMatchObject({ code: 1, stdout: '' });
    expect(byRunId.stderr).toMatch(/^error \[NOT_FOUND\]: decide_approval: .*not found/);
    expect(byRunId.stderr).toContain(
      `${gate.runId} is a run id, not an approval request id; its pending request is ${gateRequest} (deploy, step ok)`,
    );
    expect(byRunId.stderr).toContain(`runledger approve --run ${gate.runId} --by NAME`);
    expect(ambiguous.code).toBe(1);
    expect(ambiguous.stderr).toMatch(new RegExp(`^error \\[AMBIGUOUS\\]: run ${other.runId} has 2 pending approval requests: `));
    expect(ambiguous.stderr).toContain(`${requestId} (deploy, step ok)`);
    expect(ambiguous.stderr).toContain(`${extra} (rollback, step extra)`);
    expect(neither).toMatchObject({ code: 2 });
    expect(neither.stderr).toMatch(/^error \[USAGE\]: give a REQUEST_ID or --run RUN_ID, not neither/);
    expect(noPending.code).toBe(1);
    expect(noPending.stderr).toMatch(/^error \[NOT_FOUND\]: run \S+ \(PENDING\) has no pending approval request\n$/);
    // Nothing was decided by the refused commands.
    const decided = await db.pool.query(
      'select count(*)::int as n from runledger.approvals where decision is not null and run_id = any($1)',
      [[gate.runId, other.runId]],
    );
    expect(decided.rows[0].n).toBe(0);

    const approved = await cli(['approve', '--run', gate.runId, '--by', 'alice', '--note', 'ok']);
    expect(approved.code, approved.stderr).toBe(0);
    expect(approved.stdout).toMatch(new RegExp(`^request ${gateRequest} approved by alice at `));
    await expect(gate.result()).resolves.toEqual({ approved: true, by: 'alice' });
    await db.pool.query('delete from runledger.approvals where request_id = $1', [extra]);
    await t.engine.cancel(other.runId);
  });
});

describe('workers', () => {
  it('tells a lost worker (silent past its lease, never stopped) from one that stopped gracefully', async () => {
    const stopping = await t.engine.runWorker({ queues: ['cj-other'], concurrency: 1, leaseMs: 2_000, pollIntervalMs: 100 });
    const stoppedId = stopping.workerId;
    await stopping.stop();
    const killed = `killed-${ulid()}`;
    const swept = `swept-${ulid()}`;
    // Killed: its last heartbeat is a minute old, a 2 s lease, no stopped_at. Swept: the same, after _recover_expired marked it.
    await db.pool.query(
      `insert into runledger.workers (worker_id, host, pid, workflows, queues, concurrency, lease_ms, last_heartbeat_at, stopped_at)
       values ($1, 'h', 1, '{cj-two@1}', '{cj}', 1, 2000, runledger.now() - interval '1 minute', null),
              ($2, 'h', 2, '{cj-two@1}', '{cj}', 1, 2000, runledger.now() - interval '1 minute', runledger.now() - interval '50 seconds')`,
      [killed, swept],
    );
    const [table, all, asJson] = await Promise.all([cli(['workers']), cli(['workers', '--all']), cli(['workers', '--all', '--json'])]);
    expect(table.code).toBe(0);
    expect(table.stdout).toMatch(new RegExp(`${killed}\\s+lost\\s+1m ago`));
    expect(table.stdout).toMatch(new RegExp(`${swept}\\s+lost\\s+1m ago`));
    expect(table.stdout).toMatch(/\s+live\s+/);
    expect(table.stdout).not.toContain(stoppedId);
    expect(table.stdout).toContain('2 lost: silent past their lease without stopping');
    expect(all.stdout).toMatch(new RegExp(`${stoppedId}\\s+stopped\\s+`));
    const states = Object.fromEntries((json(asJson) as Array<{ worker_id: string; state: string }>).map((w) => [w.worker_id, w.state]));
    expect(states).toMatchObject({ [killed]: 'lost', [swept]: 'lost', [stoppedId]: 'stopped' });
    expect(Object.values(states).filter((s) => s === 'live')).toHaveLength(1);
    await db.pool.query('delete from runledger.workers where worker_id = any($1)', [[killed, swept]]);
  });
});

describe('exit codes and help', () => {
  const login = `cli_reader_${process.pid}_${ulid().slice(-6).toLowerCase()}`;
  afterAll(async () => {
    await db.pool.query(`drop role if exists ${login}`);
  });

  it('a usage error exits 2; a refusal exits 1 with its code, PERMISSION_DENIED for a role that may not', async () => {
    await db.pool.query(`create role ${login} login password 'x' in role runledger_reader`);
    const url = new URL(db.url);
    url.username = login;
    url.password = 'x';
    const [badLimit, badOption, extraArg, denied, notFound] = await Promise.all([
      cli(['runs', '--limit', 'many']),
      cli(['workers', '--colour']),
      cli(['show']),
      cli(['start', 'cj-two', '{"n":1}'], { DATABASE_URL: url.toString() }),
      cli(['show', `no-such-run-${ulid()}`, '--json']),
    ]);
    expect(badLimit).toMatchObject({ code: 2, stdout: '', stderr: 'error [USAGE]: --limit must be a whole number >= 1, got "many"\n' });
    expect(badOption.code).toBe(2);
    expect(badOption.stderr).toMatch(/^error \[USAGE\]: Unknown option '--colour'\nusage: runledger workers/);
    expect(extraArg).toMatchObject({ code: 2 });
    expect(denied).toMatchObject({ code: 1, stdout: '' });
    expect(denied.stderr).toMatch(/^error \[PERMISSION_DENIED\]: permission denied for function start_run\n$/);
    expect(notFound).toMatchObject({ code: 1, stdout: '' });
    expect(notFound.stderr).toMatch(/^error \[NOT_FOUND\]: run no-such-run-\S+ not found\n$/);
  });

  it('a bad RUNLEDGER_LOG_FORMAT is refused by a read command too (CONFIG, exit 2), before anything is read', async () => {
    const out = await cli(['runs', '--json'], { RUNLEDGER_LOG_FORMAT: 'xml' });
    expect(out).toMatchObject({ code: 2, stdout: '', stderr: 'error [CONFIG]: RUNLEDGER_LOG_FORMAT must be text or json, not "xml"\n' });
  });

  it('a refused command exits with its code even when the module it loaded keeps the event loop alive', async () => {
    // A module that opens a handle at import (a timer here; a pool or a server in real code) and defines nothing.
    const file = join(tmpdir(), `runledger-busy-module-${process.pid}-${ulid()}.mjs`);
    await writeFile(file, 'setInterval(() => {}, 1000);\nexport const nothing = 1;\n');
    // Before, the process printed its error and then never exited: this test timed out.
    const out = await cliProcess(['worker', '--module', file]).finally(() => rm(file, { force: true }));
    expect(out.code).toBe(1);
    expect(out.stderr).toContain('error [MODULE]:');
    expect(out.stderr).toContain('must export register(engine)');
  }, 15_000);

  it('--help describes every option and shows examples', async () => {
    const [start, workers, approve, viaHelp] = await Promise.all([
      cli(['start', '--help']),
      cli(['workers', '--help']),
      cli(['approve', '-h']),
      cli(['help', 'runs']),
    ]);
    expect(start).toMatchObject({ code: 0, stderr: '' });
    expect(start.stdout).toMatch(/^usage: runledger start WORKFLOW \[JSON_INPUT\|@FILE\|-\]/);
    expect(start.stdout).toMatch(/\n {2}-m, --module FILE +check the input against the workflow's schema/);
    expect(start.stdout).toMatch(/\n {2}--idempotency-key K +starting again with the same key returns the same run\n/);
    expect(start.stdout).toMatch(/\n {2}JSON_INPUT +the input as JSON .*- reads it from stdin\n/);
    expect(start.stdout).toMatch(/\nexamples:\n {2}runledger start order /);
    expect(workers.stdout).toMatch(/\n {2}--all +include the workers that stopped gracefully\n/);
    expect(workers.stdout).toMatch(/\n {2}--json +print one JSON document on stdout/);
    expect(approve.stdout).toMatch(/\n {2}--run RUN_ID +decide this run's pending request/);
    expect(viaHelp.stdout).toMatch(/^usage: runledger runs /);
    expect(viaHelp.stdout).toContain('--limit N');
  });
});
