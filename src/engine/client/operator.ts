import type pg from 'pg';
import { newId } from '../core/ids.js';
import { InvalidInputError, fromPgError } from '../core/errors.js';
import { assertStorableInputs, inputJsonText } from '../core/json.js';
import type { RunStatus } from '../core/states.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';

/**
 * Operator actions: each is one SQL function call, the same one psql users call. A payload
 * they carry (a signal's, a decision's note, a resolution's result) goes through the
 * engine's codec first, so the SQL function receives, and stores, what the codec made of it.
 */

export async function sendSignal(
  pool: pg.Pool,
  runId: string,
  topic: string,
  payload: unknown,
  signalId: string = newId(),
  payloads: Payloads = NO_CODEC,
): Promise<boolean> {
  assertStorableInputs('engine.signal', { runId, topic, signalId });
  // As send_signal checks it (RL003): the inbox keeps signal ids of 1 to 200 characters.
  if (typeof signalId !== 'string' || [...signalId].length < 1 || [...signalId].length > 200) {
    throw new InvalidInputError(`engine.signal: signalId must be a string of 1 to 200 characters, not ${describeSignalId(signalId)}`);
  }
  const payloadText = payloads.optionalText(inputJsonText(payload, `signal ${topic} payload`));
  try {
    const result = await pool.query(
      'select runledger.send_signal(p_run_id => $1, p_topic => $2, p_payload => $3::jsonb, p_signal_id => $4) as accepted',
      [runId, topic, payloadText ?? null, signalId],
    );
    return result.rows[0].accepted;
  } catch (error) {
    throw fromPgError(error);
  }
}

function describeSignalId(signalId: unknown): string {
  return typeof signalId === 'string' ? `${[...signalId].length} characters` : typeof signalId;
}

export interface DecisionInput {
  approved: boolean;
  decidedBy: string;
  note?: string;
}

export interface DecisionRecord {
  /** False when an earlier decision stands (the first decision wins), or this decider already voted. */
  recorded: boolean;
  requestId: string;
  /** null while a request that needs several approvals waits for more. */
  approved: boolean | null;
  decidedBy: string | null;
  decidedAt: string | null;
  note: string | null;
  /** With requires: the approvals needed, and every decision so far. */
  required?: number;
  votes?: Array<{ decidedBy: string; approved: boolean; note: string | null; decidedAt: string }>;
}

export async function decideApproval(
  pool: pg.Pool,
  requestId: string,
  decision: DecisionInput,
  payloads: Payloads = NO_CODEC,
): Promise<DecisionRecord> {
  assertStorableInputs('engine.decideApproval', { requestId, decidedBy: decision.decidedBy, note: decision.note });
  try {
    const result = await pool.query(
      'select runledger.decide_approval(p_request_id => $1, p_approved => $2, p_decided_by => $3, p_note => $4) as decision',
      [requestId, decision.approved, decision.decidedBy, payloads.note(decision.note)],
    );
    const d = result.rows[0].decision;
    const votes = d.votes as DecisionRecord['votes'];
    return {
      recorded: d.recorded,
      requestId: d.request_id,
      approved: d.approved,
      decidedBy: d.decided_by ?? null,
      decidedAt: d.decided_at ?? null,
      note: payloads.decodeNote(d.note ?? null),
      ...(d.required === undefined
        ? {}
        : { required: d.required, votes: votes?.map((vote) => ({ ...vote, note: payloads.decodeNote(vote.note) })) }),
    };
  } catch (error) {
    throw fromPgError(error);
  }
}

export async function cancelRun(pool: pg.Pool, runId: string, reason?: string): Promise<RunStatus> {
  assertStorableInputs('engine.cancel', { runId, reason });
  try {
    const result = await pool.query('select runledger.cancel_run(p_run_id => $1, p_reason => $2) as status', [runId, reason ?? null]);
    return result.rows[0].status;
  } catch (error) {
    throw fromPgError(error);
  }
}

/**
 * Runs the compensations of a finished run (FAILED, CANCELLED, TERMINATED, DEAD_LETTER)
 * that are not DONE, a FAILED one again: CANCELLING while a worker runs them, or the
 * run's status when nothing is left to compensate.
 */
export async function compensateRun(pool: pg.Pool, runId: string, reason?: string): Promise<RunStatus> {
  assertStorableInputs('engine.compensate', { runId, reason });
  try {
    const result = await pool.query('select runledger.compensate_run(p_run_id => $1, p_reason => $2) as status', [runId, reason ?? null]);
    return result.rows[0].status;
  } catch (error) {
    throw fromPgError(error);
  }
}

export async function resolveOperation(
  pool: pg.Pool,
  operationId: string,
  resolution: { status: 'SUCCEEDED' | 'FAILED'; result?: unknown; resolvedBy?: string },
  payloads: Payloads = NO_CODEC,
): Promise<'SUCCEEDED' | 'FAILED'> {
  // A SUCCEEDED operation's result is a payload; a FAILED one's is its error, which stays clear like every error.
  assertStorableInputs('engine.resolveOperation', { operationId, resolvedBy: resolution.resolvedBy });
  const text = inputJsonText(resolution.result, 'resolveOperation result');
  const resultText = resolution.status === 'SUCCEEDED' ? payloads.optionalText(text) : text;
  try {
    const result = await pool.query(
      'select runledger.resolve_operation(p_operation_id => $1, p_status => $2, p_result => $3::jsonb, p_resolved_by => $4) as status',
      [operationId, resolution.status, resultText ?? null, resolution.resolvedBy ?? null],
    );
    return result.rows[0].status;
  } catch (error) {
    throw fromPgError(error);
  }
}

export async function forkRun(pool: pg.Pool, runId: string, fromStep: number, version?: string): Promise<string> {
  assertStorableInputs('engine.fork', { runId, version });
  try {
    const result = await pool.query('select runledger.fork_run(p_run_id => $1, p_from_step => $2, p_version => $3) as run_id', [
      runId,
      fromStep,
      version ?? null,
    ]);
    return result.rows[0].run_id;
  } catch (error) {
    throw fromPgError(error);
  }
}
