/**
 * What the console reads: the views and tables psql users read (sql/0011_views.sql), and
 * the queries the CLI shares (src/engine/client/reads.ts). Every list is bounded.
 */
import type pg from 'pg';
import { RUN_STATES } from '../engine/core/states.js';
import { QUEUE_KEYS_SQL, QUEUE_TOTALS_SQL, WORKER_STATE_SQL, runDocument, type QueueRow } from '../engine/client/reads.js';

export type { QueueRow };

export { runDocument };

export const PAGE_SIZE = 50;
export const MAX_PAGE_SIZE = 500;

export interface RunFilters {
  status: string[];
  workflow?: string;
  queue?: string;
  concurrencyKey?: string;
  /** The start of a run id (any case), or a whole one; with searchInside, any part of one. */
  search?: string;
  /** Look for `search` anywhere in the ids (a scan of every id: the console does it only when no id starts with it). */
  searchInside?: boolean;
}

export interface RunListRow {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  status: string;
  termination_reason: string | null;
  wait_kind: string | null;
  queue_name: string;
  concurrency_key: string | null;
  parent_run_id: string | null;
  created_at: Date;
  finished_at: Date | null;
}

/**
 * The conditions of the filters other than status and workflow (queue, concurrency key, run
 * id), with only those given, so each plan can use its index.
 */
function otherFilters(filters: RunFilters, params: unknown[]): string[] {
  const parts: string[] = [];
  const add = (sql: (p: string) => string, value: unknown) => {
    params.push(value);
    parts.push(sql(`$${params.length}`));
  };
  if (filters.queue) add((p) => `queue_name = ${p}`, filters.queue);
  if (filters.concurrencyKey) add((p) => `concurrency_key = ${p}`, filters.concurrencyKey);
  if (filters.search) {
    const search = filters.search.trim();
    // A whole id and the start of one go by the primary key (a range of it); a part inside ids scans them.
    const upper = search.toUpperCase();
    if (/^[0-9A-Z]{26}$/.test(upper)) add((p) => `run_id = ${p}`, upper);
    else if (filters.searchInside) add((p) => `strpos(upper(run_id), ${p}) > 0`, upper);
    else {
      // [prefix, prefix + '\u{10FFFF}') holds the ids that start with it; left() keeps the answer exact in any collation.
      add((p) => `run_id >= ${p}`, upper);
      add((p) => `run_id < ${p}`, `${upper}\u{10FFFF}`);
      add((p) => `left(upper(run_id), ${search.length}) = ${p}`, upper);
    }
  }
  return parts;
}

/** The statuses the filter names (unknown names dropped). */
const statusesOf = (filters: RunFilters) => filters.status.filter((s) => (RUN_STATES as readonly string[]).includes(s));

const LIST_COLUMNS = `run_id, workflow_name, workflow_version, status, termination_reason, wait_kind, queue_name, concurrency_key,
            parent_run_id, created_at, finished_at`;

/**
 * The workflows that have runs in status `s.status`, found in runs_console itself: the first
 * name, then the next one after it, one probe each (a loose index scan; PostgreSQL has no
 * skip scan). Runs of a workflow no longer registered are listed too.
 */
const WORKFLOWS_IN_STATUS = `
  with recursive w(name) as (
    (select r.workflow_name from runledger.runs r
      where r.status = s.status and r.created_at > '-infinity' order by r.workflow_name limit 1)
    union all
    select (select r.workflow_name from runledger.runs r
             where r.status = s.status and r.workflow_name > w.name and r.created_at > '-infinity'
             order by r.workflow_name limit 1)
      from w where w.name is not null)
  select w.name from w where w.name is not null`;

/**
 * One page of runs, newest first (run ids are ULIDs), by keyset: `before` (older than that
 * run id) or `after` (newer than it, read in ascending order and turned around). Never OFFSET:
 * the millionth run's page costs what the first one does. One more row than the page tells
 * whether an older page exists.
 *
 * Without a status or workflow filter the page is a range of the primary key. With one, it
 * is the first rows of a merge: each (status, workflow) pair the filters allow is a range of
 * runs_console (sql/0011_views.sql) already in run_id order, read up to a page each.
 */
export async function listRuns(
  pool: pg.Pool,
  filters: RunFilters,
  cursor: { before?: string; after?: string },
  limit = PAGE_SIZE,
): Promise<{ rows: RunListRow[]; older: boolean; newer: boolean }> {
  const params: unknown[] = [];
  const parts = otherFilters(filters, params);
  const ascending = cursor.after !== undefined && cursor.before === undefined;
  if (cursor.before !== undefined) {
    params.push(cursor.before);
    parts.push(`run_id < $${params.length}`);
  } else if (cursor.after !== undefined) {
    params.push(cursor.after);
    parts.push(`run_id > $${params.length}`);
  }
  const order = ascending ? 'asc' : 'desc';
  const statuses = statusesOf(filters);
  let sql: string;
  if (statuses.length === 0 && !filters.workflow) {
    params.push(limit + 1);
    sql = `select ${LIST_COLUMNS} from runledger.runs ${parts.length > 0 ? `where ${parts.join(' and ')}` : ''}
            order by run_id ${order} limit $${params.length}`;
  } else {
    params.push(statuses.length > 0 ? statuses : RUN_STATES);
    const statusParam = `$${params.length}`;
    let workflows = WORKFLOWS_IN_STATUS;
    if (filters.workflow) {
      params.push(filters.workflow);
      workflows = `select $${params.length}::text`;
    }
    params.push(limit + 1);
    const limitParam = `$${params.length}`;
    const inner = ['status = s.status', 'workflow_name = w.name', `created_at > '-infinity'`, ...parts];
    sql = `select p.* from unnest(${statusParam}::runledger.run_status[]) s(status)
             cross join lateral (${workflows}) w(name)
             cross join lateral (select ${LIST_COLUMNS} from runledger.runs where ${inner.join(' and ')}
                                  order by run_id ${order} limit ${limitParam}) p
            order by p.run_id ${order} limit ${limitParam}`;
  }
  const result = await pool.query<RunListRow>(sql, params);
  const more = result.rows.length > limit;
  const rows = result.rows.slice(0, limit);
  if (ascending) rows.reverse();
  return {
    rows,
    older: ascending ? true : more,
    newer: ascending ? more : cursor.before !== undefined,
  };
}

/** How far the counts per status count: past it a status shows "10,000+", so a page costs the same at a million runs as at ten thousand. */
export const COUNT_CAP = 10_000;

/**
 * Runs per status under the same filters but the status itself (so the counts say what each
 * status link would list).
 *
 * Without another filter, each status is counted up to COUNT_CAP + 1 (COUNT_CAP + 1 reads
 * "more than COUNT_CAP"): an index-only range of runs_console (sql/0011_views.sql) per
 * status that stops at the cap, so the cost does not grow with the table. An exact count of
 * every status read the whole index: about 100 ms at 1,000,000 runs, and growing.
 *
 * With a filter, the counts are exact. A workflow's are a range of runs_console per status
 * (the other filters checked on the rows in it). Without a workflow (queue, key, id), one
 * pass over the runs that match: a cap per status would have to scan every run of a rare
 * status to find too few that match, which measured slower (docs/console.md has both at
 * 1,000,000 runs).
 */
export async function statusCounts(pool: pg.Pool, filters: RunFilters): Promise<Map<string, number>> {
  const params: unknown[] = [];
  const parts = otherFilters(filters, params);
  let sql: string;
  if (filters.workflow) {
    params.push(filters.workflow);
    const inner = ['r.status = s.status', `r.workflow_name = $${params.length}`, `r.created_at > '-infinity'`, ...parts];
    sql = `select s.status::text as status, (select count(*)::int from runledger.runs r where ${inner.join(' and ')}) as n
             from unnest(enum_range(null::runledger.run_status)) s(status)`;
  } else if (parts.length > 0) {
    sql = `select status::text as status, count(*)::int as n from runledger.runs where ${parts.join(' and ')} group by status`;
  } else {
    params.push(COUNT_CAP + 1);
    sql = `select s.status::text as status,
                  (select count(*)::int from (select 1 from runledger.runs r
                                               where r.status = s.status and r.created_at > '-infinity' limit $1) x) as n
             from unnest(enum_range(null::runledger.run_status)) s(status)`;
  }
  const result = await pool.query<{ status: string; n: number }>(sql, params);
  return new Map(result.rows.filter((r) => r.n > 0).map((r) => [r.status, r.n]));
}

/** The planner's estimate of the runs in the table (pg_class.reltuples), for the list's "about N runs". */
export async function estimatedRuns(pool: pg.Pool): Promise<number> {
  const result = await pool.query<{ n: number }>(
    "select greatest(reltuples, 0)::float8 as n from pg_class where oid = 'runledger.runs'::regclass",
  );
  return Math.round(result.rows[0]?.n ?? 0);
}

export interface StreamRow {
  topic: string;
  chunks: number;
  next_offset: number;
  closed: boolean;
  tail: Array<{ offset: number; chunk: unknown }>;
}

/** The run's durable streams, each with its last chunks (the page follows new ones live). */
export async function runStreams(pool: pg.Pool, runId: string, tail = 50): Promise<StreamRow[]> {
  const streams = await pool.query<{ topic: string; chunks: string; next_offset: string; closed: boolean }>(
    'select topic, chunks, next_offset, closed from runledger.streams where run_id = $1 order by topic',
    [runId],
  );
  return Promise.all(
    streams.rows.map(async (s) => ({
      topic: s.topic,
      chunks: Number(s.chunks),
      next_offset: Number(s.next_offset),
      closed: s.closed,
      tail: await streamChunks(pool, runId, s.topic, Math.max(0, Number(s.next_offset) - tail)),
    })),
  );
}

/** Chunks of one stream from an offset on, at most 500 (what the live view polls). */
export async function streamChunks(
  pool: pg.Pool,
  runId: string,
  topic: string,
  fromOffset: number,
): Promise<Array<{ offset: number; chunk: unknown }>> {
  const result = await pool.query<{ offset: string; chunk: unknown }>(
    `select "offset", chunk from runledger.stream_chunks where run_id = $1 and topic = $2 and "offset" >= $3 order by "offset" limit 500`,
    [runId, topic, fromOffset],
  );
  return result.rows.map((r) => ({ offset: Number(r.offset), chunk: r.chunk }));
}

export interface SessionEntryRow {
  session_id: string;
  seq: number;
  role: string;
  content: unknown;
  step_position: number;
  created_at: Date;
}

/** The session entries this run appended (its conversation turns), at most 200. */
export async function runSessionEntries(pool: pg.Pool, runId: string): Promise<SessionEntryRow[]> {
  const result = await pool.query<SessionEntryRow>(
    `select session_id, seq, role, content, step_position, created_at from runledger.session_entries
      where run_id = $1 order by step_position, entry_index limit 200`,
    [runId],
  );
  return result.rows;
}

export interface EnvironmentRow {
  env_id: string;
  run_id: string;
  workflow_name: string;
  manifest: unknown;
  seq: number;
  attempt: number;
  created_at: Date;
  reclaimed_at: Date | null;
  reclaimed_status: string | null;
  reclaim_attempts: number;
  last_error: unknown;
  /** A worker holds its reclaim right now. */
  reclaiming: boolean;
}

const ENVIRONMENT_COLUMNS = `env_id, run_id, workflow_name, manifest, seq, attempt, created_at, reclaimed_at, reclaimed_status,
  reclaim_attempts, last_error, reclaim_owner is not null and reclaim_until > runledger.now() as reclaiming`;

/** The run's execution environments (sql/0020_environments.sql): one per attempt of its create step. */
export async function runEnvironments(pool: pg.Pool, runId: string): Promise<EnvironmentRow[]> {
  const result = await pool.query<EnvironmentRow>(
    `select ${ENVIRONMENT_COLUMNS} from runledger.environments where run_id = $1 order by created_at, env_id limit 100`,
    [runId],
  );
  return result.rows;
}

/** Environments whose reclaim failed and is not done yet: a sandbox or workspace still running, paid for. */
export async function failingReclaims(pool: pg.Pool): Promise<EnvironmentRow[]> {
  const result = await pool.query<EnvironmentRow>(
    `select ${ENVIRONMENT_COLUMNS} from runledger.environments where reclaimed_at is null and last_error is not null
      order by created_at limit 200`,
  );
  return result.rows;
}

export async function approvalInbox(pool: pg.Pool): Promise<Array<Record<string, unknown>>> {
  return (await pool.query('select * from runledger.approval_inbox order by requested_at, request_id limit 200')).rows;
}

export async function deadLetters(pool: pg.Pool): Promise<Array<Record<string, unknown>>> {
  return (await pool.query('select * from runledger.dead_letter order by terminated_at desc nulls last, run_id desc limit 200')).rows;
}

export async function unknownOperations(pool: pg.Pool): Promise<Array<Record<string, unknown>>> {
  return (await pool.query('select * from runledger.unknown_operations order by unknown_since, operation_id limit 200')).rows;
}

export async function queueRows(pool: pg.Pool): Promise<{ totals: QueueRow[]; keys: QueueRow[] }> {
  const [totals, keys] = await Promise.all([pool.query<QueueRow>(QUEUE_TOTALS_SQL), pool.query<QueueRow>(QUEUE_KEYS_SQL)]);
  return { totals: totals.rows, keys: keys.rows };
}

export interface WorkerRow {
  worker_id: string;
  state: string;
  queues: string[];
  workflows: string[];
  concurrency: number;
  heartbeat_age_s: number;
  runs_held: number;
  started_at: Date;
}

/** Workers not stopped (and those stopped in the last hour), with heartbeat age and the runs they hold a lease on. */
export async function workerRows(pool: pg.Pool): Promise<WorkerRow[]> {
  const result = await pool.query<WorkerRow>(
    `select * from (
       select w.worker_id, ${WORKER_STATE_SQL} as state, w.queues, w.workflows, w.concurrency, w.started_at,
              extract(epoch from runledger.now() - w.last_heartbeat_at)::float8 as heartbeat_age_s,
              (select count(*)::int from runledger.runs r where r.lease_owner = w.worker_id and r.lease_expires_at is not null) as runs_held,
              w.stopped_at
         from runledger.workers w
        where w.stopped_at is null or w.stopped_at > runledger.now() - interval '1 hour') w
      order by case w.state when 'live' then 0 when 'lost' then 1 else 2 end, w.heartbeat_age_s, w.worker_id
      limit 100`,
  );
  return result.rows;
}
