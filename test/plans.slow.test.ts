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
import { GAUGES_SQL } from '../src/engine/observe/gauges.js';
import { createTestDatabase, waitFor, type TestDatabase } from './helpers/database.js';
import { useTestEngine } from './helpers/test-engine.js';

const HOT_TABLES = ['runs', 'steps', 'events', 'operations'];

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  'Index Cond'?: string;
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
  // A queue with limits (recordPlans sets them): its runs go through admission rounds.
  const limited = engine.workflow({ name: 'plan-limited', queue: 'plans-limited' }, async (ctx) => ctx.step('only', () => 1));
  return { oneStep, threeSteps, signalled, limited };
}

async function exercise(engine: Engine, flows: ReturnType<typeof defineWorkflows>, target: TestDatabase, n: number): Promise<void> {
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
    const stuck = await target.pool.query(
      `select run_id, workflow_name, status, wait_kind, wait_key, wake_at, now() as now, not_before, admitted from runledger.runs where status not in ('SUCCEEDED') and run_id not like 'hist-%' and run_id not like 'wait-%'`,
    );
    console.log(JSON.stringify(stuck.rows, null, 1));
    throw error;
  }
  // With the worker's slots free again: starts made together (they share statements,
  // runledger._start_many), and runs of several tenants in the queue with limits,
  // admitted a few at a time.
  const together = await Promise.all([
    ...Array.from({ length: n }, () => engine.start(flows.oneStep, undefined)),
    ...Array.from({ length: 2 * n }, (_, i) => engine.start(flows.limited, undefined, { concurrencyKey: `tenant-${i % 5}` })),
  ]);
  await Promise.all(together.map((h) => h.result({ timeoutMs: 20_000 })));
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
    // The claim keeps its generic plans (its limits are parameters: PL/pgSQL's cost test would plan it on every call).
    expect(rows.find((r) => r.proname === '_claim_batch')?.config).toContain('plan_cache_mode=force_generic_plan');
  });

  it('never read runs, steps, events or operations by sequential scan, even with plans cached on an empty table', async () => {
    const found = await staleStatisticsScenario(db);
    expect(found.plpgsqlPlans).toBeGreaterThan(100); // the nested statements of the SQL functions were seen
    expectBatchedStartsAndAdmission(found);
    expect(found.seqScans, JSON.stringify(found.seqScans, null, 2)).toEqual([]);
    // A lookup of one run by its id goes by the primary key, not by an index of every run in some status.
    const notByKey = found.statements.filter(
      (s) =>
        /\brun_id = p_run_id\b/.test(s.query) &&
        s.scans.some((x) => x.includes('on runs')) &&
        !s.scans.some((x) => x.includes('runs_pkey')),
    );
    expect(notByKey, JSON.stringify(notByKey, null, 2)).toEqual([]);
    expect(found.walks, JSON.stringify(found.walks, null, 2)).toEqual([]);
    expectReadyClaimInIndexOrder(found);
    await report('with the settings', found);
  }, 180_000);

  it('the same check finds the sequential scans once the functions lose their settings (it can fail)', async () => {
    const bare = await createTestDatabase();
    try {
      await bare.pool.query(`
        do $$
        declare f regprocedure;
        begin
          for f in select oid::regprocedure from pg_proc where pronamespace = 'runledger'::regnamespace and proconfig is not null loop
            execute format('alter function %s reset all', f);
          end loop;
        end $$`);
      for (const table of HOT_TABLES) {
        await bare.pool.query(`alter table runledger.${table} set (autovacuum_enabled = false)`);
        await bare.pool.query(`analyze runledger.${table}`);
      }
      const found = await staleStatisticsScenario(bare);
      expect(found.seqScans.map((s) => s.query).join('\n')).toMatch(/runledger\.runs/);
      await report('without the settings', found);
    } finally {
      await bare.drop();
    }
  }, 180_000);
});

describe('hot-path plans on a new database, never analysed', () => {
  it('read no index of runs, steps, events or operations whole, and complete each run by the primary key', async () => {
    const target = await createTestDatabase();
    try {
      const found = await newDatabaseScenario(target);
      expect(found.plpgsqlPlans).toBeGreaterThan(100);
      expectBatchedStartsAndAdmission(found);
      expect(found.seqScans, JSON.stringify(found.seqScans, null, 2)).toEqual([]);
      expect(found.walks, JSON.stringify(found.walks, null, 2)).toEqual([]);
      expectReadyClaimInIndexOrder(found);
      // The group commit's completion UPDATE (_commit_fast) finds each run by its key.
      const completion = found.statements.filter((s) => /^with done as \( update runledger\.runs r set status = 'SUCCEEDED'/.test(s.query));
      expect(completion.length, JSON.stringify(found.statements.map((s) => s.query))).toBeGreaterThan(0);
      for (const s of completion) {
        // The index scans that find runs rows (a bitmap heap scan follows its index's).
        const byIndex = s.scans.filter((scan) => /^(Index|Index Only|Bitmap Index) Scan .*using runs_/.test(scan));
        expect(byIndex.length, s.scans.join('; ')).toBeGreaterThan(0);
        expect(
          byIndex.filter((scan) => !scan.endsWith('using runs_pkey')),
          s.scans.join('; '),
        ).toEqual([]);
      }
      await report('a new database, never analysed', found);
    } finally {
      await target.drop();
    }
  }, 180_000);

  it('the same check finds the walk of an index whose first column is not the run id (it can fail)', async () => {
    const target = await createTestDatabase();
    try {
      // An index over every row whose first column is not the run id, (workflow_name, run_id) as the console's
      // was before it became partial, and no primary key beside it (its foreign keys go with it): every lookup
      // of a run by id can only walk that index.
      // Whether a planner takes the walk over the primary key depends on its version and the batch sizes
      // (PostgreSQL 15 did, for the completion, on a new database); without the key every version must.
      await target.pool.query('create index runs_by_workflow on runledger.runs (workflow_name, run_id)');
      await target.pool.query('alter table runledger.runs drop constraint runs_pkey cascade');
      const found = await newDatabaseScenario(target);
      expect(found.walks.flatMap((s) => s.scans).join('\n')).toMatch(/using runs_by_workflow: \(run_id = /);
    } finally {
      await target.drop();
    }
  }, 180_000);
});

/** `n` SUCCEEDED runs hist-1..hist-n of `workflow` on `queue`, inserted behind the statistics' back (no ANALYZE). */
async function insertFinishedRuns(target: TestDatabase, workflow: string, queue: string, n: number): Promise<void> {
  await target.pool.query(
    `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input, output,
                                 finished_at, termination_reason, started_at, fencing_token)
     select 'hist-' || g, $1, '1', $2, 'SUCCEEDED', '{}', '1', now(), 'COMPLETED', now(), 1 from generate_series(1, $3::int) g`,
    [workflow, queue, n],
  );
}

/** `n` runs wait-1..wait-n WAITING a day for a signal nobody sends. */
async function insertWaitingRuns(target: TestDatabase, workflow: string, queue: string, n: number): Promise<void> {
  await target.pool.query(
    `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input, wait_kind, wait_key, wake_at)
     select 'wait-' || g, $1, '1', $2, 'WAITING', '{}', 'signal', 'never', now() + interval '1 day' from generate_series(1, $3::int) g`,
    [workflow, queue, n],
  );
}

describe('the metrics gauges’ statement (observe/gauges.ts) on a database with history and stale statistics', () => {
  it('reads the unfinished runs through runs_console, never the finished ones by sequential scan', async () => {
    const target = await createTestDatabase();
    try {
      // Statistics taken while runs was empty, then 50,000 finished runs and 2,000 unfinished ones behind their back.
      await target.pool.query(`alter table runledger.runs set (autovacuum_enabled = false)`);
      await target.pool.query(`analyze runledger.runs`);
      await insertFinishedRuns(target, 'gauged', 'gauges', 50_000);
      await insertWaitingRuns(target, 'gauged', 'gauges', 1_000);
      await target.pool.query(`
        insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input)
        select 'pend-' || g, 'gauged', '1', 'gauges', 'PENDING', '{}' from generate_series(1, 1000) g`);
      const explained = await target.pool.query(`explain (format json) ${GAUGES_SQL}`);
      const scans = hotScans(explained.rows[0]['QUERY PLAN'][0].Plan as PlanNode);
      expect(
        scans.filter((scan) => scan.startsWith('Seq Scan')),
        scans.join('; '),
      ).toEqual([]);
      expect(scans.join('; ')).toContain('runs_console');
      // And it counts what is there: the gauge rows are the database's figures.
      const rows = (await target.pool.query(GAUGES_SQL)).rows.filter((row) => row.queue_name === 'gauges' && row.status);
      expect(rows.map((row) => [row.status, row.runs]).sort()).toEqual([
        ['PENDING', 1000],
        ['WAITING', 1000],
      ]);
    } finally {
      await target.drop();
    }
  }, 60_000);
});

interface ScenarioFindings {
  /** Every distinct statement seen (whitespace folded, the first 300 characters). */
  queries: Set<string>;
  plpgsqlPlans: number;
  seqScans: Array<{ query: string; scans: string[] }>;
  /** Every distinct statement seen and the scans of hot tables in its plan (node type, table, index). */
  statements: Array<{ query: string; scans: string[] }>;
  /** Statements whose plan walks an index of a hot table whole: its condition leaves the first column free. */
  walks: Array<{ query: string; scans: string[] }>;
  /** _claim_batch's read of a free queue's ready runs: the scans and sorts of every plan it ran with. */
  claims: Array<{ query: string; scans: string[] }>;
}

/** _claim_batch's read of the ready runs of a queue without limits (order by priority, created_at). */
const READY_CLAIM =
  /^v_ids := v_ids \|\| array\( select r\.run_id from runledger\.runs r where r\.queue_name = v_queue and r\.status = 'PENDING' and r\.admitted and \(r\.not_before is null or r\.not_before <= v_now\) -- Past its deadline/;

/**
 * _claim_batch keeps one generic plan per statement (plan_cache_mode = force_generic_plan,
 * sql/0004_claim_and_leases.sql): the read of the ready runs must be runs_ready read in its own order,
 * the first rows only, whatever the statistics said when the plan was made; a sort would
 * read every ready run of the queue on each claim.
 */
function expectReadyClaimInIndexOrder(found: ScenarioFindings): void {
  expect(found.claims.length, 'the claim of ready runs was not seen').toBeGreaterThan(0);
  for (const claim of found.claims) expect(claim.scans, claim.query).toEqual(['Index Scan on runs using runs_ready']);
}

/** The scenario ran the statements of batched starts and of both kinds of admission round, so their plans were checked. */
function expectBatchedStartsAndAdmission(found: ScenarioFindings): void {
  const queries = [...found.queries];
  expect(queries.some((q) => q.startsWith('select item, run_id, claimed') && q.includes('_start_many'))).toBe(true);
  // _admit_first_turns's read of the oldest waiting runs, and its update of the runs it chose.
  expect(queries.some((q) => q.startsWith('with oldest as materialized'))).toBe(true);
  expect(queries.some((q) => q.startsWith('update runledger.runs r set admitted = true') && q.includes('_admit_round('))).toBe(true);
  // The oldest waiting runs are read in the order of runs_admission_order, a few of them; the
  // other index of waiting runs (by key first) would read the queue's every waiting run and sort.
  for (const s of found.statements.filter((x) => x.query.startsWith('with oldest as materialized'))) {
    expect(s.scans, s.query).toContain('Index Scan on runs using runs_admission_order');
    expect(
      s.scans.filter((scan) => scan.includes('runs_admission_key')),
      s.query,
    ).toEqual([]);
  }
  // The runs it chose are admitted by their key.
  for (const s of found.statements.filter(
    (x) => x.query.startsWith('update runledger.runs r set admitted = true') && x.query.includes('_admit_round('),
  )) {
    expect(
      s.scans.filter((scan) => scan !== 'ModifyTable on runs' && !scan.startsWith('Function Scan')),
      s.query,
    ).toEqual(['Index Scan on runs using runs_pkey']);
  }
  // A group commit with a claim defers its rounds' runs to the claim (_commit_and_claim):
  // the claim reads them, and _admit_deferred admits the rest, by their key too.
  const deferred = found.statements.filter(
    (x) =>
      x.query.includes('from jsonb_to_recordset(v_deferred) d(q text, id text, at timestamptz) join runledger.runs r') ||
      x.query.startsWith('update runledger.runs r set admitted = true, admitted_at = d.at'),
  );
  expect(deferred.map((x) => (x.query.startsWith('update') ? 'admits the rest' : 'claim reads them')).sort()).toEqual([
    'admits the rest',
    'claim reads them',
  ]);
  for (const s of deferred) {
    expect(
      s.scans.filter((scan) => scan !== 'ModifyTable on runs'),
      s.query,
    ).toEqual(['Index Scan on runs using runs_pkey']);
  }
}

/** The first column of each index on the hot tables (none for an index whose first key is an expression). */
async function leadingColumns(target: TestDatabase): Promise<Map<string, string>> {
  const { rows } = await target.pool.query<{ index: string; column: string | null }>(
    `select c.relname as index, a.attname as column
       from pg_index i join pg_class c on c.oid = i.indexrelid
       left join pg_attribute a on a.attrelid = i.indrelid and a.attnum = i.indkey[0]
      where i.indrelid = any(array[${HOT_TABLES.map((t) => `'runledger.${t}'::regclass`).join(', ')}])`,
  );
  return new Map(rows.flatMap((r) => (r.column ? [[r.index, r.column] as [string, string]] : [])));
}

/**
 * The index scans of hot tables whose Index Cond does not name the index's first column. A
 * btree serves a condition on a later column only by reading every entry: on the table the
 * statistics call empty that costs what the primary key does, on the real one it is a
 * sequential scan by another name.
 */
function indexWalks(node: PlanNode, leading: Map<string, string>, found: string[] = []): string[] {
  const column = node['Index Name'] ? leading.get(node['Index Name']) : undefined;
  if (column && node['Index Cond'] && !new RegExp(`\\b${column}\\b`).test(node['Index Cond'])) {
    found.push(`${node['Node Type']} using ${node['Index Name']}: ${node['Index Cond']}`);
  }
  for (const child of node.Plans ?? []) indexWalks(child, leading, found);
  return found;
}

/** The Sort nodes of a plan. */
function sorts(node: PlanNode, found: string[] = []): string[] {
  if (node['Node Type'] === 'Sort') found.push('Sort');
  for (const child of node.Plans ?? []) sorts(child, found);
  return found;
}

function hotScans(node: PlanNode, found: string[] = []): string[] {
  if (HOT_TABLES.includes(node['Relation Name'] ?? '')) {
    found.push(`${node['Node Type']} on ${node['Relation Name']}${node['Index Name'] ? ` using ${node['Index Name']}` : ''}`);
  } else if (node['Node Type'] === 'Bitmap Index Scan' && HOT_TABLES.some((t) => node['Index Name']?.startsWith(`${t}_`))) {
    found.push(`Bitmap Index Scan using ${node['Index Name']}`);
  }
  for (const child of node.Plans ?? []) hotScans(child, found);
  return found;
}

/**
 * Warms a worker on the (empty, analysed) database, loads history behind the statistics'
 * back, then records every plan auto_explain reports while the hot paths run again.
 */
async function staleStatisticsScenario(target: TestDatabase): Promise<ScenarioFindings> {
  // Every cached plan generic from its first execution, as PL/pgSQL may choose after
  // five: which session reaches five executions of which statement depends on timing,
  // so without this the scenario would test luck. New sessions of the engine get it.
  const database = new URL(target.url).pathname.slice(1);
  await target.pool.query(`alter database "${database}" set plan_cache_mode = force_generic_plan`);
  return recordPlans(target, async (engine, flows, record, explained) => {
    // Warm-up on an almost empty database: every statement runs more than five times per session.
    await exercise(engine, flows, target, 30);

    // History arrives while the worker runs: finished runs with their steps and events, and waiting runs.
    await insertFinishedRuns(target, 'plan-three', 'plans', 50_000);
    await target.pool.query(`
        insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
        select 'hist-' || g, s, 'step-' || s, 'step', 'SUCCEEDED', '1', 1, now(), now(), 1
          from generate_series(1, 50000) g, generate_series(0, 2) s`);
    await target.pool.query(`
        insert into runledger.events (run_id, kind, detail)
        select 'hist-' || g, k, '{}' from generate_series(1, 50000) g, unnest(array['created', 'claimed', 'completed']) k`);
    await target.pool.query(`
        insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, result, compensable)
        select 'hist-op-' || g, 'hist-' || g, 2, 'step-2', 'hist-key-' || g, 'SUCCEEDED', '1', false
          from generate_series(1, 50000) g`);
    await insertWaitingRuns(target, 'plan-signal', 'plans', 5_000);
    const stats = await target.pool.query(`select reltuples from pg_class where oid = 'runledger.runs'::regclass`);
    expect(Number(stats.rows[0].reltuples)).toBe(0); // the statistics still describe the empty table

    await record(async () => {
      await exercise(engine, flows, target, 20);
      await deferredAdmissionRound(explained, target);
    });
  });
}

/**
 * A new database as an install leaves it: migrated, never analysed (autovacuum off on the
 * hot tables, so none happens meanwhile), plans custom as PL/pgSQL makes them first. The
 * hot paths run under auto_explain from the first statement.
 */
async function newDatabaseScenario(target: TestDatabase): Promise<ScenarioFindings> {
  for (const table of HOT_TABLES) await target.pool.query(`alter table runledger.${table} set (autovacuum_enabled = false)`);
  const stats = await target.pool.query(`select reltuples from pg_class where oid = 'runledger.runs'::regclass`);
  expect(Number(stats.rows[0].reltuples)).toBe(-1); // never analysed
  return recordPlans(
    target,
    (engine, flows, record, explained) =>
      record(async () => {
        await exercise(engine, flows, target, 10);
        await deferredAdmissionRound(explained, target);
        // Bursts of one-step runs: their completions reach the group commit together, several per batch.
        for (let burst = 0; burst < 5; burst++) {
          const handles = await engine.startMany(
            flows.oneStep,
            Array.from({ length: 64 }, () => undefined),
          );
          await Promise.all(handles.map((h) => h.result({ timeoutMs: 20_000 })));
        }
      }),
    16,
  );
}

/**
 * One admission round deferred to a claim, as a group commit with a claim runs it
 * (_commit_and_claim): the round chooses three runs of a queue with limits, the claim
 * takes one of them (its p_deferred) from PENDING straight to RUNNING, and _admit_deferred
 * admits the other two. Driven here rather than left to the worker, whose group commits defer a round only
 * when a completion frees a slot while runs wait: whether that happens while the plans are
 * recorded depends on timing. Rolled back, so the worker never meets these runs.
 */
async function deferredAdmissionRound(explained: pg.Pool, target: TestDatabase): Promise<void> {
  const wasRecording = recording;
  const queue = 'plans-deferred';
  await target.pool.query(`select runledger.set_queue($1, '{"concurrency": 3}')`, [queue]);
  const client = await explained.connect();
  try {
    await client.query('begin');
    // The runs to admit, inserted in the same transaction: the worker's sweeper
    // (_admit_all) never sees them, so nothing admits them before the round below. The
    // insert is the test's: its plan is not recorded. (Inside a transaction block
    // auto_explain reports a statement when its portal closes, with the next statement.)
    recording = false;
    await client.query(
      `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input)
       select 'deferred-' || g, 'plan-deferred', '1', $1, 'PENDING', '{}' from generate_series(1, 6) g`,
      [queue],
    );
    recording = wasRecording;
    const chosen = await client.query<{ deferred: unknown[] }>(`select runledger._admit_queues(array[$1], true) as deferred`, [queue]);
    const deferred = chosen.rows[0]!.deferred;
    expect(deferred).toHaveLength(3);
    const claimed = await client.query(
      `select run_id from runledger._claim_batch('plans-deferred-claimer', array[$1], array['plan-deferred@1'], 1, 60000,
                                                 p_deferred => $2::jsonb)
        where run_id is not null`,
      [queue, JSON.stringify(deferred)],
    );
    expect(claimed.rows).toHaveLength(1);
    await client.query(`select runledger._admit_deferred($1::jsonb)`, [JSON.stringify(deferred)]);
    // The check is the test's too: recording resumes after the rollback.
    recording = false;
    const states = await client.query<{ status: string; admitted: boolean; n: number }>(
      `select status, admitted, count(*)::int as n from runledger.runs where queue_name = $1 group by 1, 2 order by 1, 2`,
      [queue],
    );
    expect(states.rows).toEqual([
      { status: 'PENDING', admitted: false, n: 3 },
      { status: 'PENDING', admitted: true, n: 2 },
      { status: 'RUNNING', admitted: false, n: 1 },
    ]);
  } finally {
    await client.query('rollback');
    client.release();
    recording = wasRecording;
  }
}

/**
 * Runs `scenario` with an engine whose sessions report every plan through auto_explain, a
 * worker on the plans queue, and `record`, which keeps the plans of what it runs.
 */
async function recordPlans(
  target: TestDatabase,
  scenario: (
    engine: Engine,
    flows: ReturnType<typeof defineWorkflows>,
    record: (work: () => Promise<void>) => Promise<void>,
    explained: pg.Pool,
  ) => Promise<void>,
  concurrency = 4,
): Promise<ScenarioFindings> {
  seen.length = 0;
  const explained = new pg.Pool({ connectionString: target.url, options: AUTO_EXPLAIN, Client: ExplainedClient, max: concurrency + 2 });
  const engine = createEngine({ pool: explained, log: () => {} });
  try {
    const flows = defineWorkflows(engine);
    await engine.setQueue('plans-limited', { concurrency: 3, perKeyConcurrency: 1 });
    const worker = await engine.runWorker({ queues: ['plans', 'plans-limited'], concurrency, pollIntervalMs: 200 });
    await scenario(
      engine,
      flows,
      async (work) => {
        recording = true;
        try {
          await work();
        } finally {
          recording = false;
        }
      },
      explained,
    );
    await worker.stop();

    const leading = await leadingColumns(target);
    const normalized = seen
      .filter((p) => p.Plan)
      .map((p) => ({ query: p['Query Text'].replace(/\s+/g, ' ').trim().slice(0, 300), plan: p.Plan }));
    // Each distinct statement with the scans of every plan it ran with (a custom plan may differ per execution).
    const byQuery = (scans: (plan: PlanNode) => string[]) => {
      const grouped = new Map<string, Set<string>>();
      for (const p of normalized) {
        const set = grouped.get(p.query) ?? new Set<string>();
        for (const scan of scans(p.plan)) set.add(scan);
        grouped.set(p.query, set);
      }
      return [...grouped].map(([query, set]) => ({ query, scans: [...set] }));
    };
    const statements = byQuery((plan) => hotScans(plan));
    return {
      queries: new Set(normalized.map((p) => p.query)),
      plpgsqlPlans: normalized.filter((p) => !/^select runledger\./i.test(p.query)).length,
      seqScans: statements
        .map((s) => ({ query: s.query, scans: s.scans.filter((scan) => scan.startsWith('Seq Scan')) }))
        .filter((s) => s.scans.length > 0),
      statements: statements.filter((s) => s.scans.length > 0),
      walks: byQuery((plan) => indexWalks(plan, leading)).filter((s) => s.scans.length > 0),
      claims: byQuery((plan) => [...hotScans(plan), ...sorts(plan)]).filter((s) => READY_CLAIM.test(s.query)),
    };
  } finally {
    recording = false;
    await engine.close();
  }
}

/** With PLANS_REPORT=<file>, the statements and their scans are appended there (the evidence in bench/results). */
async function report(title: string, found: ScenarioFindings): Promise<void> {
  const file = process.env.PLANS_REPORT;
  if (!file) return;
  const { appendFileSync } = await import('node:fs');
  const lines = [`## ${title}`, '', '| statement (start) | scans of runs, steps, events, operations |', '| --- | --- |'];
  for (const s of found.statements) lines.push(`| \`${s.query.slice(0, 140).replace(/\|/g, '\\|')}\` | ${s.scans.join('; ')} |`);
  appendFileSync(file, `${lines.join('\n')}\n\n`);
}
