/**
 * Hot-path plans that cannot go stale. A worker's sessions cache the plans of the SQL
 * functions they call (PL/pgSQL keeps a generic plan after five executions); a plan
 * chosen while the queue table was empty must not turn into a sequential scan once the
 * table holds history whose statistics lag. This file warms a worker on an empty
 * database whose statistics say its tables are empty, loads 50,000 finished runs (with
 * steps, events and operations) and 5,000 waiting runs without ANALYZE (autovacuum off
 * for those tables, so nothing refreshes the statistics),
 * then runs every hot path again under auto_explain (log_nested_statements) and fails
 * on any plan that reads runs, steps, events or operations by sequential scan.
 */
import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { createEngine, type Engine } from '../src/index.js';
import { waitFor } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';

const HOT_TABLES = ['runs', 'steps', 'events', 'operations'];

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  Plans?: PlanNode[];
}
interface Explained {
  'Query Text': string;
  Plan: PlanNode;
}

/** Every plan auto_explain reports on the engine's connections while `recording` is on. */
const seen: Explained[] = [];
let recording = false;

class ExplainedClient extends pg.Client {
  constructor(config?: string | pg.ClientConfig) {
    super(config);
    this.on('notice', (notice) => {
      if (!recording || !notice.message?.startsWith('duration:')) return;
      const json = notice.message.slice(notice.message.indexOf('{'));
      seen.push(JSON.parse(json) as Explained);
    });
  }
}

const AUTO_EXPLAIN = [
  'session_preload_libraries=auto_explain',
  'auto_explain.log_min_duration=0',
  'auto_explain.log_nested_statements=on',
  'auto_explain.log_level=notice',
  'auto_explain.log_format=json',
]
  .map((setting) => `-c ${setting}`)
  .join(' ');

function seqScans(node: PlanNode, found: string[] = []): string[] {
  if (node['Node Type'] === 'Seq Scan' && HOT_TABLES.includes(node['Relation Name'] ?? '')) found.push(node['Relation Name']!);
  for (const child of node.Plans ?? []) seqScans(child, found);
  return found;
}

const t = useTestEngine({
  engine: false,
  prepare: async (db) => {
    // A table option is DDL: set before the worker caches any plan, so nothing invalidates them later.
    // The statistics say the tables are empty (analysed while they were), and stay so.
    for (const table of HOT_TABLES) {
      await db.pool.query(`alter table runledger.${table} set (autovacuum_enabled = false)`);
      await db.pool.query(`analyze runledger.${table}`);
    }
  },
});
const { db } = t;

function defineWorkflows(engine: Engine) {
  const oneStep = engine.workflow({ name: 'plan-one', queue: 'plans' }, async (ctx) => ctx.step('only', () => 1));
  const threeSteps = engine.workflow({ name: 'plan-three', queue: 'plans' }, async (ctx) => {
    const a = await ctx.step('a', () => 1);
    await ctx.sleep('pause', '5ms');
    const b = await ctx.transaction('b', async () => a + 1);
    const c = await ctx.operation('c', {}, async () => b + 1);
    return c;
  });
  const signalled = engine.workflow({ name: 'plan-signal', queue: 'plans' }, async (ctx) => {
    await ctx.step('before', () => 0);
    return ctx.waitForSignal<number>('go', { timeout: '1h' });
  });
  return { oneStep, threeSteps, signalled };
}

async function exercise(engine: Engine, flows: ReturnType<typeof defineWorkflows>, n: number): Promise<void> {
  const handles = [];
  for (let i = 0; i < n; i++) {
    handles.push(await engine.start(flows.oneStep, undefined));
    handles.push(await engine.start(flows.threeSteps, undefined));
    const waiting = await engine.start(flows.signalled, undefined);
    handles.push(waiting);
  }
  const signalled = handles.filter((_, i) => i % 3 === 2);
  for (const h of signalled) {
    await waitFor('waiting for its signal', async () => (await engine.getRun(h.runId))?.status === 'WAITING');
    await engine.signal(h.runId, 'go', 1);
  }
  try {
    await Promise.all(handles.map((h) => h.result({ timeoutMs: 20_000 })));
  } catch (error) {
    const stuck = await db.pool.query(
      `select run_id, workflow_name, status, wait_kind, wait_key, wake_at, now() as now, not_before, admitted from runledger.runs where status not in ('SUCCEEDED') and run_id not like 'hist-%' and run_id not like 'wait-%'`,
    );
    console.log(JSON.stringify(stuck.rows, null, 1));
    throw error;
  }
}

describe('hot-path plans on a database with history and stale statistics', () => {
  it('every SQL function the engine calls runs with enable_seqscan and jit off (sql/README.md, "Plans")', async () => {
    const { readFileSync, readdirSync, statSync } = await import('node:fs');
    const { join } = await import('node:path');
    const files = (dir: string): string[] =>
      readdirSync(dir).flatMap((name) => (statSync(join(dir, name)).isDirectory() ? files(join(dir, name)) : [join(dir, name)]));
    const called = new Set<string>();
    for (const file of files('src').filter((f) => f.endsWith('.ts'))) {
      for (const m of readFileSync(file, 'utf8').matchAll(/runledger\.([a-z_]+)\(/g)) called.add(m[1]!);
    }
    const { rows } = await db.pool.query<{ proname: string; lanname: string; volatile: boolean; config: string[] | null }>(
      `select p.proname, l.lanname, p.provolatile = 'v' as volatile, p.proconfig as config
         from pg_proc p join pg_language l on l.oid = p.prolang
        where p.pronamespace = 'runledger'::regnamespace and p.proname = any($1)`,
      [[...called]],
    );
    // The read-only SQL helpers (now(), run_transitions()...) are inlined into their callers' plans; registration is rare.
    const exempt = new Set(['now', 'run_transitions', '_register_worker', '_register_workflow']);
    const missing = rows
      .filter((r) => !exempt.has(r.proname))
      .filter((r) => !(r.config ?? []).includes('enable_seqscan=off') || !(r.config ?? []).includes('jit=off'))
      .map((r) => r.proname);
    expect(rows.length).toBeGreaterThan(30);
    expect(missing).toEqual([]);
  });

  it('never read runs, steps, events or operations by sequential scan, even with plans cached on an empty table', async () => {
    const engine = createEngine({
      pool: new pg.Pool({ connectionString: db.url, options: AUTO_EXPLAIN, Client: ExplainedClient, max: 6 }),
      log: () => {},
    });
    try {
      const flows = defineWorkflows(engine);
      const worker = await engine.runWorker({ queues: ['plans'], concurrency: 4, pollIntervalMs: 200 });
      // Warm-up on an almost empty database: every statement runs more than five times per session.
      await exercise(engine, flows, 30);

      // History arrives while the worker runs: finished runs with their steps and events, and waiting runs.
      await db.pool.query(`
        insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input, output,
                                    finished_at, termination_reason, started_at, fencing_token)
        select 'hist-' || g, 'plan-three', '1', 'plans', 'SUCCEEDED', '{}', '1', now(), 'COMPLETED', now(), 1
          from generate_series(1, 50000) g`);
      await db.pool.query(`
        insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
        select 'hist-' || g, s, 'step-' || s, 'step', 'SUCCEEDED', '1', 1, now(), now(), 1
          from generate_series(1, 50000) g, generate_series(0, 2) s`);
      await db.pool.query(`
        insert into runledger.events (run_id, kind, detail)
        select 'hist-' || g, k, '{}' from generate_series(1, 50000) g, unnest(array['created', 'claimed', 'completed']) k`);
      await db.pool.query(`
        insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, result, compensable)
        select 'hist-op-' || g, 'hist-' || g, 2, 'step-2', 'hist-key-' || g, 'SUCCEEDED', '1', false
          from generate_series(1, 50000) g`);
      await db.pool.query(`
        insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input, wait_kind, wait_key, wake_at)
        select 'wait-' || g, 'plan-signal', '1', 'plans', 'WAITING', '{}', 'signal', 'never', now() + interval '1 day'
          from generate_series(1, 5000) g`);
      const stats = await db.pool.query(`select reltuples from pg_class where oid = 'runledger.runs'::regclass`);
      expect(Number(stats.rows[0].reltuples)).toBe(0); // the statistics still describe the empty table

      recording = true;
      await exercise(engine, flows, 20);
      await worker.stop();
      recording = false;

      const plpgsql = seen.filter((p) => p.Plan && !/^\s*select runledger\./i.test(p['Query Text']));
      expect(plpgsql.length).toBeGreaterThan(100); // the nested statements of the SQL functions were seen
      const bad = seen
        .map((p) => ({ query: p['Query Text'].replace(/\s+/g, ' ').slice(0, 300), scans: seqScans(p.Plan) }))
        .filter((p) => p.scans.length > 0);
      const distinct = [...new Map(bad.map((b) => [b.query, b])).values()];
      expect(distinct, JSON.stringify(distinct, null, 2)).toEqual([]);
    } finally {
      await engine.close();
    }
  }, 180_000);
});
