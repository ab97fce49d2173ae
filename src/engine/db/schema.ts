import type { ColumnType } from 'kysely';
import {
  COMPENSATION_STATUSES,
  OPERATION_STATUSES,
  RUN_STATES,
  STEP_KINDS,
  STEP_STATUSES,
  TERMINATION_REASONS,
  WAIT_KINDS,
} from '../core/states.js';
import { RETENTION_KINDS } from '../core/retention.js';

/**
 * runledger's own tables, as a Kysely database interface (`RunledgerDatabase`) derived
 * from one runtime map (`RUNLEDGER_TABLES`), so test/sql/kysely-schema.test.ts can hold
 * the map against the migrated catalog: a migration that adds, drops or retypes a column
 * fails that test until this file follows it.
 *
 * A column is `'<udt_name>'` (information_schema.columns.udt_name), followed by ` null`
 * when it is nullable and ` default` when it has a default (optional on insert); a text
 * column that holds one of a fixed set of values is `[spec, values]`.
 *
 * Selected types are what node-postgres returns: int8 and numeric as strings (exact),
 * timestamptz as Date, jsonb parsed.
 */

export const RUNLEDGER_TABLES = {
  'runledger.migrations': {
    version: 'int4',
    name: 'text',
    breaking: 'bool default',
    applied_at: 'timestamptz default',
    checksum: 'text null',
  },
  'runledger.workflows': {
    workflow_name: 'text',
    workflow_version: 'text',
    queue_name: 'text',
    max_recovery_attempts: 'int4',
    limits: 'jsonb default',
    manifest: 'jsonb null',
    registered_at: 'timestamptz default',
  },
  'runledger.runs': {
    run_id: 'text',
    workflow_name: 'text',
    workflow_version: 'text',
    queue_name: 'text',
    status: ['run_status default', RUN_STATES],
    input: 'jsonb null',
    output: 'jsonb null',
    error: 'jsonb null',
    priority: 'int4 default',
    concurrency_key: 'text null',
    idempotency_key: 'text null',
    tenant_id: 'text null',
    parent_run_id: 'text null',
    created_at: 'timestamptz default',
    updated_at: 'timestamptz default',
    started_at: 'timestamptz null',
    finished_at: 'timestamptz null',
    deadline_at: 'timestamptz null',
    wake_at: 'timestamptz null',
    wait_kind: ['text null', WAIT_KINDS],
    wait_key: 'text null',
    lease_owner: 'text null',
    lease_expires_at: 'timestamptz null',
    fencing_token: 'int8 default',
    recovery_attempts: 'int4 default',
    max_recovery_attempts: 'int4 default',
    version_manifest: 'jsonb default',
    migrate_to: 'text null',
    max_steps: 'int4 null',
    budget: 'numeric null',
    budget_spent: 'numeric default',
    budget_limits: 'jsonb null',
    budget_used: 'jsonb null',
    no_progress: 'int4 null',
    cancel_requested_at: 'timestamptz null',
    admitted: 'bool default',
    admitted_at: 'timestamptz null',
    not_before: 'timestamptz null',
    retry_budget: 'int4 null',
    retries_used: 'int4 default',
    cancel_reason: 'text null',
    termination_reason: ['text null', TERMINATION_REASONS],
    termination_evidence: 'jsonb null',
    terminated_at: 'timestamptz null',
    policy_version: 'text null',
    stop_record: 'jsonb null',
    traceparent: 'text null',
    execution_traceparent: 'text null',
    in_sessions: 'bool null',
    lineage_id: 'text null',
    debounce_key: 'text null',
  },
  'runledger.steps': {
    run_id: 'text',
    seq: 'int4',
    name: 'text',
    kind: ['text', STEP_KINDS],
    status: ['text', STEP_STATUSES],
    output: 'jsonb null',
    error: 'jsonb null',
    attempts: 'int4 default',
    started_at: 'timestamptz',
    finished_at: 'timestamptz default',
    fencing_token: 'int8',
    output_hash: 'text null',
  },
  'runledger.events': {
    event_id: 'int8 default',
    run_id: 'text',
    at: 'timestamptz default',
    kind: 'text',
    detail: 'jsonb null',
    fencing_token: 'int8 null',
  },
  'runledger.workers': {
    worker_id: 'text',
    host: 'text',
    pid: 'int4',
    workflows: '_text',
    migrations: '_text default',
    queues: '_text',
    concurrency: 'int4',
    lease_ms: 'int4',
    started_at: 'timestamptz default',
    last_heartbeat_at: 'timestamptz default',
    stopped_at: 'timestamptz null',
  },
  'runledger.signals': {
    signal_id: 'text',
    run_id: 'text',
    topic: 'text',
    payload: 'jsonb null',
    received_at: 'timestamptz default',
    consumed_seq: 'int4 null',
    consumed_at: 'timestamptz null',
  },
  'runledger.approvals': {
    request_id: 'text',
    run_id: 'text',
    seq: 'int4',
    name: 'text',
    action: 'text',
    evidence: 'jsonb null',
    approvers: '_text null',
    required: 'int4 default',
    requested_at: 'timestamptz default',
    expires_at: 'timestamptz null',
    decision: 'bool null',
    decided_by: 'text null',
    decided_db_user: 'text null',
    decided_db_role: 'text null',
    decided_at: 'timestamptz null',
    note: 'text null',
  },
  'runledger.approval_votes': {
    request_id: 'text',
    voter: 'text',
    approved: 'bool',
    note: 'text null',
    db_user: 'text default',
    db_role: 'text default',
    decided_at: 'timestamptz default',
  },
  'runledger.audit_log': {
    audit_id: 'int8 default',
    at: 'timestamptz default',
    db_user: 'text default',
    db_role: 'text default',
    asserted_by: 'text null',
    action: 'text',
    run_id: 'text null',
    target: 'text null',
    arguments: 'jsonb default',
    result: 'jsonb null',
  },
  'runledger.retention': {
    kind: ['text', RETENTION_KINDS],
    workflow_name: 'text null',
    keep: 'interval null',
    updated_at: 'timestamptz default',
  },
  'runledger.owner_settings': {
    one: 'bool default',
    audit_log_min_keep: 'interval default',
    test_clock: 'bool default',
  },
  'runledger.maintenance': {
    task: 'text',
    worker_id: 'text null',
    started_at: 'timestamptz null',
    lease_until: 'timestamptz null',
    finished_at: 'timestamptz null',
    last_result: 'jsonb null',
  },
  'runledger.operations': {
    operation_id: 'text',
    run_id: 'text',
    seq: 'int4',
    name: 'text',
    idempotency_key: 'text',
    status: ['text', OPERATION_STATUSES],
    external_resource_id: 'text null',
    result: 'jsonb null',
    error: 'jsonb null',
    attempts: 'int4 default',
    compensable: 'bool default',
    compensation_status: ['text null', COMPENSATION_STATUSES],
    compensation_error: 'jsonb null',
    started_at: 'timestamptz default',
    updated_at: 'timestamptz default',
    finished_at: 'timestamptz null',
    resolved_by: 'text null',
    prior_operation_id: 'text null',
  },
  'runledger.step_progress': {
    run_id: 'text',
    seq: 'int4',
    progress: 'jsonb null',
    updated_at: 'timestamptz default',
  },
  'runledger.role_functions': {
    role_name: 'text',
    function_name: 'text',
  },
  'runledger.tenant_members': {
    role_name: 'text',
    tenant_id: 'text',
  },
  'runledger.queues': {
    name: 'text',
    concurrency: 'int4 null',
    per_key_concurrency: 'int4 null',
    rate_limit_max: 'int4 null',
    rate_limit_period_ms: 'int4 null',
    paused: 'bool default',
    updated_at: 'timestamptz default',
  },
  'runledger.admissions': {
    queue_name: 'text',
    admitted_at: 'timestamptz',
  },
  'runledger.stream_chunks': {
    run_id: 'text',
    topic: 'text',
    offset: 'int8',
    chunk: 'jsonb',
    seq: 'int4',
    attempt: 'int4',
    fencing_token: 'int8',
    created_at: 'timestamptz default',
  },
  'runledger.stream_ends': {
    run_id: 'text',
    topic: 'text',
    end_offset: 'int8',
    seq: 'int4',
    fencing_token: 'int8',
    closed_at: 'timestamptz default',
  },
  'runledger.sessions': {
    session_id: 'text',
    holder_run_id: 'text null',
    held_at: 'timestamptz null',
    last_holder_run_id: 'text null',
    released_at: 'timestamptz null',
    release_reason: ['text null', ['released', 'ended', 'operator']],
    entry_count: 'int4 default',
    created_at: 'timestamptz default',
    updated_at: 'timestamptz default',
    tenant_id: 'text default',
    budget_limits: 'jsonb null',
    budget_used: 'jsonb default',
    holder_mark: 'jsonb null',
  },
  'runledger.session_entries': {
    session_id: 'text',
    seq: 'int4',
    role: ['text', ['system', 'user', 'assistant', 'tool']],
    content: 'jsonb',
    run_id: 'text',
    step_position: 'int4',
    entry_index: 'int4',
    created_at: 'timestamptz default',
    tenant_id: 'text default',
  },
  'runledger.session_waiters': {
    session_id: 'text',
    run_id: 'text',
    ticket: 'int8 default',
    queued_at: 'timestamptz default',
    tenant_id: 'text default',
  },
  'runledger.artifact_blobs': {
    sha256: 'text',
    size: 'int8',
    content: 'bytea',
    created_at: 'timestamptz default',
  },
  'runledger.artifacts': {
    artifact_id: 'text',
    run_id: 'text',
    name: 'text',
    kind: ['text', ['artifact', 'value']],
    sha256: 'text null',
    size: 'int8 null',
    blob: 'text null',
    ref: 'text null',
    step_position: 'int4 null',
    created_at: 'timestamptz default',
  },
  'runledger.graph_checkpoints': {
    thread_id: 'text',
    checkpoint_ns: 'text default',
    checkpoint_id: 'text',
    parent_checkpoint_id: 'text null',
    checkpoint: 'jsonb',
    metadata: 'jsonb default',
    run_id: 'text null',
    created_at: 'timestamptz default',
  },
  'runledger.graph_blobs': {
    thread_id: 'text',
    checkpoint_ns: 'text default',
    channel: 'text',
    version: 'text',
    type: 'text',
    blob: 'bytea null',
  },
  'runledger.graph_writes': {
    thread_id: 'text',
    checkpoint_ns: 'text default',
    checkpoint_id: 'text',
    task_id: 'text',
    idx: 'int4',
    channel: 'text',
    type: 'text null',
    blob: 'bytea',
    task_path: 'text default',
  },
  'runledger.environments': {
    env_id: 'text',
    run_id: 'text',
    workflow_name: 'text',
    workflow_version: 'text',
    manifest: 'jsonb',
    seq: 'int4',
    attempt: 'int4',
    created_at: 'timestamptz default',
    reclaim_owner: 'text null',
    reclaim_until: 'timestamptz null',
    reclaim_attempts: 'int4 default',
    reclaimed_at: 'timestamptz null',
    reclaimed_status: 'text null',
    last_error: 'jsonb null',
  },
  'runledger.rate_limit_keys': {
    key: 'text',
    max_calls: 'int4 null',
    per: 'interval null',
    paused_until: 'timestamptz null',
    pause_reason: 'jsonb null',
    updated_at: 'timestamptz default',
  },
  'runledger.rate_limit_calls': {
    key: 'text',
    at: 'timestamptz',
    run_id: 'text',
    seq: 'int4',
  },
  'runledger.rate_limit_waiters': {
    run_id: 'text',
    seq: 'int4',
    key: 'text',
    since: 'timestamptz default',
    until: 'timestamptz',
  },
  'runledger.wf_runs': {
    run_id: 'text',
    deployment_id: 'text',
    workflow_name: 'text',
    status: ['text default', ['pending', 'running', 'completed', 'failed', 'cancelled']],
    spec_version: 'int4 null',
    input: 'json null',
    output: 'json null',
    error: 'json null',
    error_code: 'text null',
    execution_context: 'json null',
    attributes: 'jsonb default',
    extra: 'json null',
    created_at: 'timestamptz default',
    updated_at: 'timestamptz default',
    started_at: 'timestamptz null',
    completed_at: 'timestamptz null',
    expired_at: 'timestamptz null',
  },
  'runledger.wf_events': {
    event_id: 'text',
    run_id: 'text',
    event_type: 'text',
    correlation_id: 'text null',
    event_data: 'json null',
    spec_version: 'int4 null',
    created_at: 'timestamptz default',
  },
  'runledger.wf_steps': {
    run_id: 'text',
    step_id: 'text',
    step_name: 'text',
    status: ['text default', ['pending', 'running', 'completed', 'failed', 'cancelled']],
    input: 'json null',
    output: 'json null',
    error: 'json null',
    attempt: 'int4 default',
    started_at: 'timestamptz null',
    completed_at: 'timestamptz null',
    retry_after: 'timestamptz null',
    spec_version: 'int4 null',
    created_at: 'timestamptz default',
    updated_at: 'timestamptz default',
  },
  'runledger.wf_hooks': {
    hook_id: 'text',
    run_id: 'text',
    token: 'text',
    metadata: 'json null',
    is_webhook: 'bool default',
    is_system: 'bool default',
    spec_version: 'int4 null',
    created_at: 'timestamptz default',
  },
  'runledger.wf_waits': {
    run_id: 'text',
    correlation_id: 'text',
    status: ['text default', ['waiting', 'completed']],
    resume_at: 'timestamptz null',
    completed_at: 'timestamptz null',
    spec_version: 'int4 null',
    created_at: 'timestamptz default',
    updated_at: 'timestamptz default',
  },
  'runledger.wf_stream_chunks': {
    seq: 'int8 default',
    stream_name: 'text',
    run_id: 'text null',
    data: 'bytea',
    eof: 'bool default',
    created_at: 'timestamptz default',
  },
} as const satisfies Record<string, Record<string, ColumnSpec>>;

/** The PostgreSQL types runledger's tables use (udt_name), and what node-postgres gives and takes for each. */
interface PgTypes {
  text: [string, string];
  int4: [number, number];
  int8: [string, string | number | bigint];
  numeric: [string, string | number];
  bool: [boolean, boolean];
  timestamptz: [Date, Date | string];
  jsonb: [unknown, unknown];
  /** json keeps its text as written (runledger/workflow-world's payloads); node-postgres parses it. */
  json: [unknown, unknown];
  bytea: [Buffer, Buffer | Uint8Array];
  _text: [string[], string[]];
  run_status: [string, string];
  /** node-postgres parses an interval into its parts (postgres-interval); give one as text ('30 days'). */
  interval: [PgInterval, string];
}

/** An interval as node-postgres returns it: only the parts that are not zero are set. */
export interface PgInterval {
  years?: number;
  months?: number;
  days?: number;
  hours?: number;
  minutes?: number;
  seconds?: number;
  milliseconds?: number;
  toPostgres(): string;
}
export type PgType = keyof PgTypes;
type Spec = PgType | `${PgType} null` | `${PgType} default` | `${PgType} null default`;
export type ColumnSpec = Spec | readonly [Spec, readonly string[]];

/** A column spec taken apart at run time (the catalog test uses it). */
export function parseColumnSpec(spec: ColumnSpec): { type: PgType; nullable: boolean; hasDefault: boolean; values?: readonly string[] } {
  const [text, values] = typeof spec === 'string' ? [spec, undefined] : spec;
  const [type, ...flags] = text.split(' ');
  return { type: type as PgType, nullable: flags.includes('null'), hasDefault: flags.includes('default'), ...(values ? { values } : {}) };
}

type SpecType<S> = S extends `${infer T extends PgType} ${string}` ? T : S extends PgType ? S : never;
type Nullable<S> = S extends `${string} null${string}` ? null : never;
type Optional<S> = S extends `${string} ${'null' | 'default'}${string}` ? undefined : never;

type Column<C> = C extends readonly [infer S, readonly (infer V)[]]
  ? ColumnType<V | Nullable<S>, V | Nullable<S> | Optional<S>, V | Nullable<S>>
  : ColumnType<
      PgTypes[SpecType<C>][0] | Nullable<C>,
      PgTypes[SpecType<C>][1] | Nullable<C> | Optional<C>,
      PgTypes[SpecType<C>][1] | Nullable<C>
    >;

type Tables = typeof RUNLEDGER_TABLES;

/**
 * runledger's tables for Kysely, keyed `runledger.<table>`. Combine it with your own:
 * `createEngine<MyDatabase & RunledgerDatabase>()` types `engine.db` and `trx` for both.
 */
export type RunledgerDatabase = { -readonly [T in keyof Tables]: { -readonly [C in keyof Tables[T]]: Column<Tables[T][C]> } };
