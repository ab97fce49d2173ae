import { ConfigError } from '../engine/core/errors.js';
import type { Execution } from '../engine/run/execution.js';
import { runStep } from './step.js';

/** Patch ids: safe in a step name, short enough to read in `runledger show`. */
const PATCH_ID = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$/;

/** The step name of a patch's marker; the view runledger.patches reads it. */
export function patchMarker(id: string): string {
  return `@patch:${id}`;
}

function checkId(id: unknown, call: string): string {
  if (typeof id !== 'string' || !PATCH_ID.test(id)) {
    throw new ConfigError(`${call}: patch id ${JSON.stringify(id)} is invalid: 1-64 characters of letters, digits, '_', '.', ':', '-'`);
  }
  return id;
}

/**
 * ctx.patched(id), the Temporal/DBOS patching model: true for a run that reaches this
 * point with the patch deployed, recorded as the checkpoint `@patch:<id>` at this
 * position; false for the replay of a run whose history has another step here (it passed
 * this point before the patch, so it keeps the old code path), and then no position is
 * taken. Later calls with the same id in one execution give the same answer.
 */
export async function patched(exec: Execution, id: string): Promise<boolean> {
  checkId(id, 'ctx.patched');
  const known = exec.patches.get(id);
  if (known !== undefined) return known;
  const marker = patchMarker(id);
  const recorded = exec.peekCheckpoint();
  if (recorded && recorded[1] !== marker) {
    exec.patches.set(id, false);
    return false;
  }
  exec.patches.set(id, true);
  await runStep(exec, marker, () => true);
  return true;
}

/**
 * ctx.deprecatePatch(id): once no run from before the patch can replay (runledger.patches:
 * replayable_before = 0), the old branch goes and `patched` becomes `deprecatePatch`. New
 * runs record nothing; a run that recorded the marker consumes it on replay, so its
 * history still matches. Remove the call when replayable_taken is 0 too.
 */
export async function deprecatePatch(exec: Execution, id: string): Promise<void> {
  checkId(id, 'ctx.deprecatePatch');
  if (exec.patches.has(id)) return;
  exec.patches.set(id, true);
  if (exec.peekCheckpoint()?.[1] === patchMarker(id)) await runStep(exec, patchMarker(id), () => true);
}
