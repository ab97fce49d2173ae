import type { WorkflowContext } from '../agents/index.js';
import { adapterStateOf } from './run-state.js';

/**
 * Tool executions take their step positions in the order of the model's reply.
 *
 * A run replays by position: the k-th ctx call of an execution must be the k-th of every
 * execution. A framework (the AI SDK, the Agents SDK) starts the tool calls of one reply concurrently, and each reaches
 * its `execute` after a few awaits of its own (input checks, the user's callbacks), so
 * the order they arrive in is not promised. Each durable tool waits here for its turn in
 * the reply's order (the reply is checkpointed, so the order is the same on replay). A
 * call of the reply that has not arrived ARRIVAL_GRACE_MS after a later one did is passed
 * over: the framework did not execute it (invalid input, a tool without execute, a
 * provider-executed tool), or a callback of the user's held it that long, and then the
 * order is the order of arrival.
 */
export const ARRIVAL_GRACE_MS = 25;

export function recordReplyToolCalls(ctx: WorkflowContext, step: string, toolCallIds: string[], streamed = false): void {
  const state = adapterStateOf(ctx);
  for (const release of state.order.waiting.values()) release();
  state.reply = { step, toolCallIds, streamed };
  state.order = { next: 0, waiting: new Map(), started: new Set(), skipScheduled: false };
}

/** Resolves when tool call `toolCallId` may take its position; gives the model step that asked for it, when known. */
export function takeTurn(ctx: WorkflowContext, toolCallId: string): Promise<string | undefined> {
  const state = adapterStateOf(ctx);
  const reply = state.reply;
  if (!reply || !reply.toolCallIds.includes(toolCallId) || state.order.started.has(toolCallId)) {
    return Promise.resolve(reply?.toolCallIds.includes(toolCallId) ? reply.step : undefined);
  }
  return new Promise<string | undefined>((resolve) => {
    state.order.waiting.set(toolCallId, () => resolve(reply.step));
    // Not pumped here: a call let go now would resume before its own caller awaits it, and
    // so after calls let go with it that come later in the reply.
    queueMicrotask(() => pump(ctx));
  });
}

function pump(ctx: WorkflowContext): void {
  const state = adapterStateOf(ctx);
  const ids = state.reply?.toolCallIds ?? [];
  const order = state.order;
  while (order.next < ids.length) {
    const id = ids[order.next]!;
    const release = order.waiting.get(id);
    if (!order.started.has(id) && !release) break;
    order.next++;
    if (release) {
      order.waiting.delete(id);
      order.started.add(id);
      release();
    }
  }
  if (order.waiting.size === 0 || order.skipScheduled || order.next >= ids.length) return;
  order.skipScheduled = true;
  const blocking = ids[order.next]!;
  setTimeout(() => {
    if (state.order !== order) return;
    order.skipScheduled = false;
    if (ids[order.next] === blocking && !order.waiting.has(blocking)) {
      order.started.add(blocking);
      order.next++;
    }
    pump(ctx);
  }, ARRIVAL_GRACE_MS);
}

/** Whether the latest reply was streamed: only then does a UI follow the run's stream, and tool results go there too. */
export function replyStreamed(ctx: WorkflowContext): boolean {
  return adapterStateOf(ctx).reply?.streamed ?? false;
}
