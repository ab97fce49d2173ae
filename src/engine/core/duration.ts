import { ConfigError } from './errors.js';

const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** A duration as milliseconds or text such as '250ms', '30s', '5m', '2h', '2d', '1h30m'. */
export type Duration = number | string;

/**
 * The longest duration: 2^53 - 1 ms (about 285,000 years), the largest whole number of
 * milliseconds a JSON number holds exactly. Every duration travels to SQL as int8 (or
 * numeric) milliseconds and every instant as timestamptz (docs/waits.md#how-far-ahead).
 */
export const MAX_DURATION_MS = Number.MAX_SAFE_INTEGER;

/** PostgreSQL's earliest timestamptz, 4714-11-24 BC (JavaScript's latest Date, +275760, is within its latest). */
const MIN_INSTANT_MS = Date.UTC(-4713, 10, 24);

export function toMs(duration: Duration, what: string): number {
  if (typeof duration === 'number') {
    if (!Number.isFinite(duration) || duration < 0 || duration > MAX_DURATION_MS) {
      throw new ConfigError(`${what}: ${duration} is not a duration (milliseconds from 0 to ${MAX_DURATION_MS})`);
    }
    return duration;
  }
  if (typeof duration !== 'string') {
    throw new ConfigError(`${what}: ${describe(duration)} is not a duration (a number of milliseconds, or e.g. 500ms, 30s, 5m, 2h, 2d)`);
  }
  const parts = duration.trim().match(/^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$/)
    ? duration.trim().match(/\d+(?:\.\d+)?(?:ms|s|m|h|d|w)/g)
    : null;
  if (!parts) throw new ConfigError(`${what}: ${JSON.stringify(duration)} is not a duration (use e.g. 500ms, 30s, 5m, 2h, 2d)`);
  const ms = parts.reduce((total, part) => {
    const [, amount, unit] = part.match(/^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$/)!;
    return total + Number(amount) * UNIT_MS[unit!]!;
  }, 0);
  if (!(ms <= MAX_DURATION_MS)) {
    throw new ConfigError(
      `${what}: ${JSON.stringify(duration)} is longer than the longest duration (${MAX_DURATION_MS} ms, about 285,000 years)`,
    );
  }
  return ms;
}

/**
 * A Date as the ISO text SQL reads as a timestamptz. An invalid Date (`new Date('x')`,
 * whose toISOString() throws a RangeError) or one before PostgreSQL's earliest time is a
 * ConfigError naming `what`.
 */
export function toInstant(at: Date, what: string): string {
  const ms = at instanceof Date ? at.getTime() : NaN;
  if (Number.isNaN(ms)) throw new ConfigError(`${what}: ${describe(at)} is not a valid Date`);
  if (ms < MIN_INSTANT_MS) throw new ConfigError(`${what}: ${at.toISOString()} is before the earliest time PostgreSQL holds (4714 BC)`);
  return at.toISOString();
}

function describe(value: unknown): string {
  if (value instanceof Date) return 'Invalid Date';
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/**
 * A mark on the process's monotonic clock (performance.now(), ms): for measuring how
 * long ago something happened on this worker. A worker never sends the database a
 * wall-clock time to compare; it sends the elapsed time (msSince), and SQL places it
 * on the database clock (runledger.now() minus the elapsed time).
 */
export function monotonicMark(): number {
  return performance.now();
}

/** Whole milliseconds since a monotonicMark(), never negative. */
export function msSince(mark: number): number {
  return Math.max(0, Math.round(performance.now() - mark));
}
