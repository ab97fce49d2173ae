import type { WorkflowContext } from '../agents/index.js';

/**
 * What the framework adapters (runledger/ai, runledger/openai-agents) keep per execution of a run: how many model calls each durable
 * model made (the n in `model:<name>:<n>`), and the tool calls of the latest model reply,
 * in the reply's order, so that tool executions a framework starts concurrently take their
 * step positions in that order (reply-order.ts). A new execution (a replay after a crash,
 * on any worker) starts from zero and counts the same way, since the workflow makes the
 * same calls in the same order.
 */
export interface AdapterRunState {
  modelCalls: Map<string, number>;
  /** The latest reply's tool calls: which model call they came from, their ids in order, and whether it was streamed. */
  reply: { step: string; toolCallIds: string[]; streamed: boolean } | undefined;
  order: ToolOrderState;
}

export interface ToolOrderState {
  /** The next index of `reply.toolCallIds` that may take a position. */
  next: number;
  /** Tool calls of the reply that arrived and wait for their turn: id -> let it go. */
  waiting: Map<string, () => void>;
  /** Ids that took their position already. */
  started: Set<string>;
  skipScheduled: boolean;
}

const states = new WeakMap<WorkflowContext, AdapterRunState>();

export function adapterStateOf(ctx: WorkflowContext): AdapterRunState {
  let state = states.get(ctx);
  if (!state) {
    state = { modelCalls: new Map(), reply: undefined, order: { next: 0, waiting: new Map(), started: new Set(), skipScheduled: false } };
    states.set(ctx, state);
  }
  return state;
}

/** The step name of the next call of durable model `name`: `model:<name>:<n>`, n from 1. */
export function nextModelStep(ctx: WorkflowContext, name: string): string {
  const state = adapterStateOf(ctx);
  const n = (state.modelCalls.get(name) ?? 0) + 1;
  state.modelCalls.set(name, n);
  return `model:${name}:${n}`;
}
