import type { TaskContext } from '../lib/drain.js';
import type { System } from '../systems/types.js';

export interface MetricDef {
  key: string;
  label: string;
  better: 'higher' | 'lower';
  digits?: number;
  /** A rate over the drain: marked when the drain hit its time cap. */
  cappable?: boolean;
  /** A count for context (samples, runs in flight): no runledger ÷ peer ratio. */
  noRatio?: boolean;
}

export type Measurement = Record<string, number | boolean | string | null>;

export interface Workload {
  name: string;
  /** One line for the report: what is done, how it is measured. */
  description: string;
  runsOn(system: System): boolean;
  metrics: MetricDef[];
  /** Runs in a child process of its own, on a fresh database. `capped: true` marks rates over a capped time. */
  run(ctx: TaskContext): Promise<Measurement>;
  /** A _history twin: the workload it is the history version of, and the metrics reported as history ÷ fresh. */
  freshOf?: { workload: string; keys: string[] };
  /** True when further repetitions of this system cannot change the answer (they are skipped). */
  settledBy?(measurement: Measurement): boolean;
}
