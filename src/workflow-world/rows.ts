/**
 * The World's rows as the Workflow SDK's entities: the column lists its reads select (json
 * columns as text, for decodeValue) and the mappers that turn a row into a run, step, hook,
 * wait or event, parsed by the SDK's own schemas (@workflow/world) so a row the SDK would not
 * accept fails here, named, instead of deep in the runtime.
 */
import {
  EventSchema,
  HookSchema,
  StepSchema,
  WaitSchema,
  WorkflowRunSchema,
  stripEventDataRefs,
  type Event,
  type Hook,
  type ResolveData,
  type Step,
  type StepWithoutData,
  type Wait,
  type WorkflowRun,
  type WorkflowRunWithoutData,
} from '@workflow/world';
import { decodeValue } from './codec.js';

export const RUN_COLUMNS = `run_id, deployment_id, workflow_name, status, spec_version, input::text as input,
  output::text as output, error::text as error, error_code, execution_context::text as execution_context,
  attributes, extra::text as extra, created_at, updated_at, started_at, completed_at, expired_at`;

export const STEP_COLUMNS = `run_id, step_id, step_name, status, input::text as input, output::text as output,
  error::text as error, attempt, started_at, completed_at, retry_after, spec_version, created_at, updated_at`;

export const HOOK_COLUMNS = `run_id, hook_id, token, metadata::text as metadata, is_webhook, is_system, spec_version, created_at`;

export const WAIT_COLUMNS = `run_id, correlation_id, status, resume_at, completed_at, spec_version, created_at, updated_at`;

export const EVENT_COLUMNS = `event_id, run_id, event_type, correlation_id, event_data::text as event_data, spec_version, created_at`;

type Row = Record<string, unknown>;

/** Drops the keys whose value is undefined or null: the SDK's schemas take absent, not null. */
function present<T extends Record<string, unknown>>(value: T): T {
  const out: Record<string, unknown> = {};
  for (const [key, inner] of Object.entries(value)) if (inner !== undefined && inner !== null) out[key] = inner;
  return out as T;
}

export function toRun(row: Row): WorkflowRun {
  const extra = (decodeValue(row.extra as string | null) ?? {}) as Record<string, unknown>;
  return WorkflowRunSchema.parse(
    present({
      ...extra,
      runId: row.run_id,
      deploymentId: row.deployment_id,
      workflowName: row.workflow_name,
      status: row.status,
      specVersion: row.spec_version,
      input: decodeValue(row.input as string | null),
      output: decodeValue(row.output as string | null),
      error: decodeValue(row.error as string | null),
      errorCode: row.error_code,
      executionContext: decodeValue(row.execution_context as string | null),
      attributes: row.attributes ?? {},
      createdAt: row.created_at,
      updatedAt: row.updated_at,
      startedAt: row.started_at,
      completedAt: row.completed_at,
      expiredAt: row.expired_at,
    }),
  ) as WorkflowRun;
}

export function toStep(row: Row): Step {
  return StepSchema.parse(
    present({
      runId: row.run_id,
      stepId: row.step_id,
      stepName: row.step_name,
      status: row.status,
      input: decodeValue(row.input as string | null),
      output: decodeValue(row.output as string | null),
      error: decodeValue(row.error as string | null),
      attempt: row.attempt,
      startedAt: row.started_at,
      completedAt: row.completed_at,
      retryAfter: row.retry_after,
      specVersion: row.spec_version,
      createdAt: row.created_at,
      updatedAt: row.updated_at,
    }),
  ) as Step;
}

export function toHook(row: Row): Hook {
  return HookSchema.parse(
    present({
      runId: row.run_id,
      hookId: row.hook_id,
      token: row.token,
      ownerId: '',
      projectId: '',
      environment: '',
      metadata: decodeValue(row.metadata as string | null),
      isWebhook: row.is_webhook,
      isSystem: row.is_system,
      specVersion: row.spec_version,
      createdAt: row.created_at,
    }),
  ) as Hook;
}

export function toWait(row: Row): Wait {
  return WaitSchema.parse(
    present({
      waitId: `${row.run_id as string}-${row.correlation_id as string}`,
      runId: row.run_id,
      status: row.status,
      resumeAt: row.resume_at,
      completedAt: row.completed_at,
      specVersion: row.spec_version,
      createdAt: row.created_at,
      updatedAt: row.updated_at,
    }),
  );
}

export function toEvent(row: Row, resolveData: ResolveData = 'all'): Event {
  const event = EventSchema.parse(
    present({
      eventId: row.event_id,
      runId: row.run_id,
      eventType: row.event_type,
      correlationId: row.correlation_id,
      eventData: decodeValue(row.event_data as string | null),
      specVersion: row.spec_version,
      createdAt: row.created_at,
    }),
  ) as Event;
  return stripEventDataRefs(event, resolveData);
}

/** A run without its input and output, as `resolveData: 'none'` asks. */
export function runData(run: WorkflowRun, resolveData: ResolveData = 'all'): WorkflowRun | WorkflowRunWithoutData {
  if (resolveData !== 'none') return run;
  return { ...run, input: undefined, output: undefined } as WorkflowRunWithoutData;
}

export function stepData(step: Step, resolveData: ResolveData = 'all'): Step | StepWithoutData {
  if (resolveData !== 'none') return step;
  return { ...step, input: undefined, output: undefined } as StepWithoutData;
}

export function hookData(hook: Hook, resolveData: ResolveData = 'all'): Hook {
  if (resolveData !== 'none') return hook;
  return { ...hook, metadata: undefined };
}
