import type pg from 'pg';
import { newRunId } from './runs.js';

/** A run row to insert; a field left out gets a default that fits the status, null writes NULL. */
export interface RunFields {
  runId?: string;
  /** Default w@1 in queue 'default' (the workflow must be registered: runs references workflows). */
  workflow?: string;
  version?: string;
  queue?: string;
  /** Default PENDING. */
  status?: string;
  input?: unknown;
  /** RUNNING or CANCELLING: 'wk-test', with a lease an hour long and fencing token 1. */
  leaseOwner?: string | null;
  leaseExpiresAt?: Date | null;
  fencingToken?: number;
  /** WAITING: 'signal'. */
  waitKind?: string | null;
  waitKey?: string | null;
  wakeAt?: Date | null;
  /** A terminal status: now, with the reason that status usually ends with. */
  finishedAt?: Date | null;
  terminationReason?: string | null;
  /** Any other columns of runledger.runs by their SQL names, written as given (they win over the fields above). */
  columns?: Record<string, unknown>;
}

const EXECUTING: readonly string[] = ['RUNNING', 'CANCELLING'];
const REASON_OF: Record<string, string | undefined> = {
  SUCCEEDED: 'COMPLETED',
  FAILED: 'FAILED',
  CANCELLED: 'CANCELLED',
  TERMINATED: 'DEADLINE',
  DEAD_LETTER: 'MAX_RECOVERY_ATTEMPTS',
};

/**
 * Inserts a run in any state, straight into runledger.runs (no start_run, no events):
 * for states no SQL path reaches quickly, and for rows that break an invariant on
 * purpose (pass null, or a bad value, for the field under test). Returns the run id.
 */
export async function insertRun(pool: Pick<pg.Pool, 'query'>, fields: RunFields = {}): Promise<string> {
  const status = fields.status ?? 'PENDING';
  const executing = EXECUTING.includes(status);
  const reason = REASON_OF[status];
  const pick = <T>(value: T | undefined, fallback: T | undefined): T | undefined => (value === undefined ? fallback : value);
  const row: Record<string, unknown> = {
    run_id: fields.runId ?? newRunId('run'),
    workflow_name: fields.workflow ?? 'w',
    workflow_version: fields.version ?? '1',
    queue_name: fields.queue ?? 'default',
    status: fields.status,
    input: fields.input === undefined ? undefined : JSON.stringify(fields.input),
    lease_owner: pick(fields.leaseOwner, executing ? 'wk-test' : undefined),
    lease_expires_at: pick(fields.leaseExpiresAt, executing ? new Date(Date.now() + 3_600_000) : undefined),
    fencing_token: pick(fields.fencingToken, executing ? 1 : undefined),
    wait_kind: pick(fields.waitKind, status === 'WAITING' ? 'signal' : undefined),
    wait_key: fields.waitKey,
    wake_at: fields.wakeAt,
    finished_at: pick(fields.finishedAt, reason ? new Date() : undefined),
    termination_reason: pick(fields.terminationReason, reason),
    ...fields.columns,
  };
  const names = Object.keys(row).filter((name) => row[name] !== undefined);
  const result = await pool.query(
    `insert into runledger.runs (${names.join(', ')}) values (${names.map((_, i) => `$${i + 1}`).join(', ')}) returning run_id`,
    names.map((name) => row[name]),
  );
  return result.rows[0].run_id;
}
