import type { ClaimedAtStart } from '../client/start.js';
import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { CheckpointRow } from '../run/execution.js';
import { isConnectionError } from '../db/pg-errors.js';
import type { LogFunction } from '../core/log.js';

const CLAIM_SQL =
  'select run_id, workflow_name, workflow_version, input, fencing_token, recovery_attempts, max_steps, budget, budget_spent, budget_limits, budget_used, ' +
  'cancel_requested, checkpoints, progress, next_due_in_ms, traceparent, execution_traceparent, lineage_id from runledger._claim_batch(p_worker_id => $1, p_queues => $2, p_workflows => $3, p_limit => $4, p_lease_ms => $5, p_reclaim_except => $6)';
const ERROR_BACKOFF_MS_MAX = 5_000;
/** setTimeout's ceiling; a due time further away is left to the poll. */
const TIMER_MS_MAX = 2 ** 31 - 1;

/**
 * A run as runledger._claim_batch hands it over: a new fencing token, a lease, its
 * checkpoints. A run claimed at its start (ClaimedAtStart) is the same without them.
 */
export interface ClaimedRun extends ClaimedAtStart {
  cancel_requested: boolean;
  checkpoints: CheckpointRow[];
  progress: Record<string, unknown> | null;
}

/**
 * A row of runledger._claim_batch: a claimed run, or (run_id null) how long until the next
 * run is due, in ms on the database clock (a bigint: text from pg, a number from JSON).
 */
export type ClaimRow = (ClaimedRun & { next_due_in_ms: string | number | null }) | { run_id: null; next_due_in_ms: string | number | null };

export interface PiggybackClaim {
  workerId: string;
  queues: string[];
  workflows: string[];
  limit: number;
  leaseMs: number;
  /** The claim's rows, or the error that failed the transaction it rode in. */
  settle(outcome: ClaimRow[] | Error): void;
}

export interface DispatcherOptions {
  pool: pg.Pool;
  workerId: string;
  queues: string[];
  /** workflow@version keys this worker can execute. */
  workflows: string[];
  leaseMs: number;
  concurrency: number;
  /** Most runs claimed per query. */
  batchSize: number;
  /** Look for work at least this often, whatever the notifications said. */
  pollIntervalMs: number;
  /** Runs this worker executes right now. */
  executing(): string[];
  /** The worker's group commit is busy: the next claim rides on its next batch (piggyback) instead of going alone. */
  commitBusy?(): boolean;
  /** Starts executing a claimed run; the worker calls slotFreed() when it ends. */
  execute(run: ClaimedRun): void;
  log: LogFunction;
  /** Claims only when told (claimOnce): no poll, no notifications, no piggyback (a manual worker, for tests). */
  manual?: boolean;
}

/**
 * Takes runnable runs from runledger.runs for a worker: one round trip claims as many
 * as there are free slots (runledger._claim_batch, SKIP LOCKED). It looks when told
 * that work may be there (a NOTIFY, a due time, a freed slot after a full batch, the
 * poll) and never has more than one claim in flight. While the worker's group commit
 * is busy, the claim rides on its next batch instead (piggyback): the slots that
 * batch's completions free are refilled in the same transaction.
 */
export class Dispatcher {
  private claiming: Promise<void> | undefined;
  /** Something may be claimable: set by every hint, cleared by a claim that found less than it asked for. */
  private mayHaveWork = true;
  /** A claim whose reply was lost may have committed: the next claim takes back our own runs too. */
  private reclaim = false;
  private stopped = false;
  private failures = 0;
  /** Which served queue the next claim looks at first: turns, so a busy queue cannot starve the others. */
  private turn = 0;
  private dueTimer: NodeJS.Timeout | undefined;
  /** When the armed timer fires, on performance.now(). */
  private dueAt = Infinity;
  private readonly pollTimer: NodeJS.Timeout | undefined;
  private readonly served: Set<string>;
  /**
   * Starts of this process in flight that were promised a slot (takeLocal): each holds it
   * until its run executes here or it claimed nothing, so claims leave it alone and more
   * starts than free slots are announced to the workers of other processes.
   */
  private promised = 0;
  /** The run ids of those starts (a start knows its run's id before it asks), with how many starts name each. */
  private readonly starting = new Map<string, number>();

  constructor(private readonly options: DispatcherOptions) {
    this.served = new Set(options.queues);
    if (options.manual) return;
    this.pollTimer = setInterval(() => this.hint(), options.pollIntervalMs);
    this.hint();
  }

  /** Work may be claimable (a notification lost or not, a poll tick). */
  hint(): void {
    this.mayHaveWork = true;
    this.pump();
  }

  /** Runs leased to this worker that it does not execute: the next claim takes them back. */
  reclaimUnexecuted(): void {
    this.reclaim = true;
    this.hint();
  }

  /** A runledger_runnable notification: "queue" (runnable now) or "queue+ms" (runnable in that many ms, by the database's clock). */
  notified(payload: string): void {
    const plus = payload.lastIndexOf('+');
    const queue = plus === -1 ? payload : payload.slice(0, plus);
    if (!this.served.has(queue)) return;
    const delayMs = plus === -1 ? NaN : Number(payload.slice(plus + 1));
    if (Number.isFinite(delayMs) && delayMs > 0) this.armIn(delayMs);
    else this.hint();
  }

  /**
   * A start in this process asks whether this worker takes its run: true when the worker
   * serves the queue and has a free slot no other local start was promised. The caller
   * then claims the run for this worker in its start's transaction; either way it settles
   * the promise (settlePromise) when done.
   */
  takeLocal(queue: string, runId: string): boolean {
    if (this.options.manual || this.stopped || !this.served.has(queue)) return false;
    if (this.freeSlots() <= 0) return false;
    this.promised++;
    this.starting.set(runId, (this.starting.get(runId) ?? 0) + 1);
    return true;
  }

  /**
   * The start a slot was promised to is done: its run executes here now (claimed in the
   * start's transaction), or it claimed nothing and the slot is free again.
   */
  settlePromise(runId: string): void {
    const count = this.starting.get(runId);
    if (count === undefined) return;
    if (count > 1) this.starting.set(runId, count - 1);
    else this.starting.delete(runId);
    this.promised = Math.max(0, this.promised - 1);
  }

  /** Whether a start of this process that was promised a slot for this run is still in flight (settlePromise not called yet). */
  isStarting(runId: string): boolean {
    return this.starting.has(runId);
  }

  /** A run ended here: its slot can take the next run. */
  slotFreed(): void {
    this.pump();
  }

  /** Claims nothing more; resolves once a claim in flight has handed over its runs. */
  async stop(): Promise<void> {
    this.stopped = true;
    clearInterval(this.pollTimer);
    if (this.dueTimer) clearTimeout(this.dueTimer);
    await this.claiming;
  }

  /**
   * Claims again in delayMs. The database gives delays, never times; the timer is kept on
   * this process's monotonic clock, so neither the worker's wall clock nor its offset from
   * the database's matters.
   */
  private armIn(delayMs: number): void {
    if (this.options.manual || this.stopped) return;
    const dueMs = performance.now() + delayMs;
    if (dueMs >= this.dueAt) return;
    if (this.dueTimer) clearTimeout(this.dueTimer);
    this.dueAt = dueMs;
    this.dueTimer = setTimeout(
      () => {
        this.dueTimer = undefined;
        this.dueAt = Infinity;
        this.hint();
      },
      Math.min(TIMER_MS_MAX, Math.max(0, delayMs)),
    );
  }

  /** Slots neither executing a run nor promised to a start of this process (takeLocal). */
  private freeSlots(): number {
    return this.options.concurrency - this.options.executing().length - this.promised;
  }

  /** The group commit went idle: a claim it would have carried goes alone. */
  commitIdle(): void {
    this.pump();
  }

  private pump(): void {
    if (this.options.manual || this.stopped || this.claiming || !this.mayHaveWork || this.freeSlots() <= 0) return;
    if (this.options.commitBusy?.()) return; // its next batch carries the claim
    this.claiming = this.claim().finally(() => {
      this.claiming = undefined;
      this.pump();
    });
  }

  /**
   * A claim that rides on the worker's next group commit (runledger._commit_and_claim):
   * the runs its completions free are refilled in the same transaction, saving a round
   * trip and a commit. Undefined when this dispatcher would not claim now.
   */
  piggyback(completions: number): PiggybackClaim | undefined {
    if (this.options.manual || this.stopped || this.claiming || !this.mayHaveWork || this.reclaim) return undefined;
    const limit = Math.min(this.options.batchSize, this.freeSlots() + completions);
    if (limit <= 0) return undefined;
    const queues = this.nextQueueOrder();
    this.mayHaveWork = false;
    let settled!: () => void;
    this.claiming = new Promise<void>((resolve) => (settled = resolve)).finally(() => {
      this.claiming = undefined;
      this.pump();
    });
    return {
      workerId: this.options.workerId,
      queues,
      workflows: this.options.workflows,
      limit,
      leaseMs: this.options.leaseMs,
      settle: (outcome) => {
        // The claim's transaction is the commit's: a lost reply leaves both unknown.
        if (outcome instanceof Error) this.failed(outcome);
        else this.handOver(outcome, limit);
        settled();
      },
    };
  }

  private nextQueueOrder(): string[] {
    const { queues } = this.options;
    const first = this.turn++ % queues.length;
    return [...queues.slice(first), ...queues.slice(0, first)];
  }

  /** One claim now, for a manual worker: starts the runs it took and returns how many. */
  async claimOnce(): Promise<number> {
    if (this.stopped || this.freeSlots() <= 0) return 0;
    await this.claiming;
    let claimed = 0;
    this.claiming = this.claim((count) => (claimed = count)).finally(() => {
      this.claiming = undefined;
    });
    await this.claiming;
    return claimed;
  }

  private async claim(onClaimed?: (count: number) => void): Promise<void> {
    const limit = Math.min(this.options.batchSize, this.freeSlots());
    // Hints that arrive while this claim runs may concern runs its snapshot cannot see.
    this.mayHaveWork = false;
    const reclaim = this.reclaim;
    const ordered = this.nextQueueOrder();
    let rows: ClaimRow[];
    try {
      const result = await this.options.pool.query({
        name: 'runledger_claim_batch',
        text: CLAIM_SQL,
        values: [
          this.options.workerId,
          ordered,
          this.options.workflows,
          limit,
          this.options.leaseMs,
          reclaim ? this.options.executing() : null,
        ],
      });
      rows = result.rows;
      this.reclaim = false;
    } catch (error) {
      this.failed(error);
      if (this.options.manual) throw error;
      const delay = Math.min(ERROR_BACKOFF_MS_MAX, 100 * 2 ** Math.min(this.failures, 6));
      await new Promise((resolve) => setTimeout(resolve, delay));
      return;
    }
    const claimed = this.handOver(rows, limit);
    onClaimed?.(claimed);
  }

  private failed(error: unknown): void {
    if (isConnectionError(error)) this.reclaim = true;
    this.failures++;
    this.options.log('warn', 'claim failed; trying again', { error: serializeError(error) });
    this.mayHaveWork = true;
  }

  /** Starts the claimed runs; the row without a run says when the next one is due. */
  private handOver(rows: ClaimRow[], limit: number): number {
    this.failures = 0;
    let claimed = 0;
    for (const row of rows) {
      if (row.run_id === null) {
        if (row.next_due_in_ms !== null) this.armIn(Number(row.next_due_in_ms));
        continue;
      }
      claimed++;
      this.options.execute(row);
    }
    // A full batch: more may be waiting, and the next freed slot looks at once.
    if (claimed >= limit) this.mayHaveWork = true;
    return claimed;
  }
}
