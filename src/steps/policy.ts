import type { Execution } from '../engine/run/execution.js';
import type { PolicyAction } from '../engine/core/policy.js';

/**
 * Asks the run's policy about an action its execution is about to take for the first time
 * (nothing recorded at the next position): true to go on; false when refused, the execution
 * then halts to end the run TERMINATED, POLICY, with the action, the reason and the evidence.
 * A policy that throws, or answers something else, refuses (it fails closed).
 */
export function allowedByPolicy(exec: Execution, action: PolicyAction): boolean {
  const policy = exec.policy;
  if (!policy || exec.checkpoints[exec.stepsTaken] !== undefined) return true;
  let verdict: unknown;
  try {
    verdict = policy(action);
  } catch (error) {
    verdict = { refuse: `the policy threw: ${error instanceof Error ? error.message : String(error)}` };
  }
  if (verdict === undefined || verdict === true) return true;
  const refusal =
    typeof verdict === 'object' && verdict !== null && typeof (verdict as { refuse?: unknown }).refuse === 'string'
      ? (verdict as { refuse: string; evidence?: unknown })
      : { refuse: `the policy answered ${describe(verdict)}, which is neither allow (undefined, true) nor { refuse }` };
  exec.halt({
    kind: 'terminate',
    reason: 'POLICY',
    evidence: {
      action: describeAction(action),
      reason: refusal.refuse,
      ...(refusal.evidence !== undefined ? { evidence: asEvidence(refusal.evidence) } : {}),
      seq: exec.stepsTaken,
    },
  });
  return false;
}

/**
 * The policy's evidence as JSON: what JSON.stringify cannot write (a BigInt, a cycle) is kept
 * as its description, so the stop is recorded rather than its write failing. (Characters
 * jsonb refuses become U+FFFD when the record is written, as in any diagnostic.)
 */
function asEvidence(evidence: unknown): unknown {
  try {
    const text = JSON.stringify(evidence);
    return text === undefined ? String(evidence) : (JSON.parse(text) as unknown);
  } catch (error) {
    return { unserializable: String(evidence), error: error instanceof Error ? error.message : String(error) };
  }
}

function describe(value: unknown): string {
  if (value instanceof Promise) return 'a promise (a policy decides synchronously)';
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/** The action as the termination evidence holds it (a tool's arguments included: redact paths apply to evidence). */
function describeAction(action: PolicyAction): Record<string, unknown> {
  return { ...action };
}
