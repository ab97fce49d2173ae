import type pg from 'pg';
import { ConfigError, fromPgError, MigrationFailedError } from '../core/errors.js';
import type { RunStatus } from '../core/states.js';

export interface MigrateRunOptions {
  /** Wait for a worker to apply the migration (default true); false returns once the run is marked. */
  wait?: boolean;
  /** How long to wait for the worker, ms; default 30,000. The run stays marked past it. */
  timeoutMs?: number;
}

export interface MigrationOutcome {
  runId: string;
  fromVersion: string;
  toVersion: string;
  /** migrated: a worker applied it; requested: marked, not applied yet (wait false, or the wait timed out). */
  outcome: 'migrated' | 'requested';
  /** The run's status after the migration (a DEAD_LETTER run comes back PENDING). */
  status: RunStatus;
}

const WAIT_TIMEOUT_MS_DEFAULT = 30_000;

/**
 * runledger.migrate_run, then (by default) waits for the worker's outcome: resolves when it
 * migrated the run, rejects with MIGRATION_FAILED (the recorded error in details) when the
 * migration failed and the run was left as it was.
 */
export async function migrateRun(
  pool: pg.Pool,
  runId: string,
  toVersion: string,
  options: MigrateRunOptions = {},
): Promise<MigrationOutcome> {
  const timeoutMs = options.timeoutMs ?? WAIT_TIMEOUT_MS_DEFAULT;
  if (!Number.isInteger(timeoutMs) || timeoutMs < 0) throw new ConfigError('migrateRun: timeoutMs must be a whole number >= 0');
  let fromVersion: string;
  try {
    const before = await pool.query('select workflow_version from runledger.runs where run_id = $1', [runId]);
    fromVersion = before.rows[0]?.workflow_version;
    await pool.query('select runledger.migrate_run(p_run_id => $1, p_to_version => $2)', [runId, toVersion]);
  } catch (error) {
    throw fromPgError(error);
  }
  return awaitMigration(pool, runId, fromVersion, toVersion, options.wait === false ? 0 : timeoutMs);
}

/** What migrate_runs did: the runs it marked, and the runs of the selection it left on their version, with why. */
export interface MigrateRunsResult {
  /** The runs marked for the new version, oldest first (a worker with the migration applies it). */
  marked: string[];
  /**
   * The runs of the selection it did not mark: one another transaction held locked at that
   * moment (a claim, a signal, an open transaction; call again), or one whose compensations
   * undid an operation (fork it instead: docs/operations.md#after-compensations).
   */
  skipped: Array<{ runId: string; reason: string }>;
}

/** Marks up to `limit` runs of workflow@fromVersion (oldest first; all without a limit); says which it marked and which it left. */
export async function migrateRuns(
  pool: pg.Pool,
  selection: { workflow: string; fromVersion: string; toVersion: string; limit?: number },
): Promise<MigrateRunsResult> {
  try {
    const result = await pool.query(
      'select run_id, marked, reason from runledger.migrate_runs(p_workflow => $1, p_from_version => $2, p_to_version => $3, p_limit => $4)',
      [selection.workflow, selection.fromVersion, selection.toVersion, selection.limit ?? null],
    );
    const outcome: MigrateRunsResult = { marked: [], skipped: [] };
    for (const row of result.rows) {
      if (row.marked) outcome.marked.push(row.run_id);
      else outcome.skipped.push({ runId: row.run_id, reason: row.reason });
    }
    return outcome;
  } catch (error) {
    throw fromPgError(error);
  }
}

/**
 * Waits until the run's mark is gone, then reads what happened from its events: the
 * last migration event after the request. Polls (an operator action, not a hot path).
 */
export async function awaitMigration(
  pool: pg.Pool,
  runId: string,
  fromVersion: string,
  toVersion: string,
  timeoutMs: number,
): Promise<MigrationOutcome> {
  const deadline = Date.now() + timeoutMs;
  for (let delay = 20; ; delay = Math.min(delay * 2, 250)) {
    const { rows } = await pool.query(
      `select r.status, r.workflow_version, r.migrate_to,
              (select jsonb_build_object('kind', e.kind, 'detail', e.detail) from runledger.events e
                where e.run_id = r.run_id and e.kind in ('migration_requested', 'migrated', 'migration_failed', 'migration_dropped')
                order by e.event_id desc limit 1) as last
         from runledger.runs r where r.run_id = $1`,
      [runId],
    );
    const row = rows[0];
    const base = { runId, fromVersion, toVersion, status: row.status as RunStatus };
    if (row.migrate_to !== toVersion) {
      const last = row.last as { kind: string; detail: Record<string, unknown> } | null;
      if (last?.kind === 'migrated' && row.workflow_version === toVersion) return { ...base, outcome: 'migrated' };
      if (last?.kind === 'migration_failed') {
        const error = last.detail.error as { message?: string } | undefined;
        throw new MigrationFailedError(`run ${runId} was not migrated to version ${toVersion}: ${error?.message ?? 'migration failed'}`, {
          details: last.detail,
        });
      }
      if (last?.kind === 'migration_dropped') {
        throw new MigrationFailedError(`run ${runId} finished on version ${fromVersion} before a worker migrated it`, {
          details: last.detail,
        });
      }
    }
    if (Date.now() >= deadline) return { ...base, outcome: 'requested' };
    await new Promise((resolve) => setTimeout(resolve, Math.min(delay, Math.max(1, deadline - Date.now()))));
  }
}
