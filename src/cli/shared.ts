/** What every command shares: its input and output, argument parsing, the connection, errors and exit codes. */
import { AsyncLocalStorage } from 'node:async_hooks';
import { readFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { parseArgs, type ParseArgsConfig } from 'node:util';
import pg from 'pg';
import type { Engine, MeterProviderLike } from '../engine/index.js';
import { engineLog, type Logger, type LogFunction } from '../engine/core/log.js';
import { fromPgError } from '../engine/core/errors.js';
import { aesGcmCodec, type PayloadCodec } from '../engine/core/codec.js';
import { NO_CODEC, Payloads } from '../engine/core/payloads.js';

/**
 * Where a command writes and what it reads: the process's streams and environment when
 * `runledger` runs as a program (src/cli/main.ts), strings in memory when a test runs it
 * in its own process (runCliMain, src/cli/run.ts). Commands never touch process.stdout,
 * process.stderr, process.stdin or process.env themselves: they ask cliIo().
 */
export interface CliIo {
  stdout: { write(text: string): unknown };
  stderr: { write(text: string): unknown };
  /** What `-` reads (JSON input from stdin); absent: no input at all (an empty stdin). */
  stdin?: AsyncIterable<Buffer | string> & { isTTY?: boolean };
  /** DATABASE_URL, RUNLEDGER_LOG_FORMAT, RUNLEDGER_KEYS ... */
  env: NodeJS.ProcessEnv;
  /** The terminal's width when stdout is a terminal; absent when it is a pipe or a file (tables are never cut then). */
  columns?: number;
}

/**
 * The process's own streams and environment: what `runledger` the program uses. stdin and
 * the width are read when asked for (a command that reads no input never opens stdin).
 */
export const PROCESS_IO: CliIo = {
  get stdout() {
    return process.stdout;
  },
  get stderr() {
    return process.stderr;
  },
  get stdin() {
    return process.stdin;
  },
  get env() {
    return process.env;
  },
  get columns() {
    return process.stdout.isTTY ? process.stdout.columns || Number(process.env.COLUMNS) || 80 : undefined;
  },
};

// Per call, not per module: calls made at once in one process (tests) each see their own.
const ioStore = new AsyncLocalStorage<CliIo>();

/** The input and output of the command running now (the process's own outside runCliMain). */
export function cliIo(): CliIo {
  return ioStore.getStore() ?? PROCESS_IO;
}

/** Runs `fn` with `io` as what cliIo() returns, for it and everything it awaits. */
export function withCliIo<T>(io: CliIo, fn: () => Promise<T>): Promise<T> {
  return ioStore.run(io, fn);
}

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
  /** The positional arguments, for `--help`: [name, what it is]. */
  args?: Array<[string, string]>;
  /** A few command lines that show it in use, for `--help`. */
  examples: string[];
  /** More about the command, a paragraph or two, for `--help`. */
  details?: string;
  run(args: string[]): Promise<void>;
}

/** A util.parseArgs option, with what `--help` says about it. */
export interface Option {
  type: 'string' | 'boolean';
  short?: string;
  multiple?: boolean;
  /** The value's placeholder in `--help` (`--limit N`). */
  value?: string;
  help: string;
}

export type Options = Record<string, Option>;

const COMMON: Options = {
  'database-url': { type: 'string', value: 'URL', help: 'the database (default: the DATABASE_URL environment variable)' },
  help: { type: 'boolean', short: 'h', help: 'this help' },
};

/** `--json` for read commands: the same rows as the table, as one JSON document on stdout. */
export const JSON_OPTION: Option = {
  type: 'boolean',
  help: 'print one JSON document on stdout instead of the table (keys: the SQL column names)',
};

/** `--limit N` with its default. */
export const limitOption = (defaultLimit: number, what = 'rows'): Option => ({
  type: 'string',
  value: 'N',
  help: `at most N ${what} (default ${defaultLimit})`,
});

export interface Parsed {
  values: Record<string, string | boolean | string[] | boolean[] | undefined>;
  positionals: string[];
}

/** What `runledger CMD --help` prints: synopsis, description, arguments, every option, examples. */
export function helpText(command: Command, options: Options): string {
  const all = { ...options, ...COMMON };
  const flag = (name: string, o: Option) => `${o.short ? `-${o.short}, ` : ''}--${name}${o.value ? ` ${o.value}` : ''}`;
  const optionRows = Object.entries(all).map(([name, o]) => [flag(name, o), o.multiple ? `${o.help} (may be repeated)` : o.help]);
  const argRows = command.args ?? [];
  const width = Math.max(...[...optionRows, ...argRows].map(([left]) => left!.length));
  const rows = (list: string[][]) => list.map(([left, right]) => `  ${left!.padEnd(width)}  ${right}`);
  return [
    `usage: ${command.usage}`,
    '',
    command.summary,
    ...(command.details ? ['', command.details] : []),
    ...(argRows.length > 0 ? ['', 'arguments:', ...rows(argRows)] : []),
    '',
    'options:',
    ...rows(optionRows),
    '',
    'examples:',
    ...command.examples.map((example) => `  ${example}`),
    '',
    'exit codes: 0 done, 1 refused or failed (error [CODE]: ... on stderr), 2 usage error or no database',
  ].join('\n');
}

/**
 * util.parseArgs with the options every command takes. Its own errors (unknown
 * option, missing value) become usage errors, and `--help` prints the command's help.
 */
export function parse(
  command: Command,
  args: string[],
  options: Options = {},
  positionals: { min?: number; max?: number } = {},
): Parsed | undefined {
  let parsed: Parsed;
  const config = Object.fromEntries(
    Object.entries({ ...COMMON, ...options }).map(([name, o]) => [
      name,
      { type: o.type, ...(o.short ? { short: o.short } : {}), ...(o.multiple ? { multiple: true } : {}) },
    ]),
  ) as NonNullable<ParseArgsConfig['options']>;
  try {
    parsed = parseArgs({ args, options: config, allowPositionals: true, strict: true }) as Parsed;
  } catch (error) {
    // parseArgs appends a long hint about '--' to unknown options; the first sentence says it all.
    throw new CliError('USAGE', `${(error as Error).message.split('. To specify')[0]}\nusage: ${command.usage}`);
  }
  if (parsed.values.help) {
    cliIo().stdout.write(`${helpText(command, options)}\n`);
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

/**
 * A JSON argument (input, payload, result), parsed here so that a typo reads as a usage
 * error. `-` reads the JSON from stdin and `@FILE` from that file, for values too large
 * for a command line (the kernel refuses arguments of a few hundred KB or more: "Argument
 * list too long"). Neither can be JSON, so a literal value is never mistaken for one.
 */
export async function jsonArgument(raw: string | undefined, what: string): Promise<{ value: unknown; text: string } | undefined> {
  if (raw === undefined) return undefined;
  let text = raw;
  if (raw === '-') {
    const io = cliIo();
    if (io.stdin?.isTTY) io.stderr.write(`reading ${what} from stdin (end with Ctrl-D) ...\n`);
    text = await readStdin();
  } else if (raw.startsWith('@')) {
    try {
      text = await readFile(raw.slice(1), 'utf8');
    } catch (error) {
      throw new CliError('USAGE', `cannot read ${what} from ${raw.slice(1)}: ${(error as Error).message}`);
    }
  }
  try {
    return { value: JSON.parse(text), text };
  } catch (error) {
    const from = raw === '-' ? ' (from stdin)' : raw.startsWith('@') ? ` (from ${raw.slice(1)})` : '';
    throw new CliError('USAGE', `${what}${from} is not valid JSON: ${(error as Error).message}`);
  }
}

async function readStdin(): Promise<string> {
  const chunks: Buffer[] = [];
  const stdin = cliIo().stdin;
  if (stdin) for await (const chunk of stdin) chunks.push(typeof chunk === 'string' ? Buffer.from(chunk) : chunk);
  return Buffer.concat(chunks).toString('utf8');
}

/** A required string option: its absence is a usage error that shows the synopsis. */
export function requiredOption(command: Command, values: Parsed['values'], name: string): string {
  const value = values[name];
  if (typeof value !== 'string' || value.length === 0) throw new CliError('USAGE', `--${name} is required\nusage: ${command.usage}`);
  return value;
}

/**
 * pino, loaded only when JSON logs are asked for: synchronous writes to stderr, so a line is
 * out before the process exits (the process's fd 2, or the stderr of runCliMain's caller).
 */
function jsonLogger(verbose: boolean): Logger {
  const pino = createRequire(import.meta.url)('pino') as typeof import('pino').default;
  const stderr = cliIo().stderr;
  const destination = stderr === process.stderr ? pino.destination({ fd: 2, sync: true }) : { write: (line: string) => stderr.write(line) };
  return pino({ level: verbose ? 'info' : 'warn' }, destination);
}

export function databaseUrl(values: Parsed['values']): string {
  const url = (values['database-url'] as string | undefined) ?? cliIo().env.DATABASE_URL;
  if (!url) throw new CliError('NO_DATABASE', 'no database: pass --database-url postgres://... or set DATABASE_URL');
  return url;
}

/** RUNLEDGER_LOG_FORMAT: text (the default) or json; anything else is refused with CONFIG (exit 2) by every command. */
export function logFormat(env: NodeJS.ProcessEnv = cliIo().env): 'text' | 'json' {
  const format = env.RUNLEDGER_LOG_FORMAT?.trim().toLowerCase();
  if (!format || format === 'text') return 'text';
  if (format === 'json') return 'json';
  throw new CliError('CONFIG', `RUNLEDGER_LOG_FORMAT must be text or json, not ${JSON.stringify(env.RUNLEDGER_LOG_FORMAT)}`, EXIT_USAGE);
}

/**
 * Warnings go to stderr on one line; `verbose` adds the engine's info messages (the worker wants them).
 * RUNLEDGER_LOG_FORMAT=json writes them as pino's JSON lines instead (for a log collector):
 * `{"level":40,"time":...,"component":"runledger","runId":...,"workflow":...,"msg":...}`.
 */
export function cliLog(verbose = false, env: NodeJS.ProcessEnv = cliIo().env): LogFunction {
  if (logFormat(env) === 'json') return engineLog(jsonLogger(verbose)).log;
  const stderr = cliIo().stderr;
  return (level, message, meta) => {
    if (level === 'info' && !verbose) return;
    const detail = meta ? ` ${JSON.stringify(meta, (key, value) => (key === 'stack' ? undefined : value))}` : '';
    stderr.write(`${new Date().toISOString()} ${level} ${message}${detail}\n`);
  };
}

/**
 * A small pool: one-shot commands make a few queries; the worker passes its own size.
 * The engine (graphile-worker, kysely, zod) is loaded only by the commands that need it,
 * so the others start in a fraction of the time.
 */
export async function openEngine(
  values: Parsed['values'],
  options: { verbose?: boolean; poolMax?: number; meterProvider?: MeterProviderLike } = {},
): Promise<Engine> {
  const url = databaseUrl(values);
  const codec = cliCodec();
  const { createEngine } = await import('../engine/index.js');
  return createEngine({
    connectionString: url,
    log: cliLog(options.verbose),
    poolMax: options.poolMax ?? 3,
    ...(codec ? { codec } : {}),
    ...(options.meterProvider ? { meterProvider: options.meterProvider } : {}),
  });
}

/**
 * The payload codec of the environment: RUNLEDGER_KEYS="k1:BASE64,k2:BASE64" (32-byte
 * keys, base64) and RUNLEDGER_ACTIVE_KEY (default: the last key listed) give every command
 * an aesGcmCodec, so `worker` encrypts what it stores and `show`, `tail`, `session`,
 * `approvals` decode what they print (docs/security.md). Unset: none, payloads in clear.
 */
export function cliCodec(env: NodeJS.ProcessEnv = cliIo().env): PayloadCodec | undefined {
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

/**
 * Resolves on the first SIGINT or SIGTERM, for commands that run until Ctrl-C. Given
 * `again`, a second signal calls it. Its listener is added in the first one's handler,
 * before that one is removed: a process with no listener for a signal is killed by it,
 * and a second signal sent as soon as the stop's first line was printed once landed in
 * that gap (test/engine/worker/sigterm.slow.test.ts, "a second SIGINT ... forces the exit (130)").
 */
export function untilSignal(again?: (signal: NodeJS.Signals) => void): Promise<NodeJS.Signals> {
  return new Promise((done) => {
    const on = (sig: NodeJS.Signals) => {
      if (again) process.once('SIGINT', again).once('SIGTERM', again);
      process.off('SIGINT', on).off('SIGTERM', on);
      done(sig);
    };
    process.on('SIGINT', on).on('SIGTERM', on);
  });
}
