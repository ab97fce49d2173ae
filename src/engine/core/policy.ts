/** An action a workflow's policy is asked about, before it is taken the first time. */
export type PolicyAction =
  | { kind: 'tool'; name: string; args: unknown; sideEffect: string }
  | { kind: 'operation'; name: string; idempotencyKey: string }
  | { kind: 'exec'; name: string; command: string; args: readonly string[] };

/** Allow (nothing, or true), or refuse with a reason (and evidence): the run ends TERMINATED with reason POLICY. */
export type PolicyVerdict = void | undefined | true | { refuse: string; evidence?: unknown };

/**
 * A workflow's policy (`engine.workflow({ policy })`): a synchronous function of the action
 * (no I/O: it decides at the moment the action is called, before its position is taken, so
 * it must not await). Asked once per action, on the execution that first takes it; a replay
 * of a recorded action does not ask again.
 */
export type PolicyFunction = (action: PolicyAction) => PolicyVerdict;
