import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createEngine, type Engine, type Workflow } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { sqlState } from './helpers/sql-errors.js';
import { useTestEngine } from './helpers/test-engine.js';

/**
 * Tenant isolation (sql/0014_security.sql): once runledger.enable_tenant_isolation() has
 * run, a reader or operator whose session names a tenant sees and acts on that tenant's
 * runs only (runs, steps, events, signals, approvals, operations, streams, sessions,
 * audit rows, and every view), a session naming none sees nothing, workers see all, and
 * a child run or a fork keeps its tenant. What every tenant shares (queues, retention rules,
 * pruning, artifact blobs) is refused to a tenant's operator, and an agent session belongs
 * to the tenant of the runs that use it.
 */
const t = useTestEngine({ engine: false });
const { db } = t;

const suffix = process.pid;
const APP = `rl_tenant_app_${suffix}`;
const READER = `rl_tenant_reader_${suffix}`;
const OPERATOR = `rl_tenant_ops_${suffix}`;
const ACME_ONLY = `rl_tenant_acme_ops_${suffix}`;
// The schema's owner: row-level security never restricts a superuser, so isolation needs
// runledger's objects (its views and SECURITY DEFINER functions run as their owner) to
// belong to an ordinary role, as they do where a deployment migrates as one.
const OWNER = `rl_tenant_owner_${suffix}`;
const PASSWORD = 'tenants-test';
const urlAs = (login: string) => {
  const url = new URL(db.url);
  url.username = login;
  url.password = PASSWORD;
  return url.toString();
};

let app: Engine;
const runs: Record<'acme' | 'globex', { parent: string; child: string; approval: string; fork?: string }> = {} as never;
let waitsWithInbox: Workflow<any, any>;
let sessionChat: Workflow<{ tenant: string; hold?: boolean }, { seen: unknown[]; after: unknown[] }>;

beforeAll(async () => {
  for (const [login, role] of [
    [APP, 'runledger_worker'],
    [READER, 'runledger_reader'],
    [OPERATOR, 'runledger_operator'],
    [ACME_ONLY, 'runledger_operator'],
  ]) {
    await db.pool.query(`drop role if exists ${login}`);
    await db.pool.query(`create role ${login} login password '${PASSWORD}' in role ${role}`);
  }
  await db.pool.query(`insert into runledger.tenant_members (role_name, tenant_id) values ($1, 'acme')`, [ACME_ONLY]);

  // Owned by the superuser that migrated the template, isolation is refused: it would not hold.
  const refused = await db.pool
    .query('select runledger.enable_tenant_isolation()')
    .catch((error: { code?: string; message: string }) => error);
  expect(refused).toMatchObject({ code: '55000', message: expect.stringContaining('superuser') });
  await db.pool.query(`drop role if exists ${OWNER}`);
  await db.pool.query(`create role ${OWNER} nologin`);
  await db.pool.query(`do $$
    declare o record;
    begin
      execute format('alter schema runledger owner to %I', '${OWNER}');
      for o in select c.oid::regclass::text as name, c.relkind from pg_class c
                where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v') loop
        execute format('alter %s %s owner to %I', case o.relkind when 'v' then 'view' else 'table' end, o.name, '${OWNER}');
      end loop;
      for o in select p.oid::regprocedure::text as name from pg_proc p where p.pronamespace = 'runledger'::regnamespace loop
        execute format('alter function %s owner to %I', o.name, '${OWNER}');
      end loop;
      for o in select t.oid::regtype::text as name from pg_type t
                where t.typnamespace = 'runledger'::regnamespace and t.typtype = 'e' loop
        execute format('alter type %s owner to %I', o.name, '${OWNER}');
      end loop;
    end $$`);
  expect((await db.pool.query('select runledger.enable_tenant_isolation() as tables')).rows[0].tables).toContain('runs');

  app = createEngine({ connectionString: urlAs(APP), log: () => {} });
  const child = app.workflow({ name: 'tenant-child', queue: 'tenants' }, async (ctx, n: number) => ctx.step('double', () => n * 2));
  waitsWithInbox = app.workflow({ name: 'tenant-parent', queue: 'tenants' }, async (ctx, input: { tenant: string }) => {
    await ctx.step('hello', () => `hello ${input.tenant}`);
    const doubled = await ctx.runChild(child, 21);
    const out = ctx.stream('log');
    await out.write({ line: `${input.tenant} working` });
    await out.close();
    // A signal sent before its wait stays in the inbox: the run waits on another topic.
    return { doubled, go: await ctx.waitForSignal('go') };
  });
  const approving = app.workflow({ name: 'tenant-approval', queue: 'tenants' }, async (ctx) =>
    ctx.requestApproval('ship', { action: 'ship the order', evidence: { order: 7 } }),
  );
  // Every tenant's runs open the same session id.
  sessionChat = app.workflow({ name: 'tenant-session', queue: 'tenants' }, async (ctx, input: { tenant: string; hold?: boolean }) => {
    const session = await ctx.session('support-1');
    const seen = (await session.history()).map((entry) => entry.content);
    await session.append([{ role: 'user', content: `${input.tenant} says hi` }]);
    if (input.hold) await ctx.waitForSignal('done');
    return { seen, after: (await session.history()).map((entry) => entry.content) };
  });
  await app.runWorker({ queues: ['tenants'], concurrency: 4 });

  for (const tenant of ['acme', 'globex'] as const) {
    const parent = await app.start(waitsWithInbox, { tenant }, { tenantId: tenant });
    const approval = await app.start(approving, undefined, { tenantId: tenant });
    await db.pool.query(`select runledger.send_signal($1, 'early', $2)`, [parent.runId, { pending: tenant }]);
    // The parent's wait for its signal, after its child and its stream (not its wait for the child).
    await waitFor(`${tenant}'s runs wait`, async () => {
      const { rows } = await db.pool.query(
        `select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'WAITING' and wait_kind <> 'child'`,
        [[parent.runId, approval.runId]],
      );
      return rows[0].n === 2 ? true : undefined;
    });
    const childRow = await db.pool.query(`select run_id from runledger.runs where parent_run_id = $1`, [parent.runId]);
    runs[tenant] = { parent: parent.runId, approval: approval.runId, child: childRow.rows[0].run_id };
  }
});
afterAll(async () => {
  await app?.close();
  for (const login of [APP, READER, OPERATOR, ACME_ONLY]) {
    await db.pool.query(`drop owned by ${login}`);
    await db.pool.query(`drop role if exists ${login}`);
  }
  // The database is dropped after this file; its objects go with it, then the role can.
  await db.pool.query(`reassign owned by ${OWNER} to current_user`);
  await db.pool.query(`drop owned by ${OWNER}`);
  await db.pool.query(`drop role if exists ${OWNER}`);
});

async function as<T>(login: string, tenant: string | null, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = new pg.Client({ connectionString: urlAs(login) });
  await client.connect();
  try {
    if (tenant !== null) await client.query(`select set_config('runledger.tenant', $1, false)`, [tenant]);
    return await fn(client);
  } finally {
    await client.end();
  }
}
const acmeIds = () => Object.values(runs.acme).filter(Boolean) as string[];
const globexIds = () => Object.values(runs.globex).filter(Boolean) as string[];

/** The run ids a relation shows this session, through its run_id column. */
async function runIdsIn(client: pg.Client, relation: string): Promise<string[]> {
  const { rows } = await client.query(`select distinct run_id from ${relation} where run_id is not null`);
  return rows.map((r) => r.run_id as string);
}

describe('a child run and a fork keep the tenant', () => {
  it('the child of an acme run is acme, and so is a fork of it', async () => {
    const { rows } = await db.pool.query(`select run_id, tenant_id from runledger.runs where run_id = any($1)`, [
      [runs.acme.parent, runs.acme.child, runs.globex.child],
    ]);
    expect(Object.fromEntries(rows.map((r) => [r.run_id, r.tenant_id]))).toEqual({
      [runs.acme.parent]: 'acme',
      [runs.acme.child]: 'acme',
      [runs.globex.child]: 'globex',
    });
    // Forked by the acme-bound operator: the fork is acme's too.
    const forked = await as(ACME_ONLY, 'acme', (c) => c.query(`select runledger.fork_run($1, 0) as id`, [runs.acme.parent]));
    runs.acme.fork = forked.rows[0].id;
    // The fork runs again from its first step, to the same wait: the signal 'go', after its
    // child and its stream (it also waits, for its child, on the way there).
    await waitFor(
      'the fork waits for go',
      async () =>
        (
          await db.pool.query(
            `select 1 from runledger.runs where run_id = $1 and status = 'WAITING' and wait_kind = 'signal' and wait_key = 'go'`,
            [runs.acme.fork],
          )
        ).rows[0],
    );
    const tenant = await db.pool.query(`select tenant_id from runledger.runs where run_id = $1`, [runs.acme.fork]);
    expect(tenant.rows[0].tenant_id).toBe('acme');
    expect((await app.getRun(runs.acme.fork!))?.tenantId).toBe('acme');
  });
});

describe("one tenant's reader", () => {
  it("sees its runs, steps, signals, approvals and streams in the views, and none of the other tenant's", async () => {
    await as(READER, 'acme', async (client) => {
      const { rows: views } = await client.query<{ view: string }>(
        `select c.oid::regclass::text as view from pg_class c join pg_attribute a on a.attrelid = c.oid
          where c.relnamespace = 'runledger'::regnamespace and c.relkind = 'v' and a.attname = 'run_id'`,
      );
      expect(views.length).toBeGreaterThan(8);
      const seenAnywhere = new Set<string>();
      for (const { view } of views) {
        const ids = await runIdsIn(client, view);
        for (const id of ids) seenAnywhere.add(id);
        expect({ view, other: ids.filter((id) => globexIds().includes(id)) }).toEqual({ view, other: [] });
      }
      // Not vacuous: the reader does see acme's data, in the views that hold each kind.
      expect(await runIdsIn(client, 'runledger.run_timeline')).toEqual(expect.arrayContaining([runs.acme.parent, runs.acme.child]));
      expect(await runIdsIn(client, 'runledger.waiting')).toEqual(expect.arrayContaining([runs.acme.parent, runs.acme.approval]));
      expect(await runIdsIn(client, 'runledger.approval_inbox')).toEqual([runs.acme.approval]);
      // The fork (from step 0) runs again and writes its own stream.
      expect((await runIdsIn(client, 'runledger.streams')).sort()).toEqual([runs.acme.parent, runs.acme.fork].sort());
      for (const id of acmeIds().filter((id) => id !== runs.acme.fork)) expect(seenAnywhere).toContain(id);
    });
  });

  it('sees no run at all when its session names no tenant, or a tenant with no runs', async () => {
    for (const tenant of [null, 'initech']) {
      await as(READER, tenant, async (client) => {
        for (const view of ['runledger.run_timeline', 'runledger.waiting', 'runledger.approval_inbox', 'runledger.streams']) {
          expect({ tenant, view, ids: await runIdsIn(client, view) }).toEqual({ tenant, view, ids: [] });
        }
      });
    }
  });
});

describe("one tenant's operator", () => {
  const tables = [
    'runledger.runs',
    'runledger.steps',
    'runledger.events',
    'runledger.signals',
    'runledger.approvals',
    'runledger.stream_chunks',
    'runledger.stream_ends',
  ];

  it.each(tables)("reads its tenant's rows of %s and none of the other's", async (table) => {
    await as(OPERATOR, 'globex', async (client) => {
      const ids = await runIdsIn(client, table);
      expect(ids.length).toBeGreaterThan(0);
      expect(ids.filter((id) => !globexIds().includes(id))).toEqual([]);
    });
  });

  it('sees the signal waiting in its own run inbox, not the other tenant’s', async () => {
    const payloads = await as(OPERATOR, 'globex', (c) => c.query(`select payload from runledger.signals where topic = 'early'`));
    expect(payloads.rows.map((r) => r.payload)).toEqual([{ pending: 'globex' }]);
  });

  it("cannot act on the other tenant's runs: they are not found", async () => {
    await as(OPERATOR, 'globex', async (client) => {
      expect(await sqlState(client.query(`select runledger.cancel_run($1)`, [runs.acme.parent]))).toBe('RL002');
      expect(await sqlState(client.query(`select runledger.send_signal($1, 'go', '{}')`, [runs.acme.parent]))).toBe('RL002');
      const request = await db.pool.query(`select request_id from runledger.approvals where run_id = $1`, [runs.acme.approval]);
      expect(await sqlState(client.query(`select runledger.decide_approval($1, true, 'mallory')`, [request.rows[0].request_id]))).toBe(
        'RL002',
      );
      expect(await sqlState(client.query(`select runledger.fork_run($1, 0)`, [runs.acme.parent]))).toBe('RL002');
      // What all tenants share is not a tenant's to change.
      expect(await sqlState(client.query(`select runledger.set_queue('tenants', '{"paused": true}')`))).toBe('42501');
    });
    const statuses = await db.pool.query(`select status from runledger.runs where run_id = any($1)`, [
      [runs.acme.parent, runs.acme.approval],
    ]);
    expect(statuses.rows.map((r) => r.status)).toEqual(['WAITING', 'WAITING']);
  });

  it('acts on its own runs, and its audit rows are its tenant’s only', async () => {
    await as(OPERATOR, 'globex', async (client) => {
      expect((await client.query(`select runledger.send_signal($1, 'go', '"ship"')`, [runs.globex.parent])).rows[0].send_signal).toBe(true);
      const request = await client.query(`select request_id from runledger.approvals where run_id = $1`, [runs.globex.approval]);
      await client.query(`select runledger.decide_approval($1, true, 'gloria')`, [request.rows[0].request_id]);
    });
    await waitFor('globex runs finish', async () => {
      const { rows } = await db.pool.query(
        `select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'SUCCEEDED'`,
        [[runs.globex.parent, runs.globex.approval]],
      );
      return rows[0].n === 2 ? true : undefined;
    });
    await as(OPERATOR, 'acme', async (client) => {
      expect(await runIdsIn(client, 'runledger.audit_log')).toEqual(expect.arrayContaining([runs.acme.parent]));
      expect((await runIdsIn(client, 'runledger.audit_log')).filter((id) => globexIds().includes(id))).toEqual([]);
    });
  });

  it('is refused what every tenant shares (42501): retention rules, pruning, artifact blobs, queues; no rule changes', async () => {
    const rules = async () => (await db.pool.query('select kind, workflow_name, keep::text from runledger.retention order by 1, 2')).rows;
    await db.pool.query(`select runledger.set_retention('runs', '30 days')`);
    const before = await rules();
    const acmeFinished = (
      await db.pool.query(`select run_id from runledger.runs where tenant_id = 'acme' and runledger.is_terminal(status)`)
    ).rows.map((r) => r.run_id as string);
    expect(acmeFinished.length).toBeGreaterThan(0);
    const auditBefore = (await db.pool.query('select count(*)::int as n from runledger.audit_log')).rows[0].n;
    await as(OPERATOR, 'globex', async (client) => {
      for (const call of [
        `select runledger.set_retention('runs', '0')`,
        `select runledger.set_retention('audit_log', '0')`,
        `select runledger.set_retention('events', '0', 'tenant-parent')`,
        `select runledger.clear_retention('runs')`,
        `select * from runledger.prune_due()`,
        `select runledger.prune('0')`,
        `select runledger.prune_artifact_blobs()`,
        `select runledger.set_queue('tenants', '{"paused": true}')`,
      ]) {
        expect({ call, state: await sqlState(client.query(call)) }).toEqual({ call, state: '42501' });
      }
    });
    expect(await rules()).toEqual(before);
    // The workers' next pass (not bound to a tenant) applies the owner's rules only: the other
    // tenant's finished runs and every audit record stay.
    await db.pool.query('select * from runledger.prune_due()');
    const left = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1)`, [acmeFinished]);
    expect(left.rows[0].n).toBe(acmeFinished.length);
    expect((await db.pool.query('select count(*)::int as n from runledger.audit_log')).rows[0].n).toBeGreaterThanOrEqual(auditBefore);
    await db.pool.query(`select runledger.clear_retention('runs')`);
  });

  it('a role bound to acme in tenant_members sees nothing when its session names globex', async () => {
    await as(ACME_ONLY, 'globex', async (client) => {
      expect(await runIdsIn(client, 'runledger.runs')).toEqual([]);
      expect(await sqlState(client.query(`select runledger.cancel_run($1)`, [runs.globex.child]))).toBe('RL002');
    });
    await as(ACME_ONLY, 'acme', async (client) => {
      expect(await runIdsIn(client, 'runledger.runs')).toEqual(expect.arrayContaining([runs.acme.parent]));
    });
  });
});

describe('sessions belong to a tenant', () => {
  const sessionRows = async () =>
    (
      await db.pool.query(
        `select session_id, tenant_id, entry_count, holder_run_id from runledger.sessions where session_id = 'support-1' order by tenant_id`,
      )
    ).rows;

  it("another tenant's run that opens the same session id gets a history of its own, and does not wait for the first one's holder", async () => {
    const acme = await app.start(sessionChat, { tenant: 'acme', hold: true }, { tenantId: 'acme' });
    await waitFor(
      'the acme run holds the session and waits',
      async () =>
        (await db.pool.query(`select 1 from runledger.runs where run_id = $1 and status = 'WAITING' and wait_key = 'done'`, [acme.runId]))
          .rows[0],
    );
    const globex = await app.start(sessionChat, { tenant: 'globex' }, { tenantId: 'globex' });
    expect(await globex.result({ timeoutMs: 20_000 })).toEqual({ seen: [], after: ['globex says hi'] });
    expect(await sessionRows()).toEqual([
      { session_id: 'support-1', tenant_id: 'acme', entry_count: 1, holder_run_id: acme.runId },
      { session_id: 'support-1', tenant_id: 'globex', entry_count: 1, holder_run_id: null },
    ]);
    await db.pool.query(`select runledger.send_signal($1, 'done', 'true')`, [acme.runId]);
    expect(await acme.result({ timeoutMs: 20_000 })).toEqual({ seen: [], after: ['acme says hi'] });
    // The next acme run reads acme's conversation, and only it.
    const again = await app.start(sessionChat, { tenant: 'acme' }, { tenantId: 'acme' });
    expect(await again.result({ timeoutMs: 20_000 })).toEqual({ seen: ['acme says hi'], after: ['acme says hi', 'acme says hi'] });
    expect((await sessionRows()).map((r) => [r.tenant_id, r.entry_count])).toEqual([
      ['acme', 2],
      ['globex', 1],
    ]);
  });

  it("one tenant's operator and reader see and act on that tenant's session of the id only", async () => {
    await as(OPERATOR, 'globex', async (client) => {
      expect((await client.query('select session_id, tenant_id, entries from runledger.session_list')).rows).toEqual([
        { session_id: 'support-1', tenant_id: 'globex', entries: 1 },
      ]);
      const history = await client.query(`select content from runledger.session_history('support-1')`);
      expect(history.rows.map((r) => r.content)).toEqual(['globex says hi']);
      expect((await client.query('select distinct tenant_id from runledger.session_entries')).rows).toEqual([{ tenant_id: 'globex' }]);
    });
    await as(READER, 'acme', async (client) => {
      expect((await client.query('select session_id, tenant_id, entries from runledger.session_list')).rows).toEqual([
        { session_id: 'support-1', tenant_id: 'acme', entries: 2 },
      ]);
    });
    await as(ACME_ONLY, 'globex', async (client) => {
      expect(await sqlState(client.query(`select * from runledger.session_history('support-1')`))).toBe('RL002');
      expect(await sqlState(client.query(`select runledger.delete_session('support-1')`))).toBe('RL002');
    });
    const removed = await as(OPERATOR, 'globex', (c) => c.query(`select runledger.delete_session('support-1') as n`));
    expect(removed.rows[0].n).toBe(1);
    expect((await sessionRows()).map((r) => [r.tenant_id, r.entry_count])).toEqual([['acme', 2]]);
    const audit = await db.pool.query(
      `select arguments from runledger.audit_log where action = 'delete_session' order by audit_id desc limit 1`,
    );
    expect(audit.rows[0].arguments).toEqual({ tenant_id: 'globex' });
  });
});

describe('workers and the owner', () => {
  it('a worker login sees every tenant, whatever its session names', async () => {
    await as(APP, 'acme', async (client) => {
      const ids = await runIdsIn(client, 'runledger.runs');
      expect(ids).toEqual(expect.arrayContaining([...acmeIds(), ...globexIds()]));
    });
  });

  it('isolation off: the reader sees every tenant again; on again: only its own', async () => {
    await db.pool.query('select runledger.disable_tenant_isolation()');
    const all = await as(READER, 'acme', (c) => runIdsIn(c, 'runledger.run_timeline'));
    expect(all).toEqual(expect.arrayContaining([runs.acme.parent, runs.globex.parent]));
    await db.pool.query('select runledger.enable_tenant_isolation()');
    const own = await as(READER, 'acme', (c) => runIdsIn(c, 'runledger.run_timeline'));
    expect(own).not.toContain(runs.globex.parent);
  });

  it('a bad tenant id is refused at start with INVALID_INPUT, and nothing is started', async () => {
    const before = (await db.pool.query('select count(*)::int as n from runledger.runs')).rows[0].n;
    await expect(app.start(waitsWithInbox, { tenant: 'x' }, { tenantId: 'no spaces allowed' })).rejects.toMatchObject({
      code: 'INVALID_INPUT',
    });
    expect((await db.pool.query('select count(*)::int as n from runledger.runs')).rows[0].n).toBe(before);
  });
});
