import {
  UserError,
  type AgentInputItem,
  type Session,
  type SessionHistoryTransactionArgs,
  type SessionHistoryTransactionAwareSession,
} from '@openai/agents-core';
import type { Session as RunledgerSession, SessionEntry, SessionOptions, WorkflowContext } from '../agents/index.js';

/**
 * What one entry of a runledger session holds for the Agents SDK: an item, or a marker
 * that changes the items before it (the session's history is append-only; the SDK's view
 * of it is folded from the entries in order).
 */
type Stored =
  | { item: AgentInputItem; operationId?: string }
  | { marker: 'transaction'; operationId: string; transaction: string }
  | { marker: 'truncate'; count: number; operationId?: string }
  | { marker: 'clear' };

export interface RunledgerAgentSession extends SessionHistoryTransactionAwareSession {
  /** Lets go of the session: the next run waiting for it gets it. */
  release(): Promise<void>;
}

/**
 * `runledgerSession(ctx, sessionId)`: an Agents SDK `Session` on runledger's session of
 * that id. The run holds the session (another run on it waits durably until this one ends
 * or releases it); every change is appended to its history with the step that makes it,
 * so a replay never appends it again; `applyHistoryTransaction` applies each `operationId`
 * once, across executions and runs (repeating it with the same transaction does nothing,
 * with another one fails, as the SDK asks). `popItem`, `clearSession` and suffix
 * replacements are markers in the history: it stays readable from SQL
 * (`runledger.session_history(id)`), each entry with the run and step that wrote it.
 */
export function runledgerSession(ctx: WorkflowContext, sessionId: string, options?: SessionOptions): RunledgerAgentSession {
  let held: Promise<RunledgerSession> | undefined;
  const session = () => (held ??= ctx.session(sessionId, options));
  const entries = async () => (await (await session()).history()).map((entry) => entry.content as Stored);
  const append = async (stored: Stored[]) => (await session()).append(stored.map(entryOf));

  return {
    async getSessionId() {
      return sessionId;
    },
    async getItems(limit?: number) {
      const items = fold(await entries()).items;
      return limit === undefined ? items : items.slice(Math.max(0, items.length - limit));
    },
    async addItems(items: AgentInputItem[]) {
      if (items.length) await append(items.map((item) => ({ item })));
    },
    async popItem() {
      const items = fold(await entries()).items;
      const last = items.at(-1);
      if (last !== undefined) await append([{ marker: 'truncate', count: 1 }]);
      return last;
    },
    async clearSession() {
      await append([{ marker: 'clear' }]);
    },
    async applyHistoryTransaction({ operationId, transaction }: SessionHistoryTransactionArgs) {
      if (typeof operationId !== 'string' || operationId === '')
        throw new UserError('applyHistoryTransaction: operationId must be a non-empty string');
      const text = JSON.stringify(transaction);
      const { items, applied } = fold(await entries());
      const earlier = applied.get(operationId);
      if (earlier !== undefined) {
        if (earlier !== text) throw new UserError('Session history operation was already applied with a different transaction.');
        return;
      }
      const head: Stored = { marker: 'transaction', operationId, transaction: text };
      if (transaction.type === 'append_items') {
        await append([head, ...transaction.items.map((item) => ({ item, operationId }))]);
        return;
      }
      const { expectedSuffix, replacement } = transaction;
      const actual = items.slice(items.length - expectedSuffix.length);
      if (expectedSuffix.length > items.length || JSON.stringify(actual) !== JSON.stringify(expectedSuffix)) {
        throw new UserError('Session history suffix no longer matches the transaction precondition.');
      }
      await append([
        head,
        { marker: 'truncate', count: expectedSuffix.length, operationId },
        ...replacement.map((item) => ({ item, operationId })),
      ]);
    },
    async release() {
      if (held) await (await held).release();
    },
  } satisfies Session & RunledgerAgentSession;
}

/** The SDK's items, folded from the entries in order, and the operations applied (id -> transaction as JSON). */
function fold(stored: Stored[]): { items: AgentInputItem[]; applied: Map<string, string> } {
  let items: AgentInputItem[] = [];
  const applied = new Map<string, string>();
  for (const entry of stored) {
    if ('item' in entry) items.push(entry.item);
    else if (entry.marker === 'transaction') applied.set(entry.operationId, entry.transaction);
    else if (entry.marker === 'truncate') items = items.slice(0, Math.max(0, items.length - entry.count));
    else if (entry.marker === 'clear') items = [];
  }
  return { items, applied };
}

/** An entry's role, for people reading the history: the item's own role, 'tool' for tool calls' results, 'system' for markers. */
function entryOf(stored: Stored): SessionEntry {
  if (!('item' in stored)) return { role: 'system', content: stored };
  const item = stored.item as { role?: string; type?: string };
  const role =
    item.role === 'user' || item.role === 'assistant' || item.role === 'system'
      ? item.role
      : item.type === 'function_call_result'
        ? 'tool'
        : 'assistant';
  return { role, content: stored };
}
