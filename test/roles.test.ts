import { sql } from 'kysely';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEngine, type Engine } from '../src/index.js';
import { createTestClock, createTestEngine } from '../src/testing/index.js';
import { waitFor } from './helpers/database.js';
import { sqlState } from './helpers/sql-errors.js';
import { useTestEngine } from './helpers/test-engine.js';

/**
 * The three database roles (sql/0014_security.sql): each may do exactly its list and is
 * refused the rest with 42501; no role writes a table; the listed functions are SECURITY
 * DEFINER with a search_path a caller's schema cannot hijack, except the pure ones, which
 * run as their caller and are inlined (sql/0001_schema.sql, sql/0014_security.sql); and a worker and an
 * operator that log in with nothing but their role run a workflow end to end.
 */
const t = useTestEngine({ engine: false });
const { db } = t;

// The lists this test holds the schema to, written out here rather than read from
// runledger.role_functions, so a function added to or dropped from a role shows up here.
const READS = [
  'now',
  'is_terminal',
  'run_transitions',
  'termination_reasons',
  'step_kinds',
  'wait_kinds',
  '_compensations_due',
  '_tenant_unbound',
  '_session_tenant',
  '_test_clock_now',
];
// The pure functions among them: no table read, nothing changed; they run as their caller
// with no settings, so that the planner inlines them.
const PURE = ['now', 'is_terminal', 'run_transitions', 'termination_reasons', 'step_kinds', 'wait_kinds'];
const EXPECTED: Record<string, string[]> = {
  runledger_reader: READS,
  runledger_operator: [
    ...READS,
    'read_stream',
    'session_history',
    'send_signal',
    'decide_approval',
    'cancel_run',
    'compensate_run',
    'retry_run',
    'resolve_operation',
    'fork_run',
    'migrate_run',
    'migrate_runs',
    'set_queue',
    'prune',
    'release_session',
    'delete_session',
    'prune_artifact_blobs',
    'prune_due',
    'set_retention',
    'clear_retention',
    'set_rate_limit',
    'pause_rate_limit',
    'resume_rate_limit',
    'delete_rate_limit',
    'set_session_budget',
  ],
  runledger_worker: [
    ...READS,
    'read_stream',
    'session_history',
    'start_run',
    'start_runs',
    '_start_claimed',
    '_start_many',
    '_start_child',
    '_register_workflow',
    '_register_worker',
    '_heartbeat',
    '_stop_worker',
    '_recover_expired',
    '_enforce_deadlines',
    '_wake_due',
    '_admit_all',
    '_claim_batch',
    '_trace_execution',
    '_commit_batch',
    '_commit_and_claim',
    '_checkpoint',
    '_checkpoint_outcome',
    '_charge_now',
    '_complete_run',
    '_complete_with_checkpoint',
    '_fail_run',
    '_release_run',
    '_terminate_run',
    '_dead_letter_run',
    '_finish_cancel',
    '_wait',
    '_retry_wait',
    '_record_retry',
    '_heartbeat_step',
    '_operation_begin',
    '_operation_checkpoint',
    '_operation_park',
    '_compensation_begin',
    '_compensation_finish',
    '_stream_write',
    '_stream_poll',
    '_session_acquire',
    '_session_append',
    '_session_release',
    '_session_leave',
    '_record_artifact',
    '_artifact_blob_held',
    '_take_migration',
    '_apply_migration',
    '_migration_failed',
    'prune_due',
    '_maintenance_begin',
    '_maintenance_end',
    '_graph_put',
    '_graph_put_writes',
    '_graph_delete_thread',
    '_rate_limit_acquire',
    '_rate_limit_pause',
    '_rate_limit_wait',
    '_environment_record',
    '_environments_due',
    '_environment_renew',
    '_environment_reclaimed',
    '_session_budget_hold',
  ],
};
const ROLES = Object.keys(EXPECTED);

interface Fn {
  signature: string;
  name: string;
  args: string[];
}
let functions: Fn[];
let tables: string[];
let views: string[];

// Logins standing for the people and processes of a deployment, each given one role.
const suffix = process.pid;
const WORKER_LOGIN = `rl_app_${suffix}`;
const OPERATOR_LOGIN = `rl_ops_${suffix}`;
const READER_LOGIN = `rl_dash_${suffix}`;
const PASSWORD = 'roles-test';
const urlAs = (login: string) => {
  const url = new URL(db.url);
  url.username = login;
  url.password = PASSWORD;
  return url.toString();
};
const engines: Engine[] = [];

beforeAll(async () => {
  for (const [login, role] of [
    [WORKER_LOGIN, 'runledger_worker'],
    [OPERATOR_LOGIN, 'runledger_operator'],
    [READER_LOGIN, 'runledger_reader'],
  ]) {
    await db.pool.query(`drop role if exists ${login}`);
    await db.pool.query(`create role ${login} login password '${PASSWORD}' in role ${role}`);
    // A search_path test below creates a schema as the operator.
    await db.pool.query(`grant create on database ${db.name} to ${login}`);
  }
  // The business table a worker's transaction step writes: the user grants it, not runledger.
  await db.pool.query(`create table public.shipments (order_id text primary key, shipped_at timestamptz not null default now())`);
  await db.pool.query(`grant select, insert on public.shipments to ${WORKER_LOGIN}`);

  const fns = await db.pool.query<{ signature: string; name: string; args: string[] }>(
    `select p.oid::regprocedure::text as signature, p.proname as name,
            coalesce((select array_agg(format_type(t, null) order by i) from unnest(p.proargtypes) with ordinality a(t, i)), '{}') as args
       from pg_proc p where p.pronamespace = 'runledger'::regnamespace and p.prokind = 'f'`,
  );
  functions = fns.rows;
  const rels = await db.pool.query<{ name: string; kind: string }>(
    `select c.oid::regclass::text as name, c.relkind as kind from pg_class c
      where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v')`,
  );
  tables = rels.rows.filter((r) => r.kind === 'r').map((r) => r.name);
  views = rels.rows.filter((r) => r.kind === 'v').map((r) => r.name);
});
afterAll(async () => {
  await Promise.all(engines.map((e) => e.close()));
  for (const login of [WORKER_LOGIN, OPERATOR_LOGIN, READER_LOGIN]) {
    await db.pool.query(`drop owned by ${login}`);
    await db.pool.query(`drop role if exists ${login}`);
  }
});

/** A connection logged in as `login`, for one callback. */
async function as<T>(login: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: urlAs(login) });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}
const loginOf: Record<string, string> = {
  runledger_worker: WORKER_LOGIN,
  runledger_operator: OPERATOR_LOGIN,
  runledger_reader: READER_LOGIN,
};

describe('what each role may execute', () => {
  it.each(ROLES)('%s may execute exactly its list of functions', async (role) => {
    const { rows } = await db.pool.query<{ name: string }>(
      `select distinct p.proname as name from pg_proc p
        where p.pronamespace = 'runledger'::regnamespace and has_function_privilege($1, p.oid, 'execute')`,
      [role],
    );
    expect(rows.map((r) => r.name).sort()).toEqual([...EXPECTED[role]!].sort());
  });

  it('PUBLIC may execute no runledger function', async () => {
    const { rows } = await db.pool.query(
      `select p.oid::regprocedure::text as fn from pg_proc p
        where p.pronamespace = 'runledger'::regnamespace
          and (p.proacl is null or exists (select from aclexplode(p.proacl) a where a.grantee = 0))`,
    );
    expect(rows).toEqual([]);
  });

  it('every function a role may execute runs as the owner with search_path pg_catalog, runledger, pg_temp, except the pure ones', async () => {
    const { rows } = await db.pool.query<{ fn: string; definer: boolean; config: string[] | null }>(
      `select p.oid::regprocedure::text as fn, p.prosecdef as definer, p.proconfig as config from pg_proc p
        where p.pronamespace = 'runledger'::regnamespace and p.proname = any($1) and not (p.proname = any($2))`,
      [[...new Set(Object.values(EXPECTED).flat())], PURE],
    );
    expect(rows.length).toBeGreaterThan(60);
    for (const row of rows) {
      expect({ fn: row.fn, definer: row.definer }).toEqual({ fn: row.fn, definer: true });
      expect(row.config).toContain('search_path=pg_catalog, runledger, pg_temp');
    }
  });

  it('the pure functions run as their caller with no settings, and the planner inlines them', async () => {
    const { rows } = await db.pool.query<{ name: string; definer: boolean; config: string[] | null }>(
      `select p.proname as name, p.prosecdef as definer, p.proconfig as config from pg_proc p
        where p.pronamespace = 'runledger'::regnamespace and p.proname = any($1) order by 1`,
      [PURE],
    );
    expect(rows).toEqual([...PURE].sort().map((name) => ({ name, definer: false, config: null })));
    expect((await db.pool.query(`select runledger._pure_functions() as names`)).rows[0].names.sort()).toEqual([...PURE].sort());
    // Inlined: the plan holds now()'s expression, and run_transitions() is a scan of its
    // VALUES list, not a call (a SECURITY DEFINER or SET function would show as one).
    const plan = async (query: string) =>
      (await db.pool.query<{ 'QUERY PLAN': string }>(`explain verbose ${query}`)).rows.map((r) => r['QUERY PLAN']).join('\n');
    const now = await plan(`select runledger.now()`);
    expect(now).toContain('clock_timestamp()');
    expect(now).not.toMatch(/runledger\.now\(\)/);
    const transitions = await plan(`select * from runledger.run_transitions()`);
    expect(transitions).toContain('Values Scan');
    expect(transitions).not.toContain('Function Scan');
  });

  // Calls every function not on a role's list, as a login holding only that role: the
  // permission check comes before the body runs, so null arguments are enough.
  it.each(ROLES)('%s is refused every other function with 42501', async (role) => {
    const refused = functions.filter((f) => !EXPECTED[role]!.includes(f.name));
    expect(refused.length).toBeGreaterThan(20);
    await as(loginOf[role]!, async (client) => {
      for (const fn of refused) {
        const call = `select runledger.${fn.name}(${fn.args.map((a) => `null::${a}`).join(', ')})`;
        const state = await sqlState(client.query(call)).catch(() => 'succeeded');
        expect({ fn: fn.signature, state }).toEqual({ fn: fn.signature, state: '42501' });
      }
    });
  });
});

describe('what each role may read and write', () => {
  it.each(ROLES)('%s writes no table directly', async (role) => {
    await as(loginOf[role]!, async (client) => {
      for (const table of tables) {
        expect({ table, state: await sqlState(client.query(`delete from ${table}`)) }).toEqual({ table, state: '42501' });
        expect({ table, state: await sqlState(client.query(`insert into ${table} default values`)) }).toEqual({
          table,
          state: '42501',
        });
      }
      expect(await sqlState(client.query(`update runledger.runs set status = 'SUCCEEDED'`))).toBe('42501');
      expect(await sqlState(client.query(`truncate runledger.events`))).toBe('42501');
    });
  });

  it('the reader reads every view and no table', async () => {
    await as(READER_LOGIN, async (client) => {
      for (const view of views) await client.query(`select * from ${view} limit 1`);
      for (const table of tables) {
        expect({ table, state: await sqlState(client.query(`select * from ${table} limit 1`)) }).toEqual({
          table,
          state: '42501',
        });
      }
    });
  });

  it.each(['runledger_worker', 'runledger_operator'])('%s reads every table and view', async (role) => {
    await as(loginOf[role]!, async (client) => {
      for (const rel of [...tables, ...views]) await client.query(`select * from ${rel} limit 1`);
    });
  });
});

describe('a deployment whose logins hold only their role', () => {
  it('a worker login runs a workflow with a transaction step and a wait; an operator login signals it; the reader sees it', async () => {
    const app = createEngine({ connectionString: urlAs(WORKER_LOGIN), log: () => {} });
    engines.push(app);
    const shipping = app.workflow({ name: 'roles-ship', queue: 'roles' }, async (ctx, order: { id: string }) => {
      const quote = await ctx.step('quote', () => ({ total: 42 }));
      await ctx.transaction('record', async (trx) => {
        await sql`insert into public.shipments (order_id) values (${order.id})`.execute(trx);
      });
      const go = await ctx.waitForSignal<{ ok: boolean }>('go');
      return { ...quote, ok: go?.ok === true };
    });
    await app.runWorker({ queues: ['roles'], concurrency: 2 });
    const handle = await app.start(shipping, { id: 'o-1' });
    await waitFor(
      'the run waits for its signal',
      async () => (await db.pool.query(`select 1 from runledger.runs where run_id = $1 and status = 'WAITING'`, [handle.runId])).rows[0],
    );

    const ops = createEngine({ connectionString: urlAs(OPERATOR_LOGIN), log: () => {} });
    engines.push(ops);
    // The operator may signal but not start: starting is the application's.
    expect(await ops.signal(handle.runId, 'go', { ok: true })).toBe(true);
    await expect(as(OPERATOR_LOGIN, (c) => c.query(`select runledger.start_run('roles-ship', '{"id":"o-2"}')`))).rejects.toMatchObject({
      code: '42501',
    });

    expect(await handle.result({ timeoutMs: 30_000 })).toEqual({ total: 42, ok: true });
    expect((await db.pool.query('select count(*)::int as n from public.shipments')).rows[0].n).toBe(1);
    const audit = await db.pool.query(`select action, db_user, db_role from runledger.audit_log where run_id = $1`, [handle.runId]);
    expect(audit.rows).toEqual([{ action: 'send_signal', db_user: OPERATOR_LOGIN, db_role: OPERATOR_LOGIN }]);

    const seen = await as(READER_LOGIN, (c) =>
      c.query(`select status from runledger.run_timeline where run_id = $1 limit 1`, [handle.runId]),
    );
    expect(seen.rows.length).toBe(1);
  });
});

describe('search_path cannot hijack a SECURITY DEFINER function', () => {
  it('a text = operator and a temporary runs table of the caller are not used inside cancel_run', async () => {
    const app = createEngine({ connectionString: urlAs(WORKER_LOGIN), log: () => {} });
    engines.push(app);
    const waiter = app.workflow({ name: 'roles-waiter', queue: 'roles-hijack' }, async (ctx) => ctx.waitForSignal('never'));
    await app.runWorker({ queues: ['roles-hijack'], concurrency: 1 });
    const { runId } = await app.start(waiter, undefined);
    await waitFor(
      'the run waits',
      async () => (await db.pool.query(`select 1 from runledger.runs where run_id = $1 and status = 'WAITING'`, [runId])).rows[0],
    );

    await as(OPERATOR_LOGIN, async (client) => {
      const schema = `hijack_${suffix}`;
      await client.query(`create schema ${schema}`);
      await client.query(`create table ${schema}.calls (what text)`);
      // The shadow: text = text that records every use, and a runs table that would be
      // found before runledger's by an unqualified name.
      await client.query(`create function ${schema}.spy_eq(a text, b text) returns boolean language sql as $$
          insert into ${schema}.calls values ('eq'); select pg_catalog.texteq(a, b) $$`);
      await client.query(`create operator ${schema}.= (leftarg = text, rightarg = text, function = ${schema}.spy_eq)`);
      await client.query(`create function ${schema}.now() returns timestamptz language sql as $$
          insert into ${schema}.calls values ('now'); select pg_catalog.now() $$`);
      await client.query(`create temp table runs (run_id text, status text)`);
      await client.query(`set search_path = ${schema}, runledger, pg_catalog`);

      // The shadow works in this session (the control): an unqualified = is the spy's.
      await client.query(`select 'a'::text = 'a'::text`);
      expect((await client.query(`select count(*)::int as n from ${schema}.calls`)).rows[0].n).toBe(1);
      await client.query(`truncate ${schema}.calls`);

      const cancelled = await client.query(`select cancel_run($1, 'hijack test') as status`, [runId]);
      expect(cancelled.rows[0].status).toBe('CANCELLED');
      expect((await client.query(`select count(*)::int as n from ${schema}.calls`)).rows[0].n).toBe(0);
      // The temporary table was not written in place of runledger.runs.
      expect((await client.query(`select count(*)::int as n from pg_temp.runs`)).rows[0].n).toBe(0);
      await client.query(`reset search_path`);
      await client.query(`drop schema ${schema} cascade`);
    });
    expect((await db.pool.query(`select status from runledger.runs where run_id = $1`, [runId])).rows[0].status).toBe('CANCELLED');
  });
});

describe("the test clock is the owner's", () => {
  it('an operator that sets runledger.fake_now or runledger.clock_offset moves no clock: an expired approval cannot be decided', async () => {
    const DAY = 86_400_000;
    // A run asked for an approval with a one-hour timeout two days ago, by the test clock of
    // this test database (its owner switched it on, as runledger/testing does).
    const clock = createTestClock(new Date(Date.now() - 2 * DAY));
    const app = createTestEngine({ connectionString: db.url, clock });
    engines.push(app);
    const asking = app.workflow({ name: 'roles-expired-approval', queue: 'roles-clock' }, async (ctx) =>
      ctx.requestApproval('ship', { action: 'ship the order', timeout: '1h' }),
    );
    const worker = await app.runWorker({ manual: true, queues: ['roles-clock'] });
    const { runId } = await app.start(asking, undefined);
    await worker.drain();
    const request = (await db.pool.query(`select request_id, expires_at from runledger.approvals where run_id = $1`, [runId])).rows[0];
    expect(request.expires_at.getTime()).toBeLessThan(Date.now() - DAY);

    // A deployment: the owner has not switched the test clock on.
    await db.pool.query('update runledger.owner_settings set test_clock = false');
    try {
      await as(OPERATOR_LOGIN, async (client) => {
        const realNow = async () => {
          const t = (await client.query<{ t: Date }>('select runledger.now() as t')).rows[0]!.t;
          return Math.abs(t.getTime() - Date.now()) < 5_000;
        };
        await client.query(`select set_config('runledger.fake_now', $1, false)`, [new Date(Date.now() - 2 * DAY).toISOString()]);
        expect(await realNow()).toBe(true);
        expect(await sqlState(client.query(`select runledger.decide_approval($1, true, 'mallory')`, [request.request_id]))).toBe('RL005');
        await client.query(`select set_config('runledger.fake_now', '', false)`);
        await client.query(`set runledger.clock_offset = '-2 days'`);
        expect(await realNow()).toBe(true);
        expect(await sqlState(client.query(`select runledger.decide_approval($1, true, 'mallory')`, [request.request_id]))).toBe('RL005');
        // Nor can the operator switch the clock on: the owner's row is no role's to write.
        expect(await sqlState(client.query('update runledger.owner_settings set test_clock = true'))).toBe('42501');
      });
    } finally {
      await db.pool.query('update runledger.owner_settings set test_clock = true where not test_clock');
    }
    const approval = await db.pool.query(`select decision, decided_at from runledger.approvals where request_id = $1`, [
      request.request_id,
    ]);
    expect(approval.rows[0]).toEqual({ decision: null, decided_at: null });
    const audit = await db.pool.query(
      `select count(*)::int as n from runledger.audit_log where action = 'decide_approval' and run_id = $1`,
      [runId],
    );
    expect(audit.rows[0].n).toBe(0);
  });
});

describe('grant_roles', () => {
  it('is idempotent and reports what each role may do', async () => {
    const { rows } = await db.pool.query('select * from runledger.grant_roles() order by role_name');
    expect(rows.map((r) => [r.role_name, r.functions])).toEqual(
      ['runledger_operator', 'runledger_reader', 'runledger_worker'].map((role) => [
        role,
        functions.filter((f) => EXPECTED[role]!.includes(f.name)).length,
      ]),
    );
    expect(rows.find((r) => r.role_name === 'runledger_reader')?.relations).toBe(views.length);
  });

  it('only its owner may run it: an operator is refused', async () => {
    expect(await as(OPERATOR_LOGIN, (c) => sqlState(c.query('select runledger.grant_roles()')))).toBe('42501');
  });
});
