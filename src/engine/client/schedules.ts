import { parseCrontab } from 'graphile-worker';
import { ConfigError } from '../core/errors.js';
import { toMs, type Duration } from '../core/duration.js';
import { NAME_PATTERN, type Workflow } from '../core/workflow.js';

/**
 * Scheduled workflows. Every worker carries the same crontab; graphile-worker fires
 * each tick once across all of them (its known_crontabs lock), and the run it starts
 * has the idempotency key `cron:<name>:<tick>`, so a tick can never start two runs.
 *
 * Catch-up after downtime: ticks missed while no worker ran are fired once each if
 * they are younger than `catchUp` (graphile-worker's backfill); older ones are skipped.
 * The default (0) fires no missed ticks: the next tick after the workers come back runs.
 */
export interface ScheduleOptions<In> {
  /** Unique per engine; part of every run's idempotency key. */
  name: string;
  workflow: Workflow<any, any, In>;
  /** Five fields, UTC: minute hour day-of-month month day-of-week (e.g. '0 3 * * *'). */
  cron: string;
  /** What each tick starts the workflow with (the schema's input type, like engine.start). */
  input?: In;
  /** How far back missed ticks are fired after downtime; default 0 (none). */
  catchUp?: Duration;
}

export interface Schedule {
  readonly name: string;
  readonly workflow: Workflow<any, any>;
  readonly cron: string;
  readonly input: unknown;
  readonly catchUpMs: number;
}

export type StartScheduled = (workflow: Workflow<any, any>, input: unknown, idempotencyKey: string) => Promise<void>;

export function cronTaskIdentifier(name: string): string {
  return `runledger:cron:${name}`;
}

export function defineSchedule<I>(options: ScheduleOptions<I>): Schedule {
  if (typeof options?.name !== 'string' || !NAME_PATTERN.test(options.name)) {
    throw new ConfigError(`schedule name ${JSON.stringify(options?.name)} is invalid: 1-50 characters of letters, digits, '_', '.', '-'`);
  }
  if (!options.workflow?.name) throw new ConfigError(`schedule ${options.name}: workflow is required`);
  const catchUpMs = toMs(options.catchUp ?? 0, `schedule ${options.name}: catchUp`);
  const schedule = {
    name: options.name,
    workflow: options.workflow,
    cron: String(options.cron ?? '').trim(),
    input: options.input,
    catchUpMs,
  };
  try {
    parseCrontab(cronLine(schedule));
  } catch (error) {
    throw new ConfigError(`schedule ${options.name}: cron ${JSON.stringify(options.cron)} is invalid: ${(error as Error).message}`, {
      cause: error,
    });
  }
  return Object.freeze(schedule);
}

function cronLine(schedule: Schedule): string {
  const fill = schedule.catchUpMs > 0 ? `&fill=${Math.max(1, Math.round(schedule.catchUpMs / 1000))}s` : '';
  return `${schedule.cron} ${cronTaskIdentifier(schedule.name)} ?id=${schedule.name}${fill}&max=10 ${JSON.stringify({ schedule: schedule.name })}`;
}

export function crontabFor(schedules: ReadonlyArray<Schedule>): string | undefined {
  return schedules.length === 0 ? undefined : schedules.map(cronLine).join('\n');
}

/** A tick fired: start the scheduled run, exactly once per tick (idempotency key). */
export async function fireSchedule(schedule: Schedule, payload: Record<string, unknown>, start: StartScheduled): Promise<void> {
  const tick = (payload._cron as { ts?: string } | undefined)?.ts;
  if (!tick) return;
  await start(schedule.workflow, schedule.input, `cron:${schedule.name}:${new Date(tick).toISOString()}`);
}
