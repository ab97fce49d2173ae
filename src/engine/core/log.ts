export type LogLevel = 'info' | 'warn' | 'error';
/** Where the engine reports what it did and what went wrong; the user's logger plugs in here. */
export type LogFunction = (level: LogLevel, message: string, meta?: Record<string, unknown>) => void;
