import type { StepContext } from '../steps/context.js';
import { storeLarge } from './artifact.js';

/**
 * THE place where a tool's result is encoded for its checkpoint (and for the ledger row of
 * an 'idempotent' or 'external' tool): what `run` returned, or what `reconcile` found. Every
 * tool result passes through here exactly once, inside the body of the tool's step, before
 * the checkpoint is written; a replay returns what this returned.
 *
 * A result whose JSON is over LARGE_VALUE_THRESHOLD_BYTES (64 KiB) is stored once, by
 * sha256, in runledger.artifact_blobs, and the checkpoint (and the ledger row) keep only
 * `{ $artifact, size }`: a 50 MB tool output never lands in a checkpoint or a replay, and
 * an external tool's large result is not refused by the payload limit after its effect
 * happened. callTool reads it back (loadLarge) before the model sees it.
 */
export async function encodeToolResult(ctx: StepContext, toolName: string, result: unknown): Promise<unknown> {
  return storeLarge(ctx, `tool:${toolName}`, result);
}
