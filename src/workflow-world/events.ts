/**
 * events.create: the Workflow SDK's event log on runledger's wf_* tables. Each event and the
 * entity change it implies (the run's status, a step's attempt, a hook, a wait) are written in
 * one transaction that first takes the run's row lock, so the log and the entities never
 * disagree, two invocations of one run take turns, and a terminal run refuses what the SDK's
 * spec says it refuses (with the SDK's own errors, which its runtime reads: EntityConflictError
 * for a duplicate or a lost race, RunExpiredError for a run that already ended, TooEarlyError
 * for a step retried before its time).
 */
import {
  EntityConflictError,
  HookNotFoundError,
  RunExpiredError,
  RunNotSupportedError,
  TooEarlyError,
  WorkflowRunNotFoundError,
  WorkflowWorldError,
} from '@workflow/errors';
import {
  CreateEventSchema,
  applyAttributeChanges,
  isChildEntityCreationEvent,
  isHookEventRequiringExistence,
  isLegacySpecVersion,
  isTerminalRunEventType,
  isTerminalStepStatus,
  isTerminalWorkflowRunStatus,
  validateAttributeChanges,
  validateUlidTimestamp,
  type AttributeChange,
  type CreateEventParams,
  type EventResult,
  type Hook,
  type Step,
  type Wait,
  type WorkflowRun,
} from '@workflow/world';
import type pg from 'pg';
import { monotonicFactory } from 'ulid';
import { encodeValue } from './codec.js';
import { inTransaction } from './transaction.js';
import { invalid, storable } from './invalid.js';
import { WORLD_SPEC_VERSION } from './spec.js';
import { EVENT_COLUMNS, HOOK_COLUMNS, RUN_COLUMNS, STEP_COLUMNS, WAIT_COLUMNS, toEvent, toHook, toRun, toStep, toWait } from './rows.js';

/** What events.create receives: an event request, loosely typed (its shape is checked by the SDK's schemas on the way out). */
interface EventRequest {
  eventType: string;
  correlationId?: string;
  specVersion?: number;
  eventData?: Record<string, unknown>;
}

/** The run fields of run_created (and of a resilient run_started) that have columns of their own. */
const RUN_FIELDS = new Set(['deploymentId', 'workflowName', 'input', 'executionContext', 'attributes', 'allowReservedAttributes']);

type Tx = pg.PoolClient;

interface Outcome {
  run?: WorkflowRun;
  step?: Step;
  hook?: Hook;
  wait?: Wait;
  stepCreated?: boolean;
  /** The event written instead of the one asked for (hook_conflict), or none (a repeated run_started). */
  event?: { eventType: string; eventData?: unknown } | null;
  /** The event data to store, when it differs from the request's. */
  storedData?: unknown;
}

const CROCKFORD = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';

/** The ULID-shaped id right after `id` ('wevt_' and 26 Crockford base32 characters): its last character incremented, with carry. */
export function successor(id: string): string {
  const chars = id.split('');
  for (let i = chars.length - 1; i >= id.length - 26; i--) {
    const digit = CROCKFORD.indexOf(chars[i]!);
    if (digit < CROCKFORD.length - 1) {
      chars[i] = CROCKFORD[digit + 1]!;
      return chars.join('');
    }
    chars[i] = '0';
  }
  throw new WorkflowWorldError(`No event id after ${id}`);
}

function isUniqueViolation(error: unknown, constraint: string): boolean {
  const pgError = error as { code?: string; constraint?: string } | null;
  return pgError?.code === '23505' && pgError.constraint === constraint;
}

export function createEventWriter(
  pool: pg.Pool,
): (runId: string | null, data: unknown, params?: CreateEventParams) => Promise<EventResult> {
  const ulid = monotonicFactory();
  /**
   * The last event id of the run each transaction holds the lock of: a new id is after it even
   * when this process's clock is behind the one that wrote it, so a run's log, read in event_id
   * order, is in the order its events committed (writers of one run take turns on its row lock).
   */
  const lastIds = new WeakMap<Tx, string>();
  const newEventId = (tx: Tx): string => {
    const last = lastIds.get(tx);
    let id = `wevt_${ulid()}`;
    if (last !== undefined && id <= last) id = successor(last);
    lastIds.set(tx, id);
    return id;
  };

  async function runRow(tx: Tx, runId: string): Promise<WorkflowRun> {
    const { rows } = await tx.query(`select ${RUN_COLUMNS} from runledger.wf_runs where run_id = $1`, [runId]);
    if (rows.length === 0) throw new WorkflowRunNotFoundError(runId);
    return toRun(rows[0]);
  }

  async function insertEvent(
    tx: Tx,
    runId: string,
    eventId: string,
    type: string,
    correlationId: string | undefined,
    data: unknown,
    specVersion: number,
  ) {
    try {
      const { rows } = await tx.query(
        `insert into runledger.wf_events (event_id, run_id, event_type, correlation_id, event_data, spec_version)
         values ($1, $2, $3, $4, $5::json, $6) returning ${EVENT_COLUMNS}`,
        [eventId, runId, type, correlationId ?? null, encodeValue(data), specVersion],
      );
      return rows[0] as Record<string, unknown>;
    } catch (error) {
      if (isUniqueViolation(error, 'wf_events_entity_creation'))
        throw new EntityConflictError(`${type} for correlationId "${correlationId}" already exists in run "${runId}"`);
      throw error;
    }
  }

  /** Creates the run and its run_created event; false when a run of that id already exists. */
  async function createRun(tx: Tx, runId: string, eventData: Record<string, unknown>, specVersion: number): Promise<boolean> {
    const attributes = (eventData.attributes ?? {}) as Record<string, string>;
    validateAttributeChanges(
      Object.entries(attributes).map(([key, value]) => ({ key, value })),
      { allowReservedAttributes: eventData.allowReservedAttributes === true },
    );
    const extra = Object.fromEntries(Object.entries(eventData).filter(([key]) => !RUN_FIELDS.has(key)));
    const { rowCount } = await tx.query(
      `insert into runledger.wf_runs (run_id, deployment_id, workflow_name, spec_version, input, execution_context, attributes, extra)
       values ($1, $2, $3, $4, $5::json, $6::json, $7::jsonb, $8::json) on conflict (run_id) do nothing`,
      [
        runId,
        eventData.deploymentId,
        eventData.workflowName,
        specVersion,
        encodeValue(eventData.input),
        encodeValue(eventData.executionContext),
        JSON.stringify(attributes),
        Object.keys(extra).length === 0 ? null : encodeValue(extra),
      ],
    );
    if (rowCount === 0) return false;
    await insertEvent(tx, runId, newEventId(tx), 'run_created', undefined, eventData, specVersion);
    return true;
  }

  /** Ends the run (completed, failed, cancelled); its hooks and waits go, so their tokens are free again. */
  async function endRun(tx: Tx, runId: string, status: string, output: unknown, error: unknown, errorCode: unknown): Promise<WorkflowRun> {
    const { rows } = await tx.query(
      `update runledger.wf_runs set status = $2, output = coalesce($3::json, output), error = coalesce($4::json, error),
              error_code = coalesce($5, error_code), completed_at = runledger.now(), updated_at = runledger.now()
        where run_id = $1 returning ${RUN_COLUMNS}`,
      [runId, status, encodeValue(output), encodeValue(error), typeof errorCode === 'string' ? errorCode : null],
    );
    await tx.query('delete from runledger.wf_hooks where run_id = $1', [runId]);
    await tx.query('delete from runledger.wf_waits where run_id = $1', [runId]);
    return toRun(rows[0]);
  }

  async function stepRow(tx: Tx, runId: string, stepId: string): Promise<Record<string, unknown> | undefined> {
    const { rows } = await tx.query(`select ${STEP_COLUMNS} from runledger.wf_steps where run_id = $1 and step_id = $2 for update`, [
      runId,
      stepId,
    ]);
    return rows[0];
  }

  /** A step event's step, which must exist and not have ended. */
  async function liveStep(tx: Tx, runId: string, stepId: string): Promise<Record<string, unknown>> {
    const row = await stepRow(tx, runId, stepId);
    if (!row) throw new WorkflowWorldError(`Step "${stepId}" not found`, { status: 404 });
    if (isTerminalStepStatus(row.status as string))
      throw new EntityConflictError(`Cannot modify step in terminal state "${row.status as string}"`);
    return row;
  }

  async function updateStep(tx: Tx, runId: string, stepId: string, assignments: string, values: unknown[]): Promise<Step> {
    const { rows } = await tx.query(
      `update runledger.wf_steps set ${assignments}, updated_at = runledger.now() where run_id = $1 and step_id = $2 returning ${STEP_COLUMNS}`,
      [runId, stepId, ...values],
    );
    return toStep(rows[0]);
  }

  /** The entity change of one event on a run that exists and is locked; terminal-run rules are checked before. */
  async function apply(tx: Tx, runId: string, run: WorkflowRun, data: EventRequest, specVersion: number): Promise<Outcome> {
    const eventData = data.eventData ?? {};
    const correlationId = data.correlationId ?? '';
    switch (data.eventType) {
      case 'run_started': {
        // A second run_started (two invocations of one run) adds nothing: replay is deterministic.
        if (run.status === 'running') return { run, event: null };
        const { rows } = await tx.query(
          `update runledger.wf_runs set status = 'running', started_at = coalesce(started_at, runledger.now()), updated_at = runledger.now()
            where run_id = $1 returning ${RUN_COLUMNS}`,
          [runId],
        );
        return { run: toRun(rows[0]), storedData: undefined };
      }
      case 'run_completed':
        return { run: await endRun(tx, runId, 'completed', eventData.output, undefined, undefined) };
      case 'run_failed':
        return { run: await endRun(tx, runId, 'failed', undefined, eventData.error, eventData.errorCode) };
      case 'run_cancelled':
        return { run: await endRun(tx, runId, 'cancelled', undefined, undefined, undefined) };
      case 'attr_set': {
        const changes = (eventData.changes ?? []) as AttributeChange[];
        const writer = eventData.writer as { type?: string } | undefined;
        if (data.correlationId && writer?.type === 'workflow') {
          const { rowCount } = await tx.query(
            `select 1 from runledger.wf_events where run_id = $1 and correlation_id = $2 and event_type = 'attr_set'`,
            [runId, data.correlationId],
          );
          if (rowCount)
            throw new EntityConflictError(`attr_set for correlationId "${data.correlationId}" already exists in run "${runId}"`);
        }
        validateAttributeChanges(changes, {
          existingKeys: Object.keys(run.attributes ?? {}),
          allowReservedAttributes: eventData.allowReservedAttributes === true,
        });
        const attributes = applyAttributeChanges(run.attributes ?? {}, changes);
        const { rows } = await tx.query(
          `update runledger.wf_runs set attributes = $2::jsonb, updated_at = runledger.now() where run_id = $1 returning ${RUN_COLUMNS}`,
          [runId, JSON.stringify(attributes)],
        );
        return { run: toRun(rows[0]) };
      }
      case 'step_created': {
        const { rows } = await tx.query(
          `insert into runledger.wf_steps (run_id, step_id, step_name, input, spec_version) values ($1, $2, $3, $4::json, $5)
           on conflict (run_id, step_id) do nothing returning ${STEP_COLUMNS}`,
          [runId, correlationId, eventData.stepName, encodeValue(eventData.input), specVersion],
        );
        if (rows.length === 0) throw new EntityConflictError(`Step "${correlationId}" already created`);
        return { step: toStep(rows[0]) };
      }
      case 'step_started':
        return startStep(tx, runId, run, data, specVersion);
      case 'step_completed':
        await liveStep(tx, runId, correlationId);
        return {
          step: await updateStep(tx, runId, correlationId, `status = 'completed', output = $3::json, completed_at = runledger.now()`, [
            encodeValue(eventData.result),
          ]),
        };
      case 'step_failed':
        await liveStep(tx, runId, correlationId);
        return {
          step: await updateStep(tx, runId, correlationId, `status = 'failed', error = $3::json, completed_at = runledger.now()`, [
            encodeValue(eventData.error),
          ]),
        };
      case 'step_retrying': {
        const row = await liveStep(tx, runId, correlationId);
        if (isTerminalWorkflowRunStatus(run.status) && row.status !== 'running')
          throw new RunExpiredError(`Cannot modify non-running step on run in terminal state "${run.status}"`);
        const retryAfter =
          eventData.retryAfter instanceof Date || typeof eventData.retryAfter === 'string' ? new Date(eventData.retryAfter) : null;
        return {
          step: await updateStep(tx, runId, correlationId, `status = 'pending', error = $3::json, retry_after = $4`, [
            encodeValue(eventData.error),
            retryAfter,
          ]),
        };
      }
      case 'hook_created':
        return createHook(tx, runId, data, specVersion);
      case 'hook_disposed': {
        const { rowCount } = await tx.query('delete from runledger.wf_hooks where hook_id = $1', [correlationId]);
        if (rowCount === 0) throw new EntityConflictError(`Hook "${correlationId}" already disposed`);
        return {};
      }
      case 'hook_received':
        return {};
      case 'wait_created': {
        const resumeAt = eventData.resumeAt instanceof Date || typeof eventData.resumeAt === 'string' ? new Date(eventData.resumeAt) : null;
        const { rows } = await tx.query(
          `insert into runledger.wf_waits (run_id, correlation_id, resume_at, spec_version) values ($1, $2, $3, $4)
           on conflict (run_id, correlation_id) do nothing returning ${WAIT_COLUMNS}`,
          [runId, correlationId, resumeAt, specVersion],
        );
        if (rows.length === 0) throw new EntityConflictError(`Wait "${correlationId}" already exists`);
        return { wait: toWait(rows[0]) };
      }
      case 'wait_completed': {
        const { rows } = await tx.query(
          `update runledger.wf_waits set status = 'completed', completed_at = runledger.now(), updated_at = runledger.now()
            where run_id = $1 and correlation_id = $2 and status = 'waiting' returning ${WAIT_COLUMNS}`,
          [runId, correlationId],
        );
        if (rows.length > 0) return { wait: toWait(rows[0]) };
        const { rowCount } = await tx.query('select 1 from runledger.wf_waits where run_id = $1 and correlation_id = $2', [
          runId,
          correlationId,
        ]);
        if (rowCount === 0) throw new WorkflowWorldError(`Wait "${correlationId}" not found`, { status: 404 });
        throw new EntityConflictError(`Wait "${correlationId}" already completed`);
      }
      default:
        throw invalid(`unknown event type "${data.eventType}"`);
    }
  }

  /**
   * step_started: a new attempt of the step. A step_started that carries the step's name and
   * input creates the step too (lazy start): only the invocation that creates it runs it, the
   * others get EntityConflictError and skip it.
   */
  async function startStep(tx: Tx, runId: string, run: WorkflowRun, data: EventRequest, specVersion: number): Promise<Outcome> {
    const stepId = data.correlationId ?? '';
    const eventData = data.eventData ?? {};
    const lazy = isChildEntityCreationEvent(data as never);
    let row = await stepRow(tx, runId, stepId);
    let stepCreated = false;
    if (lazy) {
      if (row) throw new EntityConflictError(`Step "${stepId}" already created`);
      const { rows } = await tx.query(
        `insert into runledger.wf_steps (run_id, step_id, step_name, input, spec_version) values ($1, $2, $3, $4::json, $5)
         returning ${STEP_COLUMNS}`,
        [runId, stepId, eventData.stepName, encodeValue(eventData.input), specVersion],
      );
      row = rows[0];
      // Replay reads step_created before step_started: the lazy start writes both.
      await insertEvent(
        tx,
        runId,
        newEventId(tx),
        'step_created',
        stepId,
        { stepName: eventData.stepName, input: eventData.input },
        specVersion,
      );
      stepCreated = true;
    }
    if (!row) throw new WorkflowWorldError(`Step "${stepId}" not found`, { status: 404 });
    if (isTerminalStepStatus(row.status as string))
      throw new EntityConflictError(`Cannot modify step in terminal state "${row.status as string}"`);
    if (isTerminalWorkflowRunStatus(run.status) && row.status !== 'running')
      throw new RunExpiredError(`Cannot modify non-running step on run in terminal state "${run.status}"`);
    const retryAfter = row.retry_after as Date | null;
    if (retryAfter && retryAfter.getTime() > Date.now())
      throw new TooEarlyError(`Cannot start step "${stepId}": retryAfter timestamp has not been reached yet`, {
        retryAfter: Math.ceil((retryAfter.getTime() - Date.now()) / 1000),
      });
    const step = await updateStep(
      tx,
      runId,
      stepId,
      `status = 'running', attempt = attempt + 1, started_at = coalesce(started_at, runledger.now()), retry_after = null`,
      [],
    );
    // The step's input belongs to step_created; step_started keeps the rest (stepName, for the replay's check).
    const { input: _input, ...storedData } = eventData;
    return { step, stepCreated, storedData: data.eventData === undefined ? undefined : storedData };
  }

  /**
   * hook_created: a token names one live hook. The same hook again is a duplicate
   * (EntityConflictError); a token another hook holds is a hook_conflict event in this run's
   * log, which fails the workflow where it awaits the hook rather than here.
   */
  async function createHook(tx: Tx, runId: string, data: EventRequest, specVersion: number): Promise<Outcome> {
    const hookId = data.correlationId ?? '';
    const eventData = data.eventData ?? {};
    const { rows } = await tx.query(
      `insert into runledger.wf_hooks (hook_id, run_id, token, metadata, is_webhook, is_system, spec_version)
       values ($1, $2, $3, $4::json, $5, $6, $7) on conflict do nothing returning ${HOOK_COLUMNS}`,
      [
        hookId,
        runId,
        eventData.token,
        encodeValue(eventData.metadata),
        eventData.isWebhook ?? true,
        eventData.isSystem ?? false,
        specVersion,
      ],
    );
    if (rows.length > 0) return { hook: toHook(rows[0]) };
    const holder = await tx.query('select hook_id, run_id from runledger.wf_hooks where token = $1 or hook_id = $2', [
      eventData.token,
      hookId,
    ]);
    const same = holder.rows.find((row) => row.hook_id === hookId && row.run_id === runId);
    if (same || holder.rows.length === 0) throw new EntityConflictError(`Hook "${hookId}" already created`);
    return { event: { eventType: 'hook_conflict', eventData: { token: eventData.token, conflictingRunId: holder.rows[0].run_id } } };
  }

  /** The checks on a run that has ended, before anything is written (the SDK's spec, as its reference worlds apply it). */
  function refuseOnTerminalRun(run: WorkflowRun, data: EventRequest): void {
    if (!isTerminalWorkflowRunStatus(run.status)) return;
    const state = run.status;
    if (data.eventType === 'run_started' || data.eventType === 'hook_received')
      throw new RunExpiredError(`Workflow run "${run.runId}" is already in terminal state "${state}"`);
    if (isTerminalRunEventType(data.eventType)) throw new EntityConflictError(`Cannot transition run from terminal state "${state}"`);
    if (isChildEntityCreationEvent(data as never))
      throw new EntityConflictError(`Cannot create new entities on run in terminal state "${state}"`);
    if (data.eventType === 'attr_set') throw new EntityConflictError(`Cannot set attributes on run in terminal state "${state}"`);
  }

  return async function create(runIdArg, dataArg, params) {
    // A request the SDK's own schema refuses is refused here, before anything is written.
    const checked = CreateEventSchema.safeParse(dataArg);
    if (!checked.success) throw invalid(`Not an event the Workflow SDK's spec knows: ${checked.error.message.slice(0, 500)}`);
    const data = dataArg as EventRequest;
    // What goes to text and jsonb columns; payloads go to json columns, which keep any string.
    storable('runId', runIdArg);
    storable('correlationId', data.correlationId);
    for (const field of ['token', 'stepName', 'workflowName', 'deploymentId', 'errorCode', 'attributes', 'changes'])
      storable(`eventData.${field}`, data.eventData?.[field]);
    const resolveData = params?.resolveData ?? 'all';
    const specVersion = data.specVersion ?? WORLD_SPEC_VERSION;
    let runId: string;
    if (data.eventType === 'run_created') {
      if (runIdArg) {
        const stale = validateUlidTimestamp(runIdArg, 'wrun_');
        if (stale) throw invalid(stale);
        runId = runIdArg;
      } else runId = `wrun_${ulid()}`;
    } else if (!runIdArg) throw invalid('runId is required for non-run_created events');
    else runId = runIdArg;

    return inTransaction(pool, async (tx) => {
      if (data.eventType === 'run_created') {
        lastIds.delete(tx);
        if (!(await createRun(tx, runId, data.eventData ?? {}, specVersion)))
          throw new EntityConflictError(`Workflow run "${runId}" already exists`);
        const { rows } = await tx.query(
          `select ${EVENT_COLUMNS} from runledger.wf_events where run_id = $1 and event_type = 'run_created'`,
          [runId],
        );
        return { event: toEvent(rows[0], resolveData), run: await runRow(tx, runId) } as EventResult;
      }
      lastIds.delete(tx);
      const locked = await tx.query<{ last_event_id: string | null }>(
        `select (select max(event_id) from runledger.wf_events e where e.run_id = r.run_id) as last_event_id
           from runledger.wf_runs r where r.run_id = $1 for update`,
        [runId],
      );
      const lastEventId = locked.rows[0]?.last_event_id;
      if (lastEventId) lastIds.set(tx, lastEventId);
      if (locked.rowCount === 0) {
        // Resilient start: a run_started that carries the run's creation data creates the run
        // (its start() may have failed to write run_created before the message was queued).
        const creation = data.eventData;
        if (data.eventType === 'run_started' && creation?.deploymentId && creation.workflowName && creation.input !== undefined) {
          await createRun(tx, runId, creation, specVersion);
          await tx.query(`select run_id from runledger.wf_runs where run_id = $1 for update`, [runId]);
        } else throw new WorkflowRunNotFoundError(runId);
      }
      const run = await runRow(tx, runId);
      if ((run.specVersion ?? 0) > WORLD_SPEC_VERSION) throw new RunNotSupportedError(run.specVersion as number, WORLD_SPEC_VERSION);
      if (isLegacySpecVersion(run.specVersion))
        throw new WorkflowWorldError(
          `Run "${runId}" was written by a pre-event-sourcing SDK (specVersion ${String(run.specVersion)}); runledger's World serves specVersion 2 and later`,
        );

      let outcome: Outcome;
      if (data.eventType === 'run_cancelled' && run.status === 'cancelled')
        outcome = { run }; // idempotent: recorded again, nothing changes
      else {
        refuseOnTerminalRun(run, data);
        if (isHookEventRequiringExistence(data.eventType)) {
          const { rowCount } = await tx.query('select 1 from runledger.wf_hooks where hook_id = $1', [data.correlationId ?? '']);
          if (rowCount === 0) throw new HookNotFoundError(data.correlationId ?? '');
        }
        outcome = await apply(tx, runId, run, data, specVersion);
      }
      if (outcome.event === null) return { run: outcome.run } as EventResult;

      const eventType = outcome.event?.eventType ?? data.eventType;
      const stored = outcome.event !== undefined ? outcome.event.eventData : 'storedData' in outcome ? outcome.storedData : data.eventData;
      const row = await insertEvent(tx, runId, newEventId(tx), eventType, data.correlationId, stored, specVersion);
      const event = toEvent(row, resolveData);
      const result: EventResult = { event, run: outcome.run, step: outcome.step, hook: outcome.hook, wait: outcome.wait };
      if (outcome.stepCreated) result.stepCreated = true;
      if (data.eventType === 'run_started') {
        // The run's whole log, so the runtime can skip its first events.list.
        const { rows } = await tx.query(`select ${EVENT_COLUMNS} from runledger.wf_events where run_id = $1 order by event_id`, [runId]);
        result.events = rows.map((r) => toEvent(r, resolveData));
        result.cursor = result.events.at(-1)?.eventId ?? null;
        result.hasMore = false;
      }
      return result;
    });
  };
}
