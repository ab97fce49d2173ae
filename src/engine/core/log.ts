export type LogLevel = 'info' | 'warn' | 'error';
/** Where the engine reports what it did and what went wrong; the user's logger plugs in here. */
export type LogFunction = (level: LogLevel, message: string, meta?: Record<string, unknown>) => void;

/** One level of a pino-style logger: the fields first, then the message (pino, and bunyan's object form). */
type LevelMethod = (fields: Record<string, unknown>, message?: string) => void;

/**
 * The part of a pino logger the engine calls: `info`, `warn`, `error` with `(fields, message)`,
 * and `child(bindings)` when it has one. A pino, bunyan or pino-compatible logger fits as is.
 */
export interface Logger {
  info: LevelMethod;
  warn: LevelMethod;
  error: LevelMethod;
  child?: (bindings: Record<string, unknown>) => Logger;
}

/** The engine's `log` option: a function, or a pino-compatible logger. */
export type LogOption = LogFunction | Logger;

/** The fields every log line of a run carries. */
export interface RunLogFields {
  runId: string;
  workflow: string;
  version?: string;
}

/** The engine's log: lines of its own, and lines bound to one run's fields. */
export interface EngineLog {
  log: LogFunction;
  /** A log whose every line carries the run's id and workflow: a child logger, or the fields merged into each line's meta. */
  forRun(fields: RunLogFields): LogFunction;
}

export function isLogger(value: unknown): value is Logger {
  if (typeof value !== 'object' || value === null) return false;
  const candidate = value as Record<string, unknown>;
  return ['info', 'warn', 'error'].every((level) => typeof candidate[level] === 'function');
}

/**
 * Adapts the `log` option. A function gets the run's fields in each line's meta; a logger
 * gets `logger.child({ component: 'runledger' })` for the engine and a child of that per run,
 * so its own serializers, redaction, level and transport apply, and `info` lines reach it
 * (the engine's default log drops them).
 */
export function engineLog(option: LogOption): EngineLog {
  if (typeof option === 'function') {
    return {
      log: option,
      forRun: (fields) => (level, message, meta) => option(level, message, { ...fields, ...meta }),
    };
  }
  const base = option.child ? option.child({ component: 'runledger' }) : option;
  const write = (logger: Logger, extra: Record<string, unknown> | undefined): LogFunction => {
    return (level, message, meta) => logger[level].call(logger, { ...extra, ...meta }, message);
  };
  return {
    log: write(base, undefined),
    forRun: (fields) => {
      const bound = stripUndefined(fields);
      return base.child ? write(base.child(bound), undefined) : write(base, bound);
    },
  };
}

function stripUndefined(fields: RunLogFields): Record<string, unknown> {
  return Object.fromEntries(Object.entries(fields).filter(([, value]) => value !== undefined && value !== ''));
}
