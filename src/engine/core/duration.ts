import { ConfigError } from './errors.js';

const UNIT_MS: Record<string, number> = { ms: 1, s: 1_000, m: 60_000, h: 3_600_000, d: 86_400_000, w: 604_800_000 };

/** A duration as milliseconds or text such as '250ms', '30s', '5m', '2h', '2d', '1h30m'. */
export type Duration = number | string;

export function toMs(duration: Duration, what: string): number {
  if (typeof duration === 'number') {
    if (!Number.isFinite(duration) || duration < 0) throw new ConfigError(`${what}: ${duration} is not a duration`);
    return duration;
  }
  const parts = duration.trim().match(/^(?:\d+(?:\.\d+)?(?:ms|s|m|h|d|w))+$/)
    ? duration.trim().match(/\d+(?:\.\d+)?(?:ms|s|m|h|d|w)/g)
    : null;
  if (!parts) throw new ConfigError(`${what}: ${JSON.stringify(duration)} is not a duration (use e.g. 500ms, 30s, 5m, 2h, 2d)`);
  return parts.reduce((total, part) => {
    const [, amount, unit] = part.match(/^(\d+(?:\.\d+)?)(ms|s|m|h|d|w)$/)!;
    return total + Number(amount) * UNIT_MS[unit!]!;
  }, 0);
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
