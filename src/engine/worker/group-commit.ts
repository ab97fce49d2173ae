import type pg from 'pg';
import type { ClaimedRun, ClaimRow, PiggybackClaim } from './dispatcher.js';
import type { CrashHook } from '../core/crash-points.js';
import type { CommitItem, CommitResult } from '../run/commit-items.js';
import type { CommitQueue } from '../run/execution.js';
import type { BatchTrace, SpanRef, Tracing } from '../observe/tracing.js';
import type { EngineMetrics } from '../observe/metrics.js';
import { EndOfTurn } from '../core/end-of-turn.js';
import { isConnectionError } from '../db/pg-errors.js';

/** An item's own failure inside the batch, carrying its SQLSTATE like a pg error. */
export class BatchItemError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'BatchItemError';
  }
}

interface Waiting {
  item: CommitItem;
  /** Sort key: a batch locks its runs in run_id order, as the heartbeat does. */
  runId: string;
  /** Times this item was sent again after a deadlock or serialization failure. */
  retries: number;
  /** A completion: it frees its run's slot when the batch commits. */
  completes: boolean;
  /** The span of the execution the item is written for: the batch's span links to it. */
  trace: SpanRef | undefined;
  resolve: (result: CommitResult) => void;
  reject: (error: unknown) => void;
}

const BATCH_SQL = 'select item, code, message, run_status from runledger._commit_batch(p_items => $1::jsonb)';
/** The claimed runs come back in _claim_batch's own columns (as the dispatcher's own claim reads them), not as JSON. */
const BATCH_AND_CLAIM_SQL =
  'select item, code, message, run_status, run_id, workflow_name, workflow_version, input, fencing_token, recovery_attempts, max_steps, ' +
  'budget, budget_spent, budget_limits, budget_used, cancel_requested, checkpoints, progress, next_due_in_ms, traceparent, execution_traceparent, lineage_id ' +
  'from runledger._commit_and_claim(p_items => $1::jsonb, p_worker_id => $2, p_queues => $3, p_workflows => $4, p_limit => $5, p_lease_ms => $6)';

/** run_id is the second field of every item; run ids never contain quotes (rule runs_run_id_check of the trigger runs_invariants). */
const RUN_ID = /"run_id":"([^"]*)"/;
/** Deadlock and serialization failure: the item's writes were undone, and it may simply be sent again. */
const RETRYABLE = new Set(['40P01', '40001']);
const ITEM_RETRIES = 5;

/** An item's answer (item set), or a row of the claim (item null): a claimed run, the next-due row, or the claim's error (code set). */
type BatchRow = { item: number | null; code: string | null; message: string | null; run_status: string | null } & Partial<
  Omit<ClaimedRun, 'run_id'>
> & {
    run_id?: string | null;
    next_due_in_ms?: string | null;
  };

/** The worker's dispatcher, asked whether a claim should ride on a batch that completes runs. */
export interface PiggybackSource {
  piggyback(completions: number): PiggybackClaim | undefined;
  /** The group commit has nothing in flight or waiting: a claim must go on its own now. */
  commitIdle(): void;
}

/**
 * Group commit of one worker's plain checkpoints and completions. Items submitted
 * while no batch is in flight are sent together at the end of the event loop's turn
 * (the runs one claim handed over reach their commits in the same turn); items
 * submitted while a batch is in flight wait for it to return and then go together, in
 * one round trip and one commit. Under load the batches grow by themselves; idle, an
 * item waits only for its turn to end. One batch in flight drained one-step runs about
 * 15% faster than two (larger batches, fewer commits for the same work).
 *
 * A batch whose reply is lost rejects every item with the connection error: each
 * caller already knows how to settle an outcome it did not see. A batch the server
 * refused for any other reason is split until the item at fault is alone (failed()).
 */
export class GroupCommit implements CommitQueue {
  private waiting: Waiting[] = [];
  private inFlight = 0;
  /** Sends what this turn of the event loop submitted, once, when the turn ends. */
  private readonly sendAtEndOfTurn = new EndOfTurn(() => this.send());
  /** Set by the worker once its dispatcher exists. */
  claimer: PiggybackSource | undefined;
  /** The engine's tracing: a batch whose items come from traced executions gets a span (runledger.group_commit). */
  tracing: Tracing | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly maxInFlight = 1,
    private readonly maxBatch = 64,
    private readonly crash?: CrashHook,
    private readonly metrics?: EngineMetrics,
  ) {}

  submit(item: CommitItem, completes = false, trace?: SpanRef): Promise<CommitResult> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ item, runId: RUN_ID.exec(item)?.[1] ?? '', retries: 0, completes, trace, resolve, reject });
      if (this.inFlight < this.maxInFlight) this.sendAtEndOfTurn.request();
    });
  }

  /** A batch is in flight or about to be sent: a claim can ride on it. */
  get busy(): boolean {
    return this.inFlight > 0 || this.waiting.length > 0;
  }

  private send(): void {
    while (this.inFlight < this.maxInFlight && this.waiting.length > 0) {
      const batch = this.waiting.splice(0, this.maxBatch);
      this.inFlight++;
      void this.commit(batch).finally(() => {
        this.inFlight--;
        this.send();
        if (!this.busy) this.claimer?.commitIdle();
      });
    }
  }

  /** The batch's span, linked to the traced executions it writes for; none when none of them is traced. */
  private traceBatch(batch: Waiting[], claims: boolean): BatchTrace | undefined {
    if (!this.tracing) return undefined;
    const links = batch.flatMap((waiting) => (waiting.trace ? [waiting.trace] : []));
    return links.length > 0 ? this.tracing.startGroupCommit(batch.length, links, claims) : undefined;
  }

  private async commit(batch: Waiting[]): Promise<void> {
    // Locks taken in one order by every multi-run transaction of a worker cannot form a cycle.
    batch.sort((a, b) => (a.runId < b.runId ? -1 : a.runId > b.runId ? 1 : 0));
    const completions = batch.filter((w) => w.completes).length;
    const claim = this.claimer?.piggyback(completions);
    const span = this.traceBatch(batch, claim !== undefined);
    let rows: BatchRow[];
    try {
      rows = await this.statement(batch, claim);
      // A crash here leaves every item unsettled, as a dead process would.
      if (this.crash?.hit('after-group-commit', batch.length > 1 ? 'batch' : 'single')) return;
    } catch (error) {
      span?.end(error);
      claim?.settle(error as Error);
      await this.failed(batch, error);
      return;
    }
    span?.end(undefined, claim ? rows.filter((row) => row.item === null && row.run_id).length : undefined);
    if (claim) {
      const claimRows = rows.filter((row) => row.item === null);
      const failure = claimRows.find((row) => row.code);
      claim.settle(
        failure ? new BatchItemError(failure.code!, failure.message ?? `claim failed: ${failure.code}`) : claimRows.map(claimRowOf),
      );
    }
    this.answer(batch, rows);
  }

  /** One statement for these items (and the claim riding on it): its rows. */
  private async statement(batch: Waiting[], claim: PiggybackClaim | undefined): Promise<BatchRow[]> {
    const items = `[${batch.map((w) => w.item).join(',')}]`;
    const result = claim
      ? await this.pool.query<BatchRow>({
          name: 'runledger_commit_and_claim',
          text: BATCH_AND_CLAIM_SQL,
          values: [items, claim.workerId, claim.queues, claim.workflows, claim.limit, claim.leaseMs],
        })
      : await this.pool.query<BatchRow>({ name: 'runledger_commit_batch', text: BATCH_SQL, values: [items] });
    this.metrics?.groupCommitBatch(batch.length);
    return result.rows;
  }

  /**
   * The batch's statement failed as a whole. A lost connection leaves every item's outcome
   * unknown: each caller settles its own. Any other failure is an item's (a value the
   * statement could not take: one run's error must never fail another run's commit), so
   * the items go again in halves, each in its own statement and commit, until the guilty
   * item is alone: it alone gets the error, and the others commit once.
   */
  private async failed(batch: Waiting[], error: unknown): Promise<void> {
    if (isConnectionError(error) || batch.length === 1) {
      for (const waiting of batch) waiting.reject(error);
      return;
    }
    const middle = Math.ceil(batch.length / 2);
    for (const half of [batch.slice(0, middle), batch.slice(middle)]) {
      let rows: BatchRow[];
      try {
        rows = await this.statement(half, undefined);
      } catch (halfError) {
        await this.failed(half, halfError);
        continue;
      }
      this.answer(half, rows);
    }
  }

  /** Settles each item by its row: done, sent again (deadlock, serialization failure), or rejected with its own error. */
  private answer(batch: Waiting[], rows: BatchRow[]): void {
    for (const row of rows) {
      if (row.item === null) continue;
      const waiting = batch[row.item];
      if (!waiting) continue;
      if (row.code && RETRYABLE.has(row.code) && waiting.retries < ITEM_RETRIES) {
        // Its subtransaction was rolled back: nothing of it committed, so it goes again.
        waiting.retries++;
        this.waiting.push(waiting);
      } else if (row.code) waiting.reject(new BatchItemError(row.code, row.message ?? `error ${row.code}`));
      else waiting.resolve({ runStatus: row.run_status ?? undefined });
    }
    // A row missing for an item would be a bug in _commit_batch: never leave its caller hanging.
    const answered = rows.filter((row) => row.item !== null).length;
    for (let i = answered; i < batch.length; i++) batch[i]!.reject(new Error('runledger._commit_batch returned no row for an item'));
  }
}

/** A claim's row of _commit_and_claim without the item's columns: what _claim_batch returns. */
function claimRowOf(row: BatchRow): ClaimRow {
  const { item: _item, code: _code, message: _message, run_status: _status, ...claimed } = row;
  return claimed as ClaimRow;
}
