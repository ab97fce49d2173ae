import type { Transaction } from 'kysely';
import type { Execution } from '../engine/execution.js';
import { runStep, type StepFunction } from './step.js';
import { runTransaction, type TransactionFunction } from './transaction.js';

/**
 * What a workflow function receives: explicit, no globals. Each call takes the
 * next step position; on replay a position with a checkpoint returns the
 * recorded result without running anything.
 */
export class WorkflowContext {
  readonly #exec: Execution;

  constructor(exec: Execution) {
    this.#exec = exec;
  }

  get runId(): string {
    return this.#exec.runId;
  }

  /** 1 for the first execution of the run; +1 for every recovery after a lost lease. */
  get attempt(): number {
    return this.#exec.attempt;
  }

  /** Fires when the run is cancelled or this worker lost its lease. */
  get abortSignal(): AbortSignal {
    return this.#exec.abortController.signal;
  }

  /** Runs `fn` at least once until its result is checkpointed, never again after. */
  step<T>(name: string, fn: StepFunction<T>): Promise<T> {
    return runStep(this.#exec, name, fn);
  }

  /**
   * Runs `fn` inside one database transaction that also checks the fencing token
   * and writes the checkpoint: the writes made through `trx` happen exactly once.
   */
  transaction<T, DB = any>(name: string, fn: TransactionFunction<T, DB>): Promise<T> {
    return runTransaction<T, DB>(this.#exec, name, fn as (trx: Transaction<DB>) => Promise<T>);
  }

  /** The current time, recorded once and replayed: deterministic across recoveries. */
  async now(name = 'now'): Promise<Date> {
    const iso = await runStep(this.#exec, `@${name}`, () => new Date().toISOString());
    return new Date(iso);
  }
}
