import type pg from 'pg';
import { fromSqlAmounts, type BudgetAmounts } from '../core/budget.js';
import type { Kysely } from 'kysely';
import { ConfigError, fromPgError } from '../core/errors.js';
import {
  RUN_STATES,
  type CompensationStatus,
  type OperationStatus,
  type RunStatus,
  type StepKind,
  type StepStatus,
  type TerminationReason,
  type WaitKind,
} from '../core/states.js';
import type { RunledgerDatabase } from '../db/schema.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';

export type { CompensationStatus, OperationStatus, StepKind, StepStatus, WaitKind } from '../core/states.js';

export interface StepRecord {
  seq: number;
  name: string;
  kind: StepKind;
  /** WAITING: a wait (or a retry backoff) in progress at this position. */
  status: StepStatus;
  output: unknown;
  error: unknown;
  attempts: number;
  startedAt: Date;
  finishedAt: Date;
  /** The run's fencing token when the checkpoint was written: int8 as a decimal string (exact past 2^53, and JSON-safe). */
  fencingToken: string;
  /** md5 of the output, kept only for runs with a noProgress limit. */
  outputHash: string | null;
}

/** One row of the operation ledger (runledger.operations): an external side effect of ctx.operation. */
export interface OperationRecord {
  operationId: string;
  runId: string;
  seq: number;
  name: string;
  idempotencyKey: string;
  status: OperationStatus;
  externalResourceId: string | null;
  result: unknown;
  error: unknown;
  attempts: number;
  compensable: boolean;
  compensationStatus: CompensationStatus | null;
  compensationError: unknown;
  startedAt: Date;
  updatedAt: Date;
  finishedAt: Date | null;
  /** Who settled an UNKNOWN outcome (resolveOperation), if someone did. */
  resolvedBy: string | null;
  /** In a fork: the ancestor run's operation with the same idempotency key, reused (attempts 0) or attempted again. */
  priorOperationId: string | null;
}

export interface RunRecord {
  runId: string;
  workflowName: string;
  workflowVersion: string;
  queueName: string;
  status: RunStatus;
  input: unknown;
  output: unknown;
  error: unknown;
  priority: number;
  concurrencyKey: string | null;
  idempotencyKey: string | null;
  /** The tenant the run belongs to (set at start, inherited by children and forks); null: none. */
  tenantId: string | null;
  parentRunId: string | null;
  createdAt: Date;
  updatedAt: Date;
  startedAt: Date | null;
  finishedAt: Date | null;
  deadlineAt: Date | null;
  waitKind: WaitKind | null;
  waitKey: string | null;
  maxSteps: number | null;
  /** Budget units the run may charge (ctx.charge); null: no budget. */
  budget: number | null;
  budgetSpent: number;
  /** Limits in the other dimensions (limits.budget as an object), camelCase; null: none. */
  budgetLimits: BudgetAmounts | null;
  /** What the run spent in the other dimensions (tokens, costUsd, toolCalls, turns); null: nothing yet. */
  budgetUsed: BudgetAmounts | null;
  noProgress: number | null;
  retryBudget: number | null;
  retriesUsed: number;
  cancelRequestedAt: Date | null;
  cancelReason: string | null;
  admitted: boolean;
  admittedAt: Date | null;
  notBefore: Date | null;
  wakeAt: Date | null;
  leaseOwner: string | null;
  leaseExpiresAt: Date | null;
  /** Incremented on every claim; int8 as a decimal string (exact past 2^53, and JSON-safe: `JSON.stringify(run)` works). */
  fencingToken: string;
  recoveryAttempts: number;
  maxRecoveryAttempts: number;
  versionManifest: unknown;
  /** Set by migrate_run: the version the run moves to once a worker applies the migration. */
  migrateTo: string | null;
  terminationReason: TerminationReason | null;
  terminationEvidence: unknown;
  terminatedAt: Date | null;
  policyVersion: string | null;
  /** The W3C traceparent the run was started under (docs/observability.md); null: started outside a trace. */
  traceparent: string | null;
  /** The traceparent of the span of the run's latest traced execution; null: none traced. */
  executionTraceparent: string | null;
  /** True once the run has held an agent session or queued for one (docs/sessions.md); null otherwise. */
  inSessions: boolean | null;
  /** Present from getRun (not from listRuns). */
  steps?: StepRecord[];
  /** The run's external operations (ledger rows); present from getRun. */
  operations?: OperationRecord[];
}

const camel = (key: string) => key.replace(/_([a-z])/g, (_, c: string) => c.toUpperCase());

/**
 * A row with camelCase keys, every value JSON-safe (what a caller's `res.json(run)` sends):
 * int8 fencing tokens as decimal strings, numeric budgets as numbers (node-postgres gives
 * both as strings; a driver configured to give bigints for int8 is turned back to text).
 */
function toRecord<T>(row: object): T {
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(row)) out[camel(key)] = value;
  if (out.fencingToken !== undefined && out.fencingToken !== null) out.fencingToken = String(out.fencingToken);
  for (const key of ['budget', 'budgetSpent']) {
    if (out[key] !== undefined && out[key] !== null) out[key] = Number(out[key]);
  }
  for (const key of ['budgetLimits', 'budgetUsed']) {
    if (out[key] !== undefined && out[key] !== null) out[key] = fromSqlAmounts(out[key] as Record<string, unknown>);
  }
  return out as T;
}

/**
 * The run row, with its checkpoints and ledger rows unless `withSteps: false`; its payloads
 * (input, output, a verify's evidence, step outputs, operation results) decoded by the
 * engine's codec: one it cannot decode throws (PAYLOAD_KEY_MISSING naming the key...).
 */
export async function getRun(
  db: Kysely<RunledgerDatabase>,
  runId: string,
  options: { withSteps?: boolean } = {},
  payloads: Payloads = NO_CODEC,
): Promise<RunRecord | undefined> {
  const row = await db.selectFrom('runledger.runs').selectAll().where('run_id', '=', runId).executeTakeFirst();
  if (!row) return undefined;
  const run = decodeRun(toRecord<RunRecord>(row), payloads);
  if (options.withSteps !== false) {
    const steps = await db.selectFrom('runledger.steps').selectAll().where('run_id', '=', runId).orderBy('seq').execute();
    run.steps = steps.map((step) => {
      const { runId: _ignored, ...rest } = toRecord<StepRecord & { runId: string }>(step);
      return payloads.enabled ? { ...rest, output: payloads.decodeStepOutput(rest.kind, rest.output) } : rest;
    });
    const operations = await db.selectFrom('runledger.operations').selectAll().where('run_id', '=', runId).orderBy('seq').execute();
    run.operations = operations.map((op) => {
      const record = toRecord<OperationRecord>(op);
      return payloads.enabled ? { ...record, result: payloads.decode(record.result) } : record;
    });
  }
  return run;
}

/** A run record's payloads in clear: input, output, and a verify's evidence in the termination record. */
function decodeRun(run: RunRecord, payloads: Payloads): RunRecord {
  if (!payloads.enabled) return run;
  run.input = payloads.decode(run.input);
  run.output = payloads.decode(run.output);
  const evidence = run.terminationEvidence as Record<string, unknown> | null;
  if (evidence && typeof evidence === 'object') {
    // COMPLETED: { verification } (verify's evidence); UNVERIFIED: { reason, evidence }.
    const key = run.terminationReason === 'UNVERIFIED' ? 'evidence' : run.terminationReason === 'COMPLETED' ? 'verification' : undefined;
    if (key && key in evidence) run.terminationEvidence = { ...evidence, [key]: payloads.decode(evidence[key]) };
  }
  return run;
}

export interface ListRunsOptions {
  status?: RunStatus | RunStatus[];
  workflow?: string;
  /** Default 100, at most 10,000. */
  limit?: number;
}

export async function listRuns(
  db: Kysely<RunledgerDatabase>,
  options: ListRunsOptions = {},
  payloads: Payloads = NO_CODEC,
): Promise<RunRecord[]> {
  const limit = options.limit ?? 100;
  if (!Number.isInteger(limit) || limit < 1 || limit > 10_000)
    throw new ConfigError('listRuns: limit must be a whole number from 1 to 10000');
  const statuses = options.status === undefined ? [] : Array.isArray(options.status) ? options.status : [options.status];
  for (const status of statuses) {
    if (!(RUN_STATES as readonly string[]).includes(status)) throw new ConfigError(`listRuns: unknown status ${JSON.stringify(status)}`);
  }
  let query = db.selectFrom('runledger.runs').selectAll().orderBy('created_at', 'desc').orderBy('run_id', 'desc').limit(limit);
  if (statuses.length > 0) query = query.where('status', 'in', statuses);
  if (options.workflow !== undefined) query = query.where('workflow_name', '=', options.workflow);
  const rows = await query.execute();
  return rows.map((row) => decodeRun(toRecord<RunRecord>(row), payloads));
}

export async function retryRun(pool: pg.Pool, runId: string): Promise<RunStatus> {
  try {
    const result = await pool.query('select runledger.retry_run(p_run_id => $1) as status', [runId]);
    return result.rows[0].status;
  } catch (error) {
    throw fromPgError(error);
  }
}
