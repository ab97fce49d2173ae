import type { Transaction } from 'kysely';
import { monotonicMark, msSince } from '../engine/core/duration.js';
import {
  backoff,
  CHECKPOINT_PARAMS,
  checkpointValues,
  committed,
  flushPending,
  readCheckpointOutcome,
  writeCheckpoint,
} from '../engine/run/checkpoint.js';
import { haltOnDbError, isConstraintViolation } from '../engine/run/halts.js';
import { UNREADABLE, type Execution } from '../engine/run/execution.js';
import { unwrapOutput } from '../engine/core/migration.js';
import { isConnectionError, isRetryableTransactionError, pgCode } from '../engine/db/pg-errors.js';
import { encodeOutput, replayCheckpoint, stepFailure } from './replay.js';
import { inOwnTransaction } from '../engine/db/own-transaction.js';
import { streamsFlushed } from './stream.js';

/** How many times a transaction step is re-run after a serialization failure, deadlock or lost connection. */
export const TRANSACTION_TRIES = 10;

export type TransactionFunction<T, DB> = (trx: Transaction<DB>) => Promise<T>;

class UserFailure {
  constructor(readonly error: unknown) {}
}

/**
 * `ctx.transaction(name, fn)`: the user's writes, the fencing check and the
 * checkpoint commit in ONE transaction, so the writes happen exactly once.
 * Serialization failures and deadlocks re-run the whole transaction. A COMMIT
 * whose outcome the client did not see is resolved by reading whether the
 * checkpoint exists (after any in-flight transaction on the run has finished),
 * never by blindly running the step again.
 */
export async function runTransaction<T, DB>(exec: Execution, name: string, fn: TransactionFunction<T, DB>): Promise<T> {
  const position = exec.takeStep(name, 'transaction');
  if (!position) return exec.suspend();
  if (position.recorded) return replayCheckpoint<T>(position.recorded);
  if (!(await flushPending(exec))) return exec.suspend();
  if (exec.stopping) return exec.noNewStep();
  return exec.inStep(() => transactionAttempts(exec, name, position.seq, fn));
}

async function transactionAttempts<T, DB>(exec: Execution, name: string, seq: number, fn: TransactionFunction<T, DB>): Promise<T> {
  const startedAt = monotonicMark();
  for (let attempt = 1; ; attempt++) {
    if (exec.haltReason) return exec.suspend();
    // The pending charge goes with this attempt's commit; an attempt that fails gives it back.
    const charge = exec.takeCharge();
    let commitSent = false;
    let runStatus: string | undefined;
    try {
      const value = await inOwnTransaction<DB, unknown>(exec.deps.pool, async (tx) => {
        let encoded: { text: string | undefined; value: unknown };
        try {
          const trx = tx.trx;
          encoded = encodeOutput(
            exec,
            name,
            await (exec.trace ? exec.trace.child('transaction', name, seq, attempt, () => fn(trx)) : fn(trx)),
          );
        } catch (error) {
          // A transient database error inside the user's code re-runs the transaction; anything else fails the step.
          if (isRetryableTransactionError(error) || isConnectionError(error)) throw error;
          throw new UserFailure(error);
        }
        // The chunks the transaction's code wrote are stored before its checkpoint commits (stream.ts, streamsFlushed).
        const flushing = streamsFlushed(exec);
        if (flushing && !(await flushing)) throw new Error('execution halted');
        // Halted while the user's code ran (lease lost, shutdown): roll back, write nothing.
        if (exec.haltReason) throw new Error('execution halted');
        // A crash here rolls the transaction back (below), as a dead process's connection would.
        exec.deps.crash?.hit('before-checkpoint', name);
        if (exec.haltReason) throw new Error('execution halted');
        const record = {
          seq,
          name,
          kind: 'transaction' as const,
          status: 'SUCCEEDED' as const,
          outputText: encoded.text,
          error: undefined,
          attempts: attempt,
          startedAt,
        };
        // Fencing check (row lock on the run) and checkpoint, in the user's transaction, sent
        // with the COMMIT in one round trip (so its values are literals, not parameters).
        const values = checkpointValues(exec, record, charge);
        const args = CHECKPOINT_PARAMS.map((param, i) => `${param} => ${sqlLiteral(values[i], tx.literal)}`);
        commitSent = true;
        const written = await tx.finish<{ run_status: string }>(`select run_status from runledger._checkpoint(${args.join(', ')})`);
        runStatus = written[0]?.run_status;
        return encoded.value;
      });
      if (exec.deps.crash?.hit('after-commit', name)) return exec.suspend<T>();
      exec.deps.metrics?.commit('transaction');
      exec.deps.metrics?.stepFinished(exec.workflowName, name, 'transaction', 'SUCCEEDED', msSince(startedAt));
      committed(exec, runStatus, charge);
      return value as T;
    } catch (error) {
      if (exec.haltReason) return exec.suspend();
      if (error instanceof UserFailure) {
        exec.releaseCharge(charge); // the FAILED checkpoint carries it
        exec.deps.metrics?.stepFinished(exec.workflowName, name, 'transaction', 'FAILED', msSince(startedAt));
        const written = await writeCheckpoint(exec, {
          seq,
          name,
          kind: 'transaction',
          status: 'FAILED',
          outputText: undefined,
          error: error.error,
          attempts: attempt,
          startedAt,
        });
        if (!written.ok) return exec.suspend();
        throw stepFailure(name, exec.serializeError(error.error), error.error);
      }
      // RL codes, and a constraint broken at COMMIT (a deferred constraint): a replay would do the same.
      if (/^RL\d{3}$/.test(pgCode(error) ?? '') || isConstraintViolation(error)) {
        exec.releaseCharge(charge);
        haltOnDbError(exec, error, name);
        return exec.suspend();
      }
      if (commitSent && isConnectionError(error)) {
        const outcome = await readCheckpointOutcome(exec, seq).catch(() => undefined);
        if (outcome?.committed) {
          committed(exec, undefined, charge);
          const output = exec.readable(() => exec.payloads.decodeStepOutput('transaction', unwrapOutput(outcome.output)));
          if (output === UNREADABLE) return exec.suspend();
          return replayCheckpoint<T>([
            seq,
            name,
            outcome.status ?? 'SUCCEEDED',
            outcome.output === null ? null : [output],
            outcome.error,
            'transaction',
          ]);
        }
        if (outcome && !outcome.stillOwner) {
          exec.halt({ kind: 'lease_lost', message: `run ${exec.runId}: taken over while a commit was in doubt` });
          return exec.suspend();
        }
        // Not committed (or not known yet): nothing of this attempt is in the database; run it again.
      }
      exec.releaseCharge(charge); // not committed: the next attempt takes it again
      const transient = isRetryableTransactionError(error) || isConnectionError(error);
      if (!transient || attempt >= TRANSACTION_TRIES) {
        exec.halt({ kind: 'infrastructure', error });
        return exec.suspend();
      }
      await backoff(attempt);
    }
  }
}

/** A checkpoint value as an SQL literal: text quoted, numbers as they are, null as null (the function's parameters give the types). */
function sqlLiteral(value: unknown, quote: (text: string) => string): string {
  if (value === null || value === undefined) return 'null';
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new Error(`checkpoint value ${value} is not a finite number`);
    return String(value);
  }
  return quote(String(value));
}
