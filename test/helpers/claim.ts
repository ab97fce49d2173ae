import pg from 'pg';
import { expect } from 'vitest';
import { runHelpers, type Queryable, type SqlDb } from './runs.js';

/** A claimed run as the worker receives it from runledger._claim_batch (the fields tests look at). */
export interface Claimed {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  input: unknown;
  fencing_token: number;
  recovery_attempts: number;
  checkpoints: unknown[];
}

/** A run claimed by runledger._claim_batch, or (run_id null) the sentinel row that carries next_due_in_ms. */
export interface BatchRow {
  run_id: string | null;
  workflow_name: string | null;
  workflow_version: string | null;
  input: unknown;
  fencing_token: number | null;
  recovery_attempts: number | null;
  cancel_requested: boolean | null;
  checkpoints: unknown[] | null;
  /** Milliseconds until the next delayed start or timer, on the database clock. */
  next_due_in_ms: number | null;
}

export const claimedIds = (rows: BatchRow[]): string[] => rows.filter((r) => r.run_id !== null).map((r) => r.run_id!);
export const sentinels = (rows: BatchRow[]): BatchRow[] => rows.filter((r) => r.run_id === null);

/** The row _claim_batch ends with when it claimed fewer runs than its limit. */
export const sentinel = (nextDueInMs: number | null): BatchRow => ({
  run_id: null,
  workflow_name: null,
  workflow_version: null,
  input: null,
  fencing_token: null,
  recovery_attempts: null,
  cancel_requested: null,
  checkpoints: null,
  next_due_in_ms: nextDueInMs,
});

/** More than any queue in a test file holds: a probe with this limit claims everything claimable. */
export const PROBE_LIMIT = 100_000;

/** runledger._claim_batch as the dispatcher calls it (src/engine/dispatcher.ts). */
export async function claimBatch(
  on: Queryable,
  worker: string,
  queues: string[],
  workflows: string[],
  limit: number | null,
  options: { leaseMs?: number; reclaimExcept?: string[] } = {},
): Promise<BatchRow[]> {
  const result = await on.query(
    `select run_id, workflow_name, workflow_version, input, fencing_token::int as fencing_token, recovery_attempts,
            cancel_requested, checkpoints, next_due_in_ms::float8 as next_due_in_ms
       from runledger._claim_batch($1, $2, $3, $4, $5${options.reclaimExcept === undefined ? '' : ', $6'})`,
    options.reclaimExcept === undefined
      ? [worker, queues, workflows, limit, options.leaseMs ?? 30_000]
      : [worker, queues, workflows, limit, options.leaseMs ?? 30_000, options.reclaimExcept],
  );
  return result.rows;
}

/**
 * Claims one given run the way a worker does: runledger._claim_batch for the run's queue
 * and workflow@version. _claim_batch takes whatever is claimable in a queue, so when the
 * queue holds other runs (or, with `reclaim`, this worker holds other runs) they are
 * row-locked from a second session while it runs: its SKIP LOCKED passes over them, and
 * the claim takes this run or nothing. Returns the claimed run ([] when not claimable).
 *
 * In a test's transaction (`db` is `{ pool: tx }`) no second session sees the other runs to
 * lock them: a probe under a savepoint, rolled back, makes sure the claim can take no other
 * run, and fails the test otherwise (claim each run as it is started there instead).
 *
 * `reclaim`: the worker lost the reply of an earlier claim (p_reclaim_except = '{}').
 * `on`: the session of the claim, e.g. one whose runledger.fake_now is the clock.
 */
export async function claimRun(
  db: SqlDb,
  runId: string,
  options: { worker?: string; leaseMs?: number; on?: Queryable; reclaim?: boolean } = {},
): Promise<Claimed[]> {
  const worker = options.worker ?? 'wk-1';
  const run = (await db.pool.query('select queue_name, workflow_name, workflow_version from runledger.runs where run_id = $1', [runId]))
    .rows[0];
  expect(run, `run ${runId} to claim`).toBeDefined();
  const othersSql = `from runledger.runs
    where run_id <> $1 and (queue_name = $2 or ($3 and lease_owner = $4 and status in ('RUNNING', 'CANCELLING')))`;
  const othersArgs = [runId, run.queue_name, options.reclaim === true, worker];
  const claim = async () => {
    const rows = await claimBatch(options.on ?? db.pool, worker, [run.queue_name], [`${run.workflow_name}@${run.workflow_version}`], 1, {
      leaseMs: options.leaseMs,
      reclaimExcept: options.reclaim ? [] : undefined,
    });
    expect(
      claimedIds(rows).filter((id) => id !== runId),
      `a claim of ${runId} claims no other run`,
    ).toEqual([]);
    return rows
      .filter((r) => r.run_id !== null)
      .map((r) => ({
        run_id: r.run_id!,
        workflow_name: r.workflow_name!,
        workflow_version: r.workflow_version!,
        input: r.input,
        fencing_token: r.fencing_token!,
        recovery_attempts: r.recovery_attempts!,
        checkpoints: r.checkpoints!,
      }));
  };
  // Alone in its queue: no locks, so concurrent claims of the run really race.
  if (!(await db.pool.query(`select exists (select 1 ${othersSql}) as any`, othersArgs)).rows[0].any) return claim();

  if (db.url === undefined) {
    const on = options.on ?? db.pool;
    await on.query('savepoint claim_run_probe');
    let others: string[];
    try {
      const rows = await claimBatch(on, worker, [run.queue_name], [`${run.workflow_name}@${run.workflow_version}`], PROBE_LIMIT, {
        reclaimExcept: options.reclaim ? [] : undefined,
      });
      others = claimedIds(rows).filter((id) => id !== runId);
    } finally {
      await on.query('rollback to savepoint claim_run_probe');
      await on.query('release savepoint claim_run_probe');
    }
    expect(others, `in a test transaction nothing but ${runId} is claimable in its queue (claim each run as it is started)`).toEqual([]);
    return claim();
  }

  const locker = new pg.Client({ connectionString: db.url });
  await locker.connect();
  try {
    await locker.query('begin');
    // A session of the caller holding one of these rows would make the lock wait forever: fail instead.
    await locker.query(`set local lock_timeout = '10s'`);
    // One such claim per queue at a time: two would lock each other's run and deadlock.
    await locker.query('select pg_advisory_xact_lock(hashtext($1))', [`test-claim-run:${run.queue_name}`]);
    // NO KEY UPDATE: enough for SKIP LOCKED to pass over the row, without blocking inserts that reference it.
    await locker.query(`select 1 ${othersSql} for no key update`, othersArgs);
    return await claim();
  } finally {
    await locker.query('rollback').catch(() => {});
    await locker.end();
  }
}

/** The claim helpers of one test database or test transaction, with the defaults the SQL tests use (worker wk-1, 30 s lease; reclaimedRun starts `defaults.workflow`, else w). */
export function claimHelpers(db: SqlDb, defaults: { workflow?: string } = {}) {
  const { startRun } = runHelpers(db, defaults);

  function claim(runId: string, worker = 'wk-1', leaseMs = 30_000, on: Queryable = db.pool, reclaim?: boolean): Promise<Claimed[]> {
    return claimRun(db, runId, { worker, leaseMs, on, reclaim });
  }

  async function claimOne(runId: string, worker = 'wk-1', leaseMs = 30_000, on: Queryable = db.pool): Promise<Claimed> {
    const rows = await claim(runId, worker, leaseMs, on);
    expect(rows, `claim of ${runId}`).toHaveLength(1);
    return rows[0]!;
  }

  /**
   * Would a worker claim the run now? runledger._claim_batch for the run's queue and
   * workflow@version (or the ones given), in a transaction that is rolled back, so nothing
   * changes. The limit is larger than any queue here, so the run comes back exactly when it
   * is claimable, and the sentinel row (run_id null) is always there with next_due_in_ms.
   * `on`: a session whose runledger.fake_now is the clock of the probe. In a test's
   * transaction the probe runs under a savepoint of it instead.
   */
  async function claimable(
    runId: string,
    options: { on?: pg.Client; queues?: string[]; workflows?: string[] } = {},
  ): Promise<{ claimed: boolean; nextDueInMs: number | null }> {
    const run = (await db.pool.query('select queue_name, workflow_name, workflow_version from runledger.runs where run_id = $1', [runId]))
      .rows[0];
    expect(run, `run ${runId}`).toBeDefined();
    const queues = options.queues ?? [run!.queue_name];
    const workflows = options.workflows ?? [`${run!.workflow_name}@${run!.workflow_version}`];
    const probe = async (client: Queryable) => {
      const rows = await claimBatch(client, 'wk-probe', queues, workflows, PROBE_LIMIT);
      expect(claimedIds(rows).filter((id) => id === runId).length, `${runId} claimed at most once`).toBeLessThanOrEqual(1);
      expect(sentinels(rows), 'fewer runs than the limit: one sentinel row').toHaveLength(1);
      return { claimed: claimedIds(rows).includes(runId), nextDueInMs: sentinels(rows)[0]!.next_due_in_ms };
    };
    const rolledBack = async (client: pg.ClientBase) => {
      await client.query('begin');
      try {
        return await probe(client);
      } finally {
        await client.query('rollback');
      }
    };
    if (options.on) return rolledBack(options.on);
    if (db.url === undefined) {
      await db.pool.query('savepoint claimable_probe');
      try {
        return await probe(db.pool);
      } finally {
        await db.pool.query('rollback to savepoint claimable_probe');
        await db.pool.query('release savepoint claimable_probe');
      }
    }
    const client = await db.pool.connect();
    try {
      return await rolledBack(client);
    } finally {
      client.release();
    }
  }

  /** A run claimed, given back and claimed again: its first token (1) is stale, its current one is 2. */
  async function reclaimedRun(
    options: Record<string, unknown> = {},
    on: Queryable = db.pool,
  ): Promise<{ runId: string; stale: number; token: number }> {
    const runId = await startRun(options, { n: 1 }, on);
    const first = await claimOne(runId, 'wk-first', 30_000, on);
    await on.query(`select runledger._release_run($1, $2, 0, 'test')`, [runId, first.fencing_token]);
    const second = await claimOne(runId, 'wk-second', 30_000, on);
    expect(second.fencing_token).toBe(first.fencing_token + 1);
    return { runId, stale: first.fencing_token, token: second.fencing_token };
  }

  /** The claimed events of the runs, in order, with the worker, the token and the time. */
  const claimedEvents = async (runIds: string[]) =>
    (
      await db.pool.query(
        `select run_id, detail, fencing_token::int as fencing_token, at from runledger.events
          where run_id = any($1) and kind = 'claimed' order by event_id`,
        [runIds],
      )
    ).rows;

  return {
    claim,
    claimOne,
    claimable,
    claimedEvents,
    reclaimedRun,
    claimBatch: (
      worker: string,
      queues: string[],
      workflows: string[],
      limit: number | null,
      options: { on?: Queryable; leaseMs?: number; reclaimExcept?: string[] } = {},
    ) => claimBatch(options.on ?? db.pool, worker, queues, workflows, limit, options),
  };
}
