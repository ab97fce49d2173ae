import type { StepContext } from '../steps/context.js';

/**
 * THE place where a tool's result is encoded for its checkpoint (and for the ledger row of
 * an 'idempotent' or 'external' tool): what `run` returned, or what `reconcile` found. Every
 * tool result passes through here exactly once, inside the body of the tool's step, before
 * the checkpoint is written; a replay returns what this returned.
 *
 * Today the result is stored as it is (the step's JSON checks and payload limit apply).
 * Large outputs are to be stored once by reference (ctx.artifact): that belongs here, and
 * only here, so that a 50 MB tool output never lands in a checkpoint or a replay.
 */
export async function encodeToolResult(_ctx: StepContext, _toolName: string, result: unknown): Promise<unknown> {
  return result;
}
