import { sql } from 'kysely';
import type { StepContext } from '../steps/context.js';
import { UNREADABLE, type Execution } from '../engine/run/execution.js';
import type { Payloads } from '../engine/core/payloads.js';
import { toMs, type Duration } from '../engine/core/duration.js';
import { toJsonText } from '../engine/core/json.js';
import { toBudgetAmounts, toSqlLimits, type BudgetAmounts } from '../engine/core/budget.js';
import { budgetStateOf, type BudgetColumns } from '../engine/run/budget-state.js';
import { pgCode } from '../engine/db/pg-errors.js';
import {
  InvalidInputError,
  NotSerializableError,
  PayloadTooLargeError,
  SessionNotHeldError,
  SessionTimeoutError,
  StepFailedError,
} from '../engine/core/errors.js';

export type SessionRole = 'system' | 'user' | 'assistant' | 'tool';
export const SESSION_ROLES: readonly SessionRole[] = ['system', 'user', 'assistant', 'tool'];

/**
 * A session id is a name (the same rule as sql/0012_agents.sql): letters, digits and
 * `_ . : / -`, starting with a letter or digit, at most 92 characters, so that its
 * wake-up topic `session:<id>` fits a topic's 100.
 */
export const SESSION_ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/-]*$/;
export const SESSION_ID_MAX_LENGTH = 92;

/** One entry of a session's history, as appended. `content` is any JSON value. */
export interface SessionEntry {
  role: SessionRole;
  content: unknown;
}

/** An entry as stored: its place in the session and the run and step position that appended it. */
export interface StoredSessionEntry extends SessionEntry {
  seq: number;
  runId: string;
  stepPosition: number;
  createdAt: string;
}

export interface SessionOptions {
  /** How long to wait for another run holding the session; default: as long as it takes. Past it: SessionTimeoutError. */
  timeout?: Duration;
  /**
   * The session's budget, across every run that holds it (a number is units; else
   * `{ units, tokens, costUsd, toolCalls, turns }`). It replaces the session's budget; without
   * it a budget set earlier (by another run, or set_session_budget) still applies. While
   * this run holds the session it may spend no more than the session has left: past it the
   * run ends TERMINATED (BUDGET), the session named in the evidence. docs/sessions.md#budgets.
   */
  budget?: number | BudgetAmounts;
}

export interface Session {
  readonly id: string;
  /** The entries in order, as this run saw them at this point of its history (the same on every replay). */
  history(): Promise<StoredSessionEntry[]>;
  /** Appends the entries, committed with this step's checkpoint: a replay never appends them again. */
  append(entries: SessionEntry[]): Promise<void>;
  /** Lets go of the session: the next run queued for it gets it. A second call does nothing. */
  release(): Promise<void>;
}

/** What the acquisition step recorded (its checkpoint). */
type Acquired = { held: true; entry_count: number } | { held: false; holder: string | null; position?: number };

/**
 * Whether this execution holds a session, and the session's entry count when it took it:
 * shared by every Session object of one id in one execution, so a release through one is
 * seen by all. Rebuilt on replay from the recorded steps, in the same order.
 */
interface Hold {
  held: boolean;
  entryCount: number;
}
const holds = new WeakMap<Execution, Map<string, Hold>>();

function holdOf(exec: Execution, sessionId: string): Hold {
  let byId = holds.get(exec);
  if (!byId) holds.set(exec, (byId = new Map()));
  let hold = byId.get(sessionId);
  if (!hold) byId.set(sessionId, (hold = { held: false, entryCount: 0 }));
  return hold;
}

export function checkSessionId(sessionId: unknown): asserts sessionId is string {
  if (typeof sessionId !== 'string' || !SESSION_ID_PATTERN.test(sessionId) || sessionId.length > SESSION_ID_MAX_LENGTH) {
    throw new InvalidInputError(
      `invalid session id ${JSON.stringify(sessionId)}: a name of letters, digits and _ . : / - (starting with a letter or digit), at most ${SESSION_ID_MAX_LENGTH} characters`,
      { details: { sessionId } },
    );
  }
}

/**
 * `ctx.session(id)`: holds the session for this run. The acquisition is a transaction
 * step (holding, or queueing, commits with its checkpoint); a run that finds it held waits
 * durably for the hand-off signal (WAITING on topic `session:<id>`, no worker held), then
 * checks again. Every step is recorded, so a replay walks the same path without waiting.
 */
export async function openSession(ctx: StepContext, exec: Execution, sessionId: string, options: SessionOptions = {}): Promise<Session> {
  checkSessionId(sessionId);
  const timeoutMs = options.timeout === undefined ? undefined : toMs(options.timeout, `session ${sessionId} timeout`);
  const budget =
    options.budget === undefined ? null : JSON.stringify(toSqlLimits(toBudgetAmounts(options.budget, `session ${sessionId} budget`)));
  const hold = holdOf(exec, sessionId);
  const runId = exec.runId;
  // The run's budget columns once the session's budget holds it (set only when the step ran, not on replay).
  let columns: BudgetColumns | undefined;
  // Taking the session, the run is held to its budget's remainder, in the same transaction.
  const holdBudget = async (trx: Parameters<Parameters<StepContext['transaction']>[1]>[0]) => {
    const result =
      await sql<BudgetColumns>`select * from runledger._session_budget_hold(p_session_id => ${sessionId}, p_run_id => ${runId}, p_budget => ${budget}::jsonb)`.execute(
        trx,
      );
    columns = result.rows[0];
  };
  const taken = (entryCount: number) => {
    if (columns) exec.budgetState = budgetStateOf(columns);
    return held(ctx, exec, sessionId, hold, entryCount);
  };
  let deadline: Date | undefined;
  for (;;) {
    const answer = (await ctx.transaction(`session:${sessionId}:open`, async (trx) => {
      const result = await sql<{
        answer: Acquired;
      }>`select runledger._session_acquire(p_session_id => ${sessionId}, p_run_id => ${runId}) as answer`.execute(trx);
      const acquired = result.rows[0]!.answer;
      if (acquired.held) await holdBudget(trx);
      return acquired;
    })) as Acquired;
    if (answer.held) return taken(answer.entry_count);
    if (timeoutMs !== undefined) deadline ??= new Date((await ctx.now(`session:${sessionId}:since`)).getTime() + timeoutMs);
    const signal = await ctx.waitForSignal(`session:${sessionId}`, {
      name: `session:${sessionId}:wait`,
      ...(deadline ? { timeout: deadline } : {}),
    });
    if (signal !== null) continue; // handed over (or a stale signal): the next open step checks
    const left = (await ctx.transaction(`session:${sessionId}:leave`, async (trx) => {
      const result = await sql<{
        answer: Acquired;
      }>`select runledger._session_leave(p_session_id => ${sessionId}, p_run_id => ${runId}) as answer`.execute(trx);
      const acquired = result.rows[0]!.answer;
      if (acquired.held) await holdBudget(trx);
      return acquired;
    })) as Acquired;
    if (left.held) return taken(left.entry_count);
    throw new SessionTimeoutError(`session ${sessionId}: still held by run ${left.holder ?? '?'} after ${timeoutMs} ms`, {
      sessionId,
      holder: left.holder,
      timeoutMs,
    });
  }
}

function held(ctx: StepContext, exec: Execution, sessionId: string, hold: Hold, entryCount: number): Session {
  hold.held = true;
  hold.entryCount = entryCount;
  return new HeldSession(ctx, exec, sessionId, hold);
}

class HeldSession implements Session {
  constructor(
    private readonly ctx: StepContext,
    private readonly exec: Execution,
    readonly id: string,
    private readonly hold: Hold,
  ) {}

  private assertHeld(what: string): void {
    this.exec.assertLive(`session.${what}()`);
    if (!this.hold.held) {
      throw new SessionNotHeldError(`session.${what}(): run ${this.exec.runId} does not hold session ${this.id} (it released it)`, {
        details: { sessionId: this.id, runId: this.exec.runId },
      });
    }
  }

  /**
   * The entries there were when this run took the session, and those this run appended
   * at earlier step positions: what the first execution saw at this point. Entries of
   * later positions (a replay finds them already written) and of other runs after the
   * acquisition (possible only once the session was taken from this run) are left out.
   */
  async history(): Promise<StoredSessionEntry[]> {
    this.assertHeld('history');
    const position = this.exec.stepsTaken;
    const result = await this.exec.deps.pool.query<{
      seq: number;
      role: SessionRole;
      content: unknown;
      run_id: string;
      step_position: number;
      created_at: Date;
    }>(
      // The session of this run's tenant: another tenant's session of the same id is another
      // history.
      `select seq, role, content, run_id, step_position, created_at from runledger.session_entries
        where session_id = $1 and tenant_id = coalesce((select r.tenant_id from runledger.runs r where r.run_id = $3), '')
          and (seq <= $2 or (run_id = $3 and step_position < $4))
        order by seq`,
      [this.id, this.hold.entryCount, this.exec.runId, position],
    );
    const payloads = this.exec.payloads;
    const entries = this.exec.readable(() =>
      result.rows.map((row) => ({
        seq: row.seq,
        role: row.role,
        content: payloads.decode(row.content),
        runId: row.run_id,
        stepPosition: row.step_position,
        createdAt: row.created_at.toISOString(),
      })),
    );
    return entries === UNREADABLE ? this.exec.suspend() : entries;
  }

  async append(entries: SessionEntry[]): Promise<void> {
    this.assertHeld('append');
    const text = entriesText(this.id, entries, this.exec.deps.maxPayloadBytes, this.exec.payloads);
    // Checked in clear (entriesText has checked they are JSON): with a codec, text is the envelope.
    this.exec.checkPayload(JSON.stringify(entries), `the entries appended to session ${this.id}`);
    if (text === undefined) return; // nothing to append: no step
    // The position the transaction below takes (taken synchronously, before any await).
    const position = this.exec.stepsTaken;
    const { id } = this;
    const runId = this.exec.runId;
    try {
      await this.ctx.transaction(`session:${id}:append`, async (trx) => {
        try {
          const result = await sql<{
            appended: unknown;
          }>`select runledger._session_append(p_session_id => ${id}, p_run_id => ${runId}, p_position => ${position}, p_entries => ${text}::jsonb) as appended`.execute(
            trx,
          );
          return result.rows[0]!.appended;
        } catch (error) {
          if (pgCode(error) === 'RL005') {
            throw new SessionNotHeldError((error as Error).message, { details: { sessionId: id, runId } });
          }
          throw error;
        }
      });
    } catch (error) {
      // Recorded as the step's failure (on replay too): the caller gets the coded error back.
      if (error instanceof StepFailedError && error.originalCode === 'SESSION_NOT_HELD') {
        this.hold.held = false;
        throw new SessionNotHeldError(String(error.details?.message ?? error.message), {
          cause: error,
          details: { sessionId: id, runId },
        });
      }
      throw error;
    }
  }

  async release(): Promise<void> {
    this.exec.assertLive('session.release()');
    if (!this.hold.held) return;
    const { id } = this;
    const runId = this.exec.runId;
    let columns: BudgetColumns | undefined;
    await this.ctx.transaction(`session:${id}:release`, async (trx) => {
      const result = await sql<{
        released: boolean;
      }>`select runledger._session_release(p_session_id => ${id}, p_run_id => ${runId}) as released`.execute(trx);
      // Its own limits are back if the session had a budget.
      columns = (
        await sql<BudgetColumns>`select budget, budget_spent, budget_limits, budget_used from runledger.runs where run_id = ${runId}`.execute(
          trx,
        )
      ).rows[0];
      return result.rows[0]!.released;
    });
    if (columns) this.exec.budgetState = budgetStateOf(columns);
    this.hold.held = false;
  }
}

/**
 * The entries as the JSON text of one append, checked: roles, JSON content, the payload
 * limit (on what is stored: with a codec, each content is its envelope). undefined for none.
 */
function entriesText(sessionId: string, entries: unknown, maxBytes: number, payloads: Payloads): string | undefined {
  if (!Array.isArray(entries)) {
    throw new InvalidInputError(`session ${sessionId}: append takes an array of entries {role, content}`, { details: { sessionId } });
  }
  if (entries.length === 0) return undefined;
  const normalized = entries.map((entry: unknown, index) => {
    const e = entry as { role?: unknown; content?: unknown } | null;
    if (typeof e !== 'object' || e === null || !SESSION_ROLES.includes(e.role as SessionRole)) {
      throw new InvalidInputError(`session ${sessionId}: entry ${index} needs a role of ${SESSION_ROLES.join(', ')}`, {
        details: { sessionId, index, role: e && typeof e === 'object' ? e.role : undefined },
      });
    }
    if (e.content === undefined) {
      throw new InvalidInputError(`session ${sessionId}: entry ${index} has no content (use null for none)`, {
        details: { sessionId, index },
      });
    }
    try {
      toJsonText(e.content, `content of entry ${index}`);
    } catch (error) {
      if (error instanceof NotSerializableError) {
        throw new InvalidInputError(`session ${sessionId}: ${error.message}`, { cause: error, details: { sessionId, index } });
      }
      throw error;
    }
    return { role: e.role, content: payloads.value(e.content) };
  });
  const text = JSON.stringify(normalized);
  const bytes = Buffer.byteLength(text);
  if (bytes > maxBytes) {
    throw new PayloadTooLargeError(`session ${sessionId}: the entries of one append are ${bytes} bytes, over the limit of ${maxBytes}`, {
      details: { sessionId, bytes, limit: maxBytes },
    });
  }
  return text;
}
