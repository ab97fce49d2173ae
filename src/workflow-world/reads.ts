/**
 * The World's reads (Storage.runs, steps, hooks and events.get/list): keyset pages over
 * runledger's wf_* tables, newest first for runs and steps and oldest first for events and hooks
 * unless asked otherwise, as the SDK's reference worlds page.
 */
import { HookNotFoundError, WorkflowRunNotFoundError, WorkflowWorldError } from '@workflow/errors';
import type {
  Event,
  GetEventParams,
  GetHookParams,
  GetStepParams,
  GetWorkflowRunParams,
  Hook,
  ListEventsByCorrelationIdParams,
  ListEventsParams,
  ListHooksParams,
  ListWorkflowRunStepsParams,
  ListWorkflowRunsParams,
  PaginatedResponse,
  PaginationOptions,
  Storage,
} from '@workflow/world';
import type pg from 'pg';
import {
  EVENT_COLUMNS,
  HOOK_COLUMNS,
  RUN_COLUMNS,
  STEP_COLUMNS,
  hookData,
  runData,
  stepData,
  toEvent,
  toHook,
  toRun,
  toStep,
} from './rows.js';
import { invalid, storable } from './invalid.js';

type Queryable = Pick<pg.Pool, 'query'>;

/** The most rows one page returns, whatever the caller asks (the SDK documents 1000). */
const MAX_PAGE = 1000;

interface Page<T> {
  sql: string;
  params: unknown[];
  map: (row: Record<string, unknown>) => T;
  key: (item: T) => string;
  limit: number;
}

function pageLimit(pagination: PaginationOptions | undefined, fallback: number): number {
  const asked = pagination?.limit ?? fallback;
  if (!Number.isInteger(asked) || asked < 1) throw invalid(`pagination.limit must be a whole number >= 1, got ${String(asked)}`);
  return Math.min(asked, MAX_PAGE);
}

/** Runs a keyset page query that asks for limit + 1 rows: the extra one says whether there are more. */
async function page<T>(db: Queryable, spec: Page<T>): Promise<PaginatedResponse<T>> {
  storable('a filter or cursor', spec.params);
  const { rows } = await db.query(spec.sql, [...spec.params, spec.limit + 1]);
  const data = rows.slice(0, spec.limit).map(spec.map);
  const last = data.at(-1);
  return { data, cursor: last === undefined ? null : spec.key(last), hasMore: rows.length > spec.limit };
}

/** `and <column> > $n` (ascending) or `<` (descending) when there is a cursor. */
function after(column: string, order: 'asc' | 'desc', cursor: string | undefined, params: unknown[]): string {
  if (cursor === undefined || cursor === '') return '';
  params.push(cursor);
  return ` and ${column} ${order === 'asc' ? '>' : '<'} $${params.length}`;
}

export function createRunReads(db: Queryable): Storage['runs'] {
  return {
    async get(id: string, params?: GetWorkflowRunParams) {
      storable('runId', id);
      const { rows } = await db.query(`select ${RUN_COLUMNS} from runledger.wf_runs where run_id = $1`, [id]);
      if (rows.length === 0) throw new WorkflowRunNotFoundError(id);
      return runData(toRun(rows[0]), params?.resolveData);
    },
    async list(params?: ListWorkflowRunsParams) {
      const values: unknown[] = [];
      let where = 'true';
      if (params?.workflowName !== undefined) {
        values.push(params.workflowName);
        where += ` and workflow_name = $${values.length}`;
      }
      if (params?.status !== undefined) {
        values.push(params.status);
        where += ` and status = $${values.length}`;
      }
      const order = params?.pagination?.sortOrder ?? 'desc';
      where += after('run_id', order, params?.pagination?.cursor, values);
      return page(db, {
        sql: `select ${RUN_COLUMNS} from runledger.wf_runs where ${where} order by run_id ${order} limit $${values.length + 1}`,
        params: values,
        map: (row) => runData(toRun(row), params?.resolveData),
        key: (run) => run.runId,
        limit: pageLimit(params?.pagination, 20),
      });
    },
  } as Storage['runs'];
}

export function createStepReads(db: Queryable): Storage['steps'] {
  return {
    async get(runId: string, stepId: string, params?: GetStepParams) {
      storable('runId', runId);
      storable('stepId', stepId);
      const { rows } = await db.query(`select ${STEP_COLUMNS} from runledger.wf_steps where run_id = $1 and step_id = $2`, [runId, stepId]);
      if (rows.length === 0) throw new WorkflowWorldError(`Step not found: ${stepId}`, { status: 404 });
      return stepData(toStep(rows[0]), params?.resolveData);
    },
    async list(params: ListWorkflowRunStepsParams) {
      const values: unknown[] = [params.runId];
      const order = params.pagination?.sortOrder ?? 'desc';
      const where = `run_id = $1${after('step_id', order, params.pagination?.cursor, values)}`;
      return page(db, {
        sql: `select ${STEP_COLUMNS} from runledger.wf_steps where ${where} order by step_id ${order} limit $${values.length + 1}`,
        params: values,
        map: (row) => stepData(toStep(row), params.resolveData),
        key: (step) => step.stepId,
        limit: pageLimit(params.pagination, 20),
      });
    },
  } as Storage['steps'];
}

export function createHookReads(db: Queryable): Storage['hooks'] {
  const one = async (column: 'hook_id' | 'token', value: string, params?: GetHookParams): Promise<Hook> => {
    storable(column === 'token' ? 'token' : 'hookId', value);
    const { rows } = await db.query(`select ${HOOK_COLUMNS} from runledger.wf_hooks where ${column} = $1`, [value]);
    if (rows.length === 0) throw new HookNotFoundError(value);
    return hookData(toHook(rows[0]), params?.resolveData);
  };
  return {
    get: (hookId, params) => one('hook_id', hookId, params),
    getByToken: (token, params) => one('token', token, params),
    async list(params: ListHooksParams) {
      const values: unknown[] = [];
      let where = 'true';
      if (params.runId !== undefined) {
        values.push(params.runId);
        where += ` and run_id = $${values.length}`;
      }
      const order = params.pagination?.sortOrder ?? 'asc';
      where += after('hook_id', order, params.pagination?.cursor, values);
      return page(db, {
        sql: `select ${HOOK_COLUMNS} from runledger.wf_hooks where ${where} order by hook_id ${order} limit $${values.length + 1}`,
        params: values,
        map: (row) => hookData(toHook(row), params.resolveData),
        key: (hook) => hook.hookId,
        limit: pageLimit(params.pagination, 100),
      });
    },
  };
}

/** events.get, list and listByCorrelationId; events.create is in events.ts. */
export function createEventReads(db: Queryable): Pick<Storage['events'], 'get' | 'list' | 'listByCorrelationId'> {
  const byKey = (column: 'run_id' | 'correlation_id', value: string, params: ListEventsParams | ListEventsByCorrelationIdParams) => {
    const values: unknown[] = [value];
    const order = params.pagination?.sortOrder ?? 'asc';
    const where = `${column} = $1${after('event_id', order, params.pagination?.cursor, values)}`;
    return page<Event>(db, {
      sql: `select ${EVENT_COLUMNS} from runledger.wf_events where ${where} order by event_id ${order} limit $${values.length + 1}`,
      params: values,
      map: (row) => toEvent(row, params.resolveData),
      key: (event) => event.eventId,
      limit: pageLimit(params.pagination, 100),
    });
  };
  return {
    async get(runId: string, eventId: string, params?: GetEventParams) {
      storable('runId', runId);
      storable('eventId', eventId);
      const { rows } = await db.query(`select ${EVENT_COLUMNS} from runledger.wf_events where run_id = $1 and event_id = $2`, [
        runId,
        eventId,
      ]);
      if (rows.length === 0) throw new WorkflowWorldError(`Event not found: ${eventId}`, { status: 404 });
      return toEvent(rows[0], params?.resolveData);
    },
    list: (params) => byKey('run_id', params.runId, params),
    listByCorrelationId: (params) => byKey('correlation_id', params.correlationId, params),
  };
}
