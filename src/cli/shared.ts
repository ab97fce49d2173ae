/** What every command shares: argument parsing, the connection, errors and exit codes. */
import { parseArgs, type ParseArgsConfig } from 'node:util';
import pg from 'pg';
import type { Engine } from '../engine/index.js';
import type { LogFunction } from '../engine/core/log.js';
import { fromPgError } from '../engine/core/errors.js';
import { aesGcmCodec, type PayloadCodec } from '../engine/core/codec.js';
import { NO_CODEC, Payloads } from '../engine/core/payloads.js';

/** Exit codes: 0 done, 1 the command failed, 2 the command could not be attempted (usage, no database, not available). */
export const EXIT_FAILED = 1;
export const EXIT_USAGE = 2;

/** An error the CLI reports as `error [CODE]: message` with its own exit code. */
export class CliError extends Error {
  constructor(
    readonly code: string,
    message: string,
    readonly exitCode: number = EXIT_USAGE,
  ) {
    super(message);
  }
}

export interface Command {
  /** One line for `runledger --help`. */
  summary: string;
  /** The synopsis, printed by `runledger CMD --help` and after a usage error. */
  usage: string;
  run(args: string[]): Promise<void>;
}

type Options = NonNullable<ParseArgsConfig['options']>;

const COMMON: Options = {
  'database-url': { type: 'string' },
  help: { type: 'boolean', short: 'h' },
};

export interface Parsed {
  values: Record<string, string | boolean | string[] | boolean[] | undefined>;
  positionals: string[];
}

/**
 * util.parseArgs with the options every command takes. Its own errors (unknown
 * option, missing value) become usage errors, and `--help` prints the synopsis.
 */
export function parse(
  command: Command,
  args: string[],
  options: Options = {},
  positionals: { min?: number; max?: number } = {},
): Parsed | undefined {
  let parsed: Parsed;
  try {
    parsed = parseArgs({ args, options: { ...COMMON, ...options }, allowPositionals: true, strict: true }) as Parsed;
  } catch (error) {
    // parseArgs appends a long hint about '--' to unknown options; the first sentence says it all.
    throw new CliError('USAGE', `${(error as Error).message.split('. To specify')[0]}\nusage: ${command.usage}`);
  }
  if (parsed.values.help) {
    process.stdout.write(`usage: ${command.usage}\n`);
    return undefined;
  }
  const { min = 0, max = 0 } = positionals;
  if (parsed.positionals.length < min || parsed.positionals.length > max) {
    const what = parsed.positionals.length < min ? 'missing argument' : `unexpected argument ${JSON.stringify(parsed.positionals[max])}`;
    throw new CliError('USAGE', `${what}\nusage: ${command.usage}`);
  }
  return parsed;
}

/** A whole-number option, checked here so that a typo reads as a usage error, not a database error. */
export function intOption(values: Parsed['values'], name: string, min: number): number | undefined {
  const raw = values[name];
  if (raw === undefined) return undefined;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min)
    throw new CliError('USAGE', `--${name} must be a whole number >= ${min}, got ${JSON.stringify(raw)}`);
  return n;
}

/** A JSON argument (input, payload, result), parsed here so that a typo reads as a usage error. */
export function jsonArgument(raw: string | undefined, what: string): unknown {
  if (raw === undefined) return undefined;
  try {
    return JSON.parse(raw);
  } catch (error) {
    throw new CliError('USAGE', `${what} is not valid JSON: ${(error as Error).message}`);
  }
}

/** A required string option: its absence is a usage error that shows the synopsis. */
export function requiredOption(command: Command, values: Parsed['values'], name: string): string {
  const value = values[name];
  if (typeof value !== 'string' || value.length === 0) throw new CliError('USAGE', `--${name} is required\nusage: ${command.usage}`);
  return value;
}

export function databaseUrl(values: Parsed['values']): string {
  const url = (values['database-url'] as string | undefined) ?? process.env.DATABASE_URL;
  if (!url) throw new CliError('NO_DATABASE', 'no database: pass --database-url postgres://... or set DATABASE_URL');
  return url;
}

/** Warnings go to stderr on one line; `verbose` adds the engine's info messages (the worker wants them). */
export function cliLog(verbose = false): LogFunction {
  return (level, message, meta) => {
    if (level === 'info' && !verbose) return;
    const detail = meta ? ` ${JSON.stringify(meta, (key, value) => (key === 'stack' ? undefined : value))}` : '';
    process.stderr.write(`${new Date().toISOString()} ${level} ${message}${detail}\n`);
  };
}

/**
 * A small pool: one-shot commands make a few queries; the worker passes its own size.
 * The engine (graphile-worker, kysely, zod) is loaded only by the commands that need it,
 * so the others start in a fraction of the time.
 */
export async function openEngine(values: Parsed['values'], options: { verbose?: boolean; poolMax?: number } = {}): Promise<Engine> {
  const url = databaseUrl(values);
  const codec = cliCodec();
  const { createEngine } = await import('../engine/index.js');
  return createEngine({ connectionString: url, log: cliLog(options.verbose), poolMax: options.poolMax ?? 3, ...(codec ? { codec } : {}) });
}

/**
 * The payload codec of the environment: RUNLEDGER_KEYS="k1:BASE64,k2:BASE64" (32-byte
 * keys, base64) and RUNLEDGER_ACTIVE_KEY (default: the last key listed) give every command
 * an aesGcmCodec, so `worker` encrypts what it stores and `show`, `tail`, `session`,
 * `approvals` decode what they print (docs/security.md). Unset: none, payloads in clear.
 */
export function cliCodec(env: NodeJS.ProcessEnv = process.env): PayloadCodec | undefined {
  const spec = env.RUNLEDGER_KEYS?.trim();
  if (!spec) {
    if (env.RUNLEDGER_ACTIVE_KEY) throw new CliError('CONFIG', 'RUNLEDGER_ACTIVE_KEY is set but RUNLEDGER_KEYS is not', EXIT_USAGE);
    return undefined;
  }
  const keys: Record<string, string> = {};
  let last: string | undefined;
  for (const part of spec.split(',')) {
    const colon = part.indexOf(':');
    if (colon <= 0) throw new CliError('CONFIG', 'RUNLEDGER_KEYS must be keyId:base64key[,keyId:base64key...]', EXIT_USAGE);
    last = part.slice(0, colon).trim();
    keys[last] = part.slice(colon + 1).trim();
  }
  return aesGcmCodec({ keys, activeKey: env.RUNLEDGER_ACTIVE_KEY?.trim() || last! });
}

/** cliCodec() as the engine's payload layer, for commands that call the SQL functions without an engine. */
export function cliPayloads(): Payloads {
  const codec = cliCodec();
  return codec ? new Payloads(codec) : NO_CODEC;
}

/** Runs `fn` with an engine and always closes it, so a one-shot command's process can end. */
export async function withEngine<T>(values: Parsed['values'], fn: (engine: Engine) => Promise<T>): Promise<T> {
  const engine = await openEngine(values);
  try {
    return await fn(engine);
  } finally {
    await engine.close();
  }
}

/**
 * Runs `fn` with a plain pool and always closes it. For commands that are one SQL
 * function or one view: they call the same TypeScript wrapper the engine uses
 * (src/engine/client/operator.ts ...), without loading the engine.
 */
export async function withPool<T>(values: Parsed['values'], fn: (pool: pg.Pool) => Promise<T>): Promise<T> {
  const pool = new pg.Pool({ connectionString: databaseUrl(values), max: 2 });
  pool.on('error', () => {}); // an idle connection dropped by the server: the query that needs it reports it
  try {
    return await fn(pool);
  } finally {
    await pool.end();
  }
}

/** The line printed for any failure, and its exit code. SQL functions' RL00x codes read as runledger codes. */
export function describeError(thrown: unknown): { line: string; exitCode: number } {
  if (thrown instanceof CliError) return { line: `error [${thrown.code}]: ${thrown.message}`, exitCode: thrown.exitCode };
  const error = fromPgError(thrown) as { code?: unknown; message?: unknown; errors?: unknown[] };
  // pg reports "connection refused" for several addresses as an AggregateError with an empty message.
  const inner = (!error?.message && Array.isArray(error?.errors) ? error.errors[0] : error) as { code?: unknown; message?: unknown };
  const code = typeof inner?.code === 'string' ? inner.code : 'ERROR';
  let message = typeof inner?.message === 'string' && inner.message ? inner.message : String(thrown);
  // undefined_table / undefined_function / invalid_schema_name: almost always a database that was never migrated.
  if (['42P01', '42883', '3F000'].includes(code) && message.includes('runledger'))
    message += ' (has `runledger migrate` been run on this database?)';
  return { line: `error [${code}]: ${message}`, exitCode: EXIT_FAILED };
}
