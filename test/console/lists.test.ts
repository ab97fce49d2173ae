/**
 * The console's run lists on a table with history and statistics that lag: each page with a
 * status or workflow filter is a merge of (status, workflow) ranges of runs_console
 * (sql/0011_views.sql). This file checks, on 30,000 runs of six workflows inserted after
 * the table was analysed empty, that every page and count equals the plain query it stands
 * for (the same filters, `order by run_id`), page after page in both directions, and that
 * no plan reads runs by sequential scan.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type pg from 'pg';
import { RUN_STATES } from '../../src/engine/core/states.js';
import { COUNT_CAP, listRuns, statusCounts, type RunFilters } from '../../src/console/queries.js';
import { createTestDatabase, type TestDatabase } from '../helpers/database.js';

let target: TestDatabase;

interface PlanNode {
  'Node Type': string;
  'Relation Name'?: string;
  'Index Name'?: string;
  Plans?: PlanNode[];
}

/** The scans of runledger.runs in a plan: node type and index. */
function runsScans(node: PlanNode, found: string[] = []): string[] {
  if (node['Relation Name'] === 'runs') found.push(`${node['Node Type']}${node['Index Name'] ? ` using ${node['Index Name']}` : ''}`);
  else if (node['Node Type'] === 'Bitmap Index Scan' && node['Index Name']?.startsWith('runs_'))
    found.push(`Bitmap Index Scan using ${node['Index Name']}`);
  for (const child of node.Plans ?? []) runsScans(child, found);
  return found;
}

/** A pool that runs each statement and keeps it with its parameters, to explain it afterwards. */
function recordingPool(pool: pg.Pool, into: Array<{ sql: string; params: unknown[] }>): pg.Pool {
  return {
    query: (sql: string, params: unknown[] = []) => {
      into.push({ sql, params });
      return pool.query(sql, params);
    },
  } as unknown as pg.Pool;
}

beforeAll(async () => {
  target = await createTestDatabase();
  // Statistics taken while runs was empty; autovacuum off so nothing refreshes them.
  await target.pool.query('alter table runledger.runs set (autovacuum_enabled = false)');
  await target.pool.query('analyze runledger.runs');
  // Ids sort like ULIDs (a fixed prefix, then the row number): a higher number is a newer run.
  // Six workflows, one of them ('wf-rare') with a few runs in two statuses only.
  await target.pool.query(`
    insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, concurrency_key, status, input,
                                wait_kind, wait_key, finished_at, termination_reason, started_at, fencing_token)
    select '01KC' || lpad(g::text, 22, '0'), case when g % 997 = 0 then 'wf-rare' else 'wf-' || (g % 5) end, '1',
           'q-' || (g % 3), 'k-' || (g % 7), st, '{}',
           case when st = 'WAITING' then 'signal' end, case when st = 'WAITING' then 'go' end,
           case when st in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'DEAD_LETTER') then now() end,
           case st when 'SUCCEEDED' then 'COMPLETED' when 'FAILED' then 'FAILED' when 'CANCELLED' then 'CANCELLED'
                   when 'DEAD_LETTER' then 'MAX_RECOVERY_ATTEMPTS' end,
           case when st <> 'PENDING' then now() end, 1
      from (select g, (case when g % 997 = 0 then (case when g % 2 = 0 then 'FAILED' else 'PENDING' end)
                            when g % 100 < 80 then 'SUCCEEDED' when g % 100 < 88 then 'FAILED'
                            when g % 100 < 94 then 'PENDING' when g % 100 < 98 then 'WAITING'
                            else 'DEAD_LETTER' end)::runledger.run_status as st
              from generate_series(1, 30000) g) s`);
}, 120_000);
afterAll(async () => {
  await target?.drop();
});

/** What a page must hold: the same filters as plain conditions, ordered by run_id. */
async function expected(filters: RunFilters, cursor: { before?: string; after?: string }, limit: number): Promise<string[]> {
  const conditions: string[] = [];
  const params: unknown[] = [];
  const add = (sql: string, value: unknown) => {
    params.push(value);
    conditions.push(sql.replace('?', `$${params.length}`));
  };
  if (filters.status.length > 0) add('status::text = any(?)', filters.status);
  if (filters.workflow) add('workflow_name = ?', filters.workflow);
  if (filters.queue) add('queue_name = ?', filters.queue);
  if (filters.concurrencyKey) add('concurrency_key = ?', filters.concurrencyKey);
  if (cursor.before) add('run_id < ?', cursor.before);
  if (cursor.after) add('run_id > ?', cursor.after);
  const ascending = cursor.after !== undefined;
  const result = await target.pool.query<{ run_id: string }>(
    `select run_id from runledger.runs ${conditions.length ? `where ${conditions.join(' and ')}` : ''}
      order by run_id ${ascending ? 'asc' : 'desc'} limit ${limit}`,
    params,
  );
  const ids = result.rows.map((r) => r.run_id);
  return ascending ? ids.reverse() : ids;
}

const FILTERS: Array<[string, RunFilters]> = [
  ['one status', { status: ['FAILED'] }],
  ['two statuses', { status: ['PENDING', 'WAITING'] }],
  ['a rare status', { status: ['DEAD_LETTER'] }],
  ['a workflow', { status: [], workflow: 'wf-3' }],
  ['a rare workflow', { status: [], workflow: 'wf-rare' }],
  ['a workflow and a status', { status: ['FAILED'], workflow: 'wf-2' }],
  ['a status and a queue', { status: ['PENDING'], queue: 'q-1' }],
  ['a workflow and a key', { status: [], workflow: 'wf-1', concurrencyKey: 'k-4' }],
  ['a workflow with no runs', { status: [], workflow: 'wf-none' }],
];

describe('the console run list on 30,000 runs with statistics taken on an empty table', () => {
  it.each(FILTERS)('%s: every page, older then newer, is the plain query’s', async (_, filters) => {
    const limit = 50;
    let before: string | undefined;
    const older: string[][] = [];
    // Four pages back, then forward again from the last one.
    for (let page = 0; page < 4; page++) {
      const got = await listRuns(target.pool, filters, before ? { before } : {}, limit);
      const want = await expected(filters, before ? { before } : {}, limit + 1);
      expect(got.rows.map((r) => r.run_id)).toEqual(want.slice(0, limit));
      expect(got.older).toBe(want.length > limit);
      older.push(got.rows.map((r) => r.run_id));
      if (!got.older || got.rows.length === 0) break;
      before = got.rows.at(-1)!.run_id;
    }
    for (let page = older.length - 1; page > 0; page--) {
      const after = older[page]![0]!;
      const got = await listRuns(target.pool, filters, { after }, limit);
      expect(got.rows.map((r) => r.run_id)).toEqual(older[page - 1]);
    }
  });

  it.each(FILTERS)('%s: the counts per status are the plain count’s', async (_, filters) => {
    const counts = await statusCounts(target.pool, filters);
    // Without a filter but the status, each count stops past COUNT_CAP ("10,000+").
    const capped = !filters.workflow && !filters.queue && !filters.concurrencyKey;
    const plain = new Map<string, number>();
    for (const status of RUN_STATES) {
      const n = (await expected({ ...filters, status: [status] }, {}, 100_000)).length;
      if (n > 0) plain.set(status, capped ? Math.min(n, COUNT_CAP + 1) : n);
    }
    expect(Object.fromEntries(counts)).toEqual(Object.fromEntries(plain));
  });

  it('reads runs through runs_console for a status or workflow filter, never by sequential scan', async () => {
    const statements: Array<{ sql: string; params: unknown[] }> = [];
    const pool = recordingPool(target.pool, statements);
    for (const [, filters] of FILTERS) {
      await listRuns(pool, filters, {});
      await listRuns(pool, filters, { before: '01KC' + '15000'.padStart(22, '0') });
      await statusCounts(pool, filters);
    }
    await statusCounts(pool, { status: [] });
    // The statements with a status or a workflow condition (a queue or key alone is a pass over
    // the runs that match, by design: docs/console.md).
    const filtered = statements.filter(({ sql }) => /workflow_name = |status = s\.status/.test(sql));
    expect(filtered.length).toBeGreaterThanOrEqual(FILTERS.length * 2);
    for (const { sql, params } of filtered) {
      const explained = await target.pool.query(`explain (format json) ${sql}`, params);
      const scans = runsScans(explained.rows[0]['QUERY PLAN'][0].Plan as PlanNode);
      expect(scans.length, sql).toBeGreaterThan(0);
      expect(
        scans.filter((scan) => scan.startsWith('Seq Scan')),
        `${sql}\n${scans.join('; ')}`,
      ).toEqual([]);
      expect(scans.join('; '), sql).toContain('runs_console');
    }
  });
});
