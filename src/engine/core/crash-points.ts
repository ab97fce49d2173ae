import { ConfigError } from './errors.js';

/**
 * Crash points, for tests only: the engine option `crashAt` makes a worker die at a
 * chosen point of a chosen step, so a test can show that nothing is lost or done twice.
 *
 * - `action: 'halt'` (default) crashes in-process: the worker stops as if its process
 *   had been killed (no further write, no release, no heartbeat; its leases run out),
 *   and another worker, or a later `drain()` of a manual one, recovers its runs.
 * - `action: 'kill'` SIGKILLs the process, for tests that spawn real worker processes.
 *
 * With no crash point configured every check is a cheap no-op.
 */
export const CRASH_WHEN = [
  /** The step's (or operation's) function returned; nothing of its result is recorded yet. */
  'before-checkpoint',
  /** The same point, named for an operation: the external call returned, its outcome is not recorded. */
  'after-call',
  /** A transaction step committed, before the worker heard the reply. */
  'after-commit',
  /** The workflow returned; its completion is not written yet (matched by the workflow's name). */
  'before-complete',
  /** A compensation ran and was recorded (matched by the operation's name). */
  'after-compensation',
  /** A group commit batch committed, before its items hear so (matched by 'batch', several items, or 'single'). */
  'after-group-commit',
  /** engine.start committed a run claimed for this process's worker, before the worker runs it (matched by the workflow's name). */
  'after-start-claimed',
  /** A run migration is written in its transaction, before the COMMIT (matched by the workflow's name). */
  'before-migration-commit',
] as const;

export type CrashWhen = (typeof CRASH_WHEN)[number];

export interface CrashPoint {
  when: CrashWhen;
  /** Step name (or what the point is matched by, see CRASH_WHEN); default: any. */
  step?: string;
  /** 'halt': an in-process crash of the worker (default); 'kill': SIGKILL the process. */
  action?: 'halt' | 'kill';
  /** How many times this point fires across the engine's workers; default 1, so the worker that recovers goes on. */
  times?: number;
}

/** What the run layer asks at each crash point; true means "the worker is dead now: stop, write nothing". */
export interface CrashHook {
  hit(when: CrashWhen, name: string): boolean;
}

const ALIASES: Partial<Record<CrashWhen, CrashWhen>> = { 'after-call': 'before-checkpoint' };

export function validateCrashPoints(points: CrashPoint | CrashPoint[] | undefined): CrashPoint[] {
  const list = points === undefined ? [] : Array.isArray(points) ? points : [points];
  for (const point of list) {
    if (!CRASH_WHEN.includes(point.when))
      throw new ConfigError(`crashAt: when must be one of ${CRASH_WHEN.join(', ')}, got ${JSON.stringify(point.when)}`);
    if (point.step !== undefined && (typeof point.step !== 'string' || point.step === ''))
      throw new ConfigError('crashAt: step must be a non-empty step name (or left out for any)');
    if (point.action !== undefined && point.action !== 'halt' && point.action !== 'kill')
      throw new ConfigError(`crashAt: action must be 'halt' or 'kill'`);
    if (point.times !== undefined && (!Number.isInteger(point.times) || point.times < 1))
      throw new ConfigError('crashAt: times must be a whole number >= 1');
  }
  return list;
}

/**
 * The engine's crash points with how often each has fired (shared by the engine's
 * workers); `forWorker` binds them to the worker that dies when one fires.
 */
export class CrashPoints {
  private readonly fired: number[];

  constructor(private readonly points: ReadonlyArray<CrashPoint>) {
    this.fired = points.map(() => 0);
  }

  get empty(): boolean {
    return this.points.length === 0;
  }

  forWorker(die: (point: CrashPoint, name: string) => void): CrashHook | undefined {
    if (this.empty) return undefined;
    return {
      hit: (when, name) => {
        const index = this.points.findIndex(
          (point, i) =>
            (ALIASES[point.when] ?? point.when) === (ALIASES[when] ?? when) &&
            (point.step === undefined || point.step === '*' || point.step === name) &&
            this.fired[i]! < (point.times ?? 1),
        );
        if (index === -1) return false;
        this.fired[index]!++;
        const point = this.points[index]!;
        if (point.action === 'kill') process.kill(process.pid, 'SIGKILL');
        die(point, name);
        return true;
      },
    };
  }
}
