/**
 * The engine's metrics, through @opentelemetry/api (an optional peer dependency, loaded
 * lazily): counters and histograms recorded in-process by the hot path's hooks, and
 * gauges read from the database on collection (gauges.ts). The provider is the engine
 * option `meterProvider`, else the one registered globally; nothing is installed
 * globally. Without a provider (or without the package) createMetrics returns undefined
 * and every hook is a `metrics?.` that costs one property read: zero cost.
 *
 * docs/observability.md lists every metric and what it means.
 */
import { createRequire } from 'node:module';
import type { Attributes, Counter, Histogram, Meter, MeterProvider } from '@opentelemetry/api';

/** Anything with OpenTelemetry's MeterProvider shape (@opentelemetry/sdk-metrics' MeterProvider, say). */
export interface MeterProviderLike {
  getMeter(name: string, version?: string, options?: object): unknown;
}

export const METER_NAME = 'runledger';

/** Seconds: OpenTelemetry's unit for durations, and Prometheus' too. */
const DURATION_BUCKETS_S = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 1800, 3600, 86400];
const BATCH_BUCKETS = [1, 2, 4, 8, 16, 32, 64];

/** The run statuses that end a run (runledger.run_status). */
export const TERMINAL_STATUSES = ['SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'] as const;

/** A run that ended, as runledger.runs has it: what runs.finished, run.duration and dead_letters record. */
export interface FinishedRun {
  workflow_name: string;
  workflow_version: string;
  status: string;
  termination_reason: string | null;
  /** finished_at - created_at, in seconds, on the database clock. */
  duration_s: number | null;
  /** The runtime it started with (version manifest), and the workflow's own manifest: the buckets of the cost figures. */
  runtime?: string | null;
  manifest?: Record<string, unknown> | null;
  /** What it spent (budget_used), and whether a verify accepted its output. */
  cost_usd?: number | null;
  tokens?: number | null;
  verified?: boolean;
}

/** At most this many entries of a workflow's manifest become attributes (strings and numbers, short): a bounded cardinality. */
const MANIFEST_ATTRIBUTES = 5;

/** The version buckets of a finished run's figures, beside workflow and version: the runtime, and the manifest's short entries as `manifest.<key>`. */
export function versionAttributes(run: FinishedRun): Record<string, string> {
  const out: Record<string, string> = { runtime: run.runtime ?? '' };
  const entries = Object.entries(run.manifest ?? {})
    .filter(([, value]) => (typeof value === 'string' && value.length <= 64) || typeof value === 'number')
    .sort(([a], [b]) => (a < b ? -1 : 1))
    .slice(0, MANIFEST_ATTRIBUTES);
  for (const [key, value] of entries) out[`manifest.${key}`] = String(value);
  return out;
}

/** Where a commit of run state came from; see runledger.commits. */
export type CommitKind = 'group' | 'checkpoint' | 'finish' | 'release' | 'transaction';

export interface EngineMetrics {
  /**
   * The @opentelemetry/api Meter the instruments live on (gauges.ts adds its own). Typed
   * `object` so the published declarations do not import the optional package: a
   * TypeScript user without it must still compile against runledger's types.
   */
  readonly meter: object;
  runsStarted(workflow: string, version: string, count: number): void;
  runFinished(run: FinishedRun): void;
  stepFinished(workflow: string, step: string, kind: string, status: string, ms: number): void;
  groupCommitBatch(size: number): void;
  commit(kind: CommitKind): void;
  resumed(workflow: string, version: string, recovered: boolean): void;
  leaseLost(workflow: string, version: string): void;
  recovered(outcome: 'requeued' | 'dead_letter' | 'ended'): void;
}

let api: typeof import('@opentelemetry/api') | null | undefined;

/** @opentelemetry/api, or null when it is not installed (looked up once). */
function loadApi(): typeof import('@opentelemetry/api') | null {
  if (api === undefined) {
    try {
      api = createRequire(import.meta.url)('@opentelemetry/api') as typeof import('@opentelemetry/api');
    } catch {
      api = null;
    }
  }
  return api;
}

/**
 * The engine's instruments on `provider`, else on the globally registered MeterProvider;
 * undefined when neither records anything (no provider given and none registered, or
 * @opentelemetry/api not installed).
 */
export function createMetrics(provider?: MeterProviderLike, version?: string): EngineMetrics | undefined {
  let meter: Meter;
  if (provider) {
    meter = provider.getMeter(METER_NAME, version) as Meter;
  } else {
    const otel = loadApi();
    if (!otel) return undefined;
    meter = (otel.metrics.getMeterProvider() as MeterProvider).getMeter(METER_NAME, version);
    // The API's no-op meter when nothing is registered: record nothing, cost nothing.
    if (meter.constructor === otel.createNoopMeter().constructor) return undefined;
  }
  return instruments(meter);
}

function instruments(meter: Meter): EngineMetrics {
  const counter = (name: string, description: string, unit = '{run}'): Counter => meter.createCounter(name, { description, unit });
  const seconds = (name: string, description: string): Histogram =>
    meter.createHistogram(name, { description, unit: 's', advice: { explicitBucketBoundaries: DURATION_BUCKETS_S } });
  const started = counter('runledger.runs.started', 'Runs started by this process (engine.start, startMany, schedules)');
  const finished = counter('runledger.runs.finished', 'Runs this process ended (its workers and its sweeper), by final status and reason');
  const runDuration = seconds(
    'runledger.run.duration',
    'From a run created to ended (database clock), for the runs of runledger.runs.finished',
  );
  const stepDuration = seconds('runledger.step.duration', "A step's attempt, from its start to its result (before its checkpoint)");
  const batchSize = meter.createHistogram('runledger.group_commit.batch_size', {
    description: "Checkpoints and completions sent in one of a worker's group commits",
    unit: '{item}',
    advice: { explicitBucketBoundaries: BATCH_BUCKETS },
  });
  const commits = counter('runledger.commits', 'Database commits of run state by this process, by what made them', '{commit}');
  const resumes = counter('runledger.resumes', 'Executions that resumed a run from its history (after a wait, a release or a recovery)');
  const leaseLost = counter('runledger.lease.lost', 'Executions that found their lease taken over and let the run go');
  const recoveries = counter('runledger.recoveries', "Runs whose lease had expired, handled by this process's sweeper, by outcome");
  const deadLetters = counter('runledger.dead_letters', 'Runs this process moved to DEAD_LETTER, by reason');
  const costUsd = meter.createCounter('runledger.run.cost_usd', {
    description:
      'What the runs this process ended spent (budget dimension cost_usd), by version, runtime, manifest entries, status and verified',
    unit: 'USD',
  });
  const tokens = meter.createCounter('runledger.run.tokens', {
    description: 'The tokens the runs this process ended spent, by version, runtime, manifest entries, status and verified',
    unit: '{token}',
  });
  const groupCommit: Attributes = { kind: 'group' };
  return {
    meter,
    runsStarted: (workflow, version, count) => started.add(count, { workflow, version }),
    runFinished(run) {
      const attributes = { workflow: run.workflow_name, version: run.workflow_version, status: run.status };
      const buckets = versionAttributes(run);
      finished.add(1, { ...attributes, reason: run.termination_reason ?? '', verified: run.verified === true, ...buckets });
      if (run.duration_s !== null) runDuration.record(Math.max(0, run.duration_s), { ...attributes, ...buckets });
      const spent = { ...attributes, verified: run.verified === true, ...buckets };
      if (run.cost_usd) costUsd.add(run.cost_usd, spent);
      if (run.tokens) tokens.add(run.tokens, spent);
      if (run.status === 'DEAD_LETTER') {
        deadLetters.add(1, { workflow: run.workflow_name, version: run.workflow_version, reason: run.termination_reason ?? '' });
      }
    },
    stepFinished: (workflow, step, kind, status, ms) => stepDuration.record(ms / 1000, { workflow, step, kind, status }),
    groupCommitBatch(size) {
      batchSize.record(size);
      commits.add(1, groupCommit);
    },
    commit: (kind) => commits.add(1, { kind }),
    resumed: (workflow, version, recovered) => resumes.add(1, { workflow, version, recovered }),
    leaseLost: (workflow, version) => leaseLost.add(1, { workflow, version }),
    recovered: (outcome) => recoveries.add(1, { outcome }),
  };
}
