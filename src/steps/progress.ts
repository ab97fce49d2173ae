import { createHash } from 'node:crypto';
import type { Execution } from '../engine/run/execution.js';
import { ConfigError } from '../engine/core/errors.js';
import { toJsonText } from '../engine/core/json.js';
import { runStep } from './step.js';

/** What changed in a round of an agent: each is hashed, and a round is progress when one hash is new to the run. */
export interface ProgressSignals {
  observation?: unknown;
  artifact?: unknown;
  plan?: unknown;
  state?: unknown;
}

const SIGNALS = ['observation', 'artifact', 'plan', 'state'] as const;

export interface ProgressResult {
  /** Something new was seen in this round. */
  progressed: boolean;
  /** Rounds in a row without progress, this one included (0 when it progressed). */
  roundsWithoutProgress: number;
}

/** What a `@progress` checkpoint records: the round's hashes and the verdict, so a replay rebuilds the count. */
interface ProgressRecord {
  hashes: Record<string, string>;
  progressed: boolean;
  rounds: number;
}

/**
 * ctx.progress: a checkpointed step `@progress` recording the hashes of what the round
 * produced and whether one is new to the run. Replays return the recorded verdicts, so
 * the count of rounds without progress is the same on every execution. At the limit
 * the workflow's onNoProgress runs once (its marker is the step `@no-progress`) and the
 * count starts again; at the limit again, or at once without onNoProgress, the run ends
 * TERMINATED (NO_PROGRESS) with the rounds as evidence.
 */
export async function recordProgress(exec: Execution, signals: ProgressSignals): Promise<ProgressResult> {
  const hashes = hashSignals(signals);
  const state = (exec.progressState ??= { seen: new Set(), rounds: 0, positions: [], warned: false });
  const position = exec.stepsTaken;
  const record = await runStep<ProgressRecord>(exec, '@progress', () => {
    const progressed = Object.values(hashes).some((hash) => !state.seen.has(hash));
    return { hashes, progressed, rounds: progressed ? 0 : state.rounds + 1 };
  });
  for (const hash of Object.values(record.hashes)) state.seen.add(hash);
  state.rounds = record.rounds;
  state.positions = record.progressed ? [] : [...state.positions, position];
  const policy = exec.noProgressPolicy;
  if (policy && state.rounds >= policy.limit) {
    const evidence = { rounds: state.rounds, limit: policy.limit, positions: state.positions };
    if (policy.onNoProgress && !state.warned) {
      state.warned = true;
      await policy.onNoProgress(evidence);
      // The marker: replays reach it at the same place, and the streak starts again after it.
      await runStep(exec, '@no-progress', () => evidence);
      state.rounds = 0;
      state.positions = [];
    } else {
      exec.halt({
        kind: 'terminate',
        reason: 'NO_PROGRESS',
        evidence: { kind: 'progress', ...evidence, after_on_no_progress: state.warned },
      });
      return exec.suspend();
    }
  }
  return { progressed: record.progressed, roundsWithoutProgress: record.rounds };
}

function hashSignals(signals: ProgressSignals): Record<string, string> {
  if (signals === null || typeof signals !== 'object' || Array.isArray(signals)) {
    // Named by its type, never quoted: the value is the run's data (and a payload codec may be on).
    const given = signals === null ? 'null' : Array.isArray(signals) ? 'an array' : `a ${typeof signals}`;
    throw new ConfigError(`progress: expected an object of ${SIGNALS.join(', ')}, not ${given}`);
  }
  const hashes: Record<string, string> = {};
  for (const [key, value] of Object.entries(signals)) {
    if (!(SIGNALS as readonly string[]).includes(key)) {
      throw new ConfigError(`progress: unknown signal ${JSON.stringify(key)} (known: ${SIGNALS.join(', ')})`);
    }
    if (value === undefined) continue;
    const text = toJsonText(value, `progress ${key}`) ?? 'null';
    // The kind is part of the hash: the same text as a plan and as an observation are two things.
    hashes[key] = createHash('sha256').update(`${key}\u0000${text}`).digest('hex');
  }
  if (Object.keys(hashes).length === 0) throw new ConfigError(`progress: give at least one of ${SIGNALS.join(', ')}`);
  return hashes;
}
