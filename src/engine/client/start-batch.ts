import type pg from 'pg';
import { isConnectionError } from '../db/pg-errors.js';
import { EndOfTurn } from '../core/end-of-turn.js';

/** One engine.start: as start_run, or (given a worker of this process) as runledger._start_claimed. */
export interface BatchedStart {
  /** The run id the start asks for (start_run's run_id option). */
  runId: string;
  workflow: string;
  /** The input as JSON text (undefined: none). */
  inputText: string | undefined;
  /** start_run's options, as JSON text. */
  optionsText: string;
  /** The worker of this process that takes the run, and its lease. */
  claimFor?: { workerId: string; leaseMs: number };
}

/** A row of runledger._start_claimed: claimed, with the run's fields, or not (see its comment); a plain start's is not claimed. */
export type StartedRow = Record<string, unknown> & { run_id: string; claimed: boolean };

interface Waiting {
  start: BatchedStart;
  resolve: (row: StartedRow) => void;
  reject: (error: unknown) => void;
}

const COLUMNS =
  'run_id, claimed, workflow_name, workflow_version, input, fencing_token, recovery_attempts, max_steps, budget, budget_spent, budget_limits, budget_used, traceparent';
const CLAIMED_SQL = `select ${COLUMNS} from runledger._start_claimed(p_workflow => $1, p_input => $2::jsonb, p_options => $3::jsonb, p_worker_id => $4, p_lease_ms => $5)`;
const PLAIN_SQL = 'select runledger.start_run(p_workflow => $1, p_input => $2::jsonb, p_options => $3::jsonb) as run_id';
const MANY_SQL = `select item, ${COLUMNS} from runledger._start_many(p_items => $1::jsonb)`;

/**
 * Group commit of a process's starts, as its worker's group commit does for checkpoints
 * (worker/group-commit.ts): starts made while none is in flight are sent together at the
 * end of the event loop's turn (callers awaiting results the worker completed in one batch
 * all resume, and start again, in the same turn); starts made while one is in flight wait
 * for it and then go together, in one statement and one commit (runledger._start_many),
 * whether this process's worker takes their runs or not. Idle, a start waits only for its
 * turn to end; under load the batches grow by themselves. Sent at once instead, the first
 * start of each turn went alone: in the closed loop of 16 callers (bench, PG 15, three
 * alternations of three repetitions) 1,079-1,419 workflows/s against 1,160-2,043 waiting
 * for the turn. One batch in flight: in the closed loop of 16 callers
 * (bench/profile-closedloop.ts) two in flight gave 912-991 workflows/s and more server CPU
 * per workflow, one 980-1,080.
 *
 * Every start keeps its own answer: a batch that fails on a database error (a run id of
 * another workflow, say) was undone whole, and each of its starts is sent again alone. A
 * batch whose reply is lost (the connection broke) rejects each start with that error, as
 * a lone start's would: whether it committed is unknown, and its caller settles that as for
 * any start (the run id it asked for makes a second start idempotent).
 */
export class StartBatcher {
  private waiting: Waiting[] = [];
  private inFlight = 0;
  /** Sends what this turn of the event loop submitted, once, when the turn ends. */
  private readonly sendAtEndOfTurn = new EndOfTurn(() => this.send());

  constructor(
    private readonly pool: pg.Pool,
    private readonly maxInFlight = 1,
    private readonly maxBatch = 64,
  ) {}

  submit(start: BatchedStart): Promise<StartedRow> {
    return new Promise((resolve, reject) => {
      this.waiting.push({ start, resolve, reject });
      if (this.inFlight < this.maxInFlight) this.sendAtEndOfTurn.request();
    });
  }

  private send(): void {
    while (this.inFlight < this.maxInFlight && this.waiting.length > 0) {
      const batch = this.waiting.splice(0, this.maxBatch);
      this.inFlight++;
      void (batch.length === 1 ? this.one(batch[0]!) : this.many(batch)).finally(() => {
        this.inFlight--;
        this.send();
      });
    }
  }

  private async one(waiting: Waiting): Promise<void> {
    const { start } = waiting;
    const values = [start.workflow, start.inputText ?? null, start.optionsText];
    try {
      if (start.claimFor) {
        const result = await this.pool.query<StartedRow>({
          name: 'runledger_start_claimed',
          text: CLAIMED_SQL,
          values: [...values, start.claimFor.workerId, start.claimFor.leaseMs],
        });
        waiting.resolve(result.rows[0]!);
      } else {
        const result = await this.pool.query<{ run_id: string }>({ name: 'runledger_start_run', text: PLAIN_SQL, values });
        waiting.resolve({ run_id: result.rows[0]!.run_id, claimed: false });
      }
    } catch (error) {
      waiting.reject(error);
    }
  }

  private async many(batch: Waiting[]): Promise<void> {
    // An idempotent start locks the run it finds: in run id order, as a group commit locks its runs.
    batch.sort((a, b) => (a.start.runId < b.start.runId ? -1 : a.start.runId > b.start.runId ? 1 : 0));
    const items = `[${batch
      .map(
        ({ start }) =>
          `{"workflow":${JSON.stringify(start.workflow)},${start.inputText === undefined ? '' : `"input":${start.inputText},`}` +
          `"options":${start.optionsText}` +
          (start.claimFor ? `,"worker_id":${JSON.stringify(start.claimFor.workerId)},"lease_ms":${start.claimFor.leaseMs}}` : '}'),
      )
      .join(',')}]`;
    let rows: Array<StartedRow & { item: number }>;
    try {
      rows = (await this.pool.query<StartedRow & { item: number }>({ name: 'runledger_start_many', text: MANY_SQL, values: [items] })).rows;
    } catch (error) {
      if (isConnectionError(error)) {
        for (const waiting of batch) waiting.reject(error);
        return;
      }
      // Undone whole: each start again alone, for its own answer.
      await Promise.all(batch.map((waiting) => this.one(waiting)));
      return;
    }
    for (const row of rows) {
      const { item, ...fields } = row;
      batch[item]?.resolve(fields as StartedRow);
    }
    // A row missing for an item would be a bug in _start_many: never leave its caller hanging.
    for (let i = rows.length; i < batch.length; i++) batch[i]!.reject(new Error('runledger._start_many returned no row for a start'));
  }
}
