import type { Execution } from '../engine/run/execution.js';
import { InvalidVerdictError } from '../engine/core/errors.js';
import type { Verdict, VerifyFunction } from '../engine/core/workflow.js';
import type { StepContext } from './context.js';
import { runStep } from './step.js';

/**
 * The workflow's verify, run after its function returned and before the run may commit
 * SUCCEEDED. It is workflow code (its ctx calls are checkpointed); its verdict is
 * recorded as the step `@verify`, so a replay ends the way the first execution decided.
 * A verify that throws, or answers something that is not a verdict, fails the run.
 */
export async function verifyOutput(
  exec: Execution,
  ctx: StepContext,
  verify: VerifyFunction<any>,
  output: unknown,
  input: unknown,
): Promise<Verdict> {
  // verify sees the output as it will be stored (a Date as its ISO string...).
  const stored = output === undefined ? undefined : JSON.parse(JSON.stringify(output));
  const verdict = await verify(stored, ctx as never, input);
  checkVerdict(verdict);
  // The verdict is evidence, kept in the termination record: the redact paths apply to it.
  return runStep<Verdict>(exec, '@verify', () => exec.mask(verdict));
}

function checkVerdict(verdict: unknown): asserts verdict is Verdict {
  const v = verdict as { ok?: unknown; reason?: unknown } | null;
  if (v === null || typeof v !== 'object' || typeof v.ok !== 'boolean' || (v.ok === false && typeof v.reason !== 'string')) {
    throw new InvalidVerdictError(
      `verify must return { ok: true, evidence? } or { ok: false, reason: string }, not ${JSON.stringify(verdict)}`,
    );
  }
}
