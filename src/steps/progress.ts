import type { Execution } from '../engine/run/execution.js';

/** What changed in a round of an agent: each is hashed, and a round is progress when one hash is new to the run. */
export interface ProgressSignals {
  observation?: unknown;
  artifact?: unknown;
  plan?: unknown;
  state?: unknown;
}

export interface ProgressResult {
  /** Something new was seen in this round. */
  progressed: boolean;
  /** Rounds in a row without progress, this one included (0 when it progressed). */
  roundsWithoutProgress: number;
}

export function recordProgress(_exec: Execution, _signals: ProgressSignals): Promise<ProgressResult> {
  throw new Error('progress: not built yet');
}
