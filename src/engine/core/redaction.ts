import { ConfigError, serializeError } from './errors.js';

/**
 * Redaction and secret scrubbing: the one function every copy of user data the engine
 * writes goes through (log lines, stored errors, termination evidence, approval
 * evidence; see docs/security.md). A run's own data (its input, checkpoints, output,
 * signals, streams, sessions) is never changed by it: the workflow needs it.
 */

/** What a redacted value is replaced with. */
export const REDACTED = '[redacted]';

/** What a secret's value is replaced with in errors and log lines. */
export function secretMark(name: string): string {
  return `[secret:${name}]`;
}

/**
 * A redacted value shorter than this (as text) is masked only where a copy holds it as a
 * whole JSON value (a string or number equal to it), never inside longer text: a two-letter
 * country code would otherwise be cut out of every word that contains it.
 */
export const MIN_TEXT_MATCH = 4;

/** Where a redacted value comes from: the run's input or output, a step's result, a signal's payload. */
export type RedactSource = { root: 'input' } | { root: 'output' } | { root: 'step'; name: string } | { root: 'signal'; topic: string };

interface CompiledPath {
  text: string;
  root: RedactSource['root'];
  /** The step name or signal topic ('*': any); undefined for input and output. */
  key: string | undefined;
  /** The keys below the root; '*' is any key or array element. */
  rest: string[];
}

const ROOTS = 'input, output, steps.<step name>.result or signals.<topic>.payload';
const MAX_PATH_LENGTH = 500;

/**
 * A workflow's `redact` paths, checked at definition (CONFIG otherwise). The grammar:
 * dot-separated keys, `*` for any one key or array element, a number for an array
 * element (or the key of that name), rooted at where the data comes from:
 *
 *   input.card.number            the run's input
 *   output.token                 what the workflow returned
 *   steps.charge.result.card     what step (transaction, operation) `charge` returned
 *   signals.reply.payload.email  the payload of a signal on topic `reply`
 *
 * `steps.*.result.secret` matches every step; a step name or topic containing a dot can
 * only be matched by `*`. A path that selects an object or array selects every string and
 * number in it.
 */
export class Redaction {
  readonly paths: readonly string[];
  readonly #compiled: readonly CompiledPath[];

  private constructor(paths: string[], compiled: CompiledPath[]) {
    this.paths = Object.freeze(paths);
    this.#compiled = compiled;
  }

  /** undefined for no paths; ConfigError naming the bad path. */
  static compile(paths: unknown, what: string): Redaction | undefined {
    if (paths === undefined) return undefined;
    if (!Array.isArray(paths)) throw new ConfigError(`${what}: redact must be a list of paths, e.g. ['input.card.number']`);
    if (paths.length === 0) return undefined;
    return new Redaction(
      [...paths],
      paths.map((path) => compilePath(path, what)),
    );
  }

  /** The strings and numbers these paths select in `value`, which came from `source`. */
  select(source: RedactSource, value: unknown): Array<string | number> {
    const found: Array<string | number> = [];
    for (const path of this.#compiled) {
      if (path.root !== source.root) continue;
      if (path.key !== undefined && path.key !== '*') {
        const key = source.root === 'step' ? source.name : source.root === 'signal' ? source.topic : undefined;
        if (path.key !== key) continue;
      }
      walk(value, path.rest, 0, found);
    }
    return found;
  }
}

function compilePath(path: unknown, what: string): CompiledPath {
  const bad = (why: string) =>
    new ConfigError(`${what}: redact path ${JSON.stringify(path)} is invalid: ${why} (paths start with ${ROOTS}; see docs/security.md)`);
  if (typeof path !== 'string' || path.length === 0) throw bad('a path is a non-empty string');
  if (path.length > MAX_PATH_LENGTH) throw bad(`longer than ${MAX_PATH_LENGTH} characters`);
  const segments = path.split('.');
  if (segments.some((s) => s.length === 0)) throw bad('an empty key (two dots in a row, or a dot at an end)');
  if (segments.some((s) => s.includes('*') && s !== '*')) throw bad("'*' stands alone for one key ('a.*.b'), never inside a key");
  if (segments.some((s) => s.trim() !== s)) throw bad('a key starts or ends with a space');
  const [root, ...rest] = segments as [string, ...string[]];
  if (root === 'input' || root === 'output') return { text: path, root, key: undefined, rest };
  if (root === 'steps' || root === 'signals') {
    const field = root === 'steps' ? 'result' : 'payload';
    if (rest.length < 2 || rest[1] !== field)
      throw bad(`${root} is followed by a ${root === 'steps' ? 'step name' : 'topic'} and .${field}`);
    return { text: path, root: root === 'steps' ? 'step' : 'signal', key: rest[0], rest: rest.slice(2) };
  }
  throw bad(`unknown root ${JSON.stringify(root)}`);
}

function walk(value: unknown, rest: readonly string[], at: number, found: Array<string | number>): void {
  if (at === rest.length) {
    leaves(value, found, 0);
    return;
  }
  if (value === null || typeof value !== 'object') return;
  const key = rest[at]!;
  if (Array.isArray(value)) {
    if (key === '*') for (const item of value) walk(item, rest, at + 1, found);
    else if (/^\d+$/.test(key) && Number(key) < value.length) walk(value[Number(key)], rest, at + 1, found);
    return;
  }
  const record = value as Record<string, unknown>;
  if (key === '*') for (const item of Object.values(record)) walk(item, rest, at + 1, found);
  else if (Object.hasOwn(record, key)) walk(record[key], rest, at + 1, found);
}

function leaves(value: unknown, found: Array<string | number>, depth: number): void {
  if (depth > 100) return;
  if (typeof value === 'string') {
    if (value.length > 0) found.push(value);
  } else if (typeof value === 'number') {
    if (Number.isFinite(value)) found.push(value);
  } else if (value !== null && typeof value === 'object') {
    for (const item of Array.isArray(value) ? value : Object.values(value)) leaves(item, found, depth + 1);
  }
}

/** The text of a value inside a JSON string: JSON.stringify's escapes ("\"", "\\", control characters). */
function jsonEscaped(value: string): string {
  return JSON.stringify(value).slice(1, -1);
}

interface Replacement {
  /** The forms looked for: the value, and its JSON-escaped text when that differs. */
  forms: string[];
  mark: string;
  /** Replaced inside longer text too (secrets always; redacted values of MIN_TEXT_MATCH characters or more). */
  inText: boolean;
}

/**
 * The values one execution must keep out of what it writes: the secrets it resolved
 * (ctx.secret) and the values its workflow's redact paths selected. `mask` applies to
 * copies (errors, evidence, log lines); `secretIn` tells whether a payload the run is
 * about to store holds a secret (it is refused then, never stored masked).
 */
export class Masker {
  readonly #secrets = new Map<string, string>();
  readonly #redacted = new Set<string>();
  #replacements: Replacement[] | undefined = [];

  get empty(): boolean {
    return this.#secrets.size === 0 && this.#redacted.size === 0;
  }

  get hasSecrets(): boolean {
    return this.#secrets.size > 0;
  }

  addSecret(name: string, value: string): void {
    if (this.#secrets.get(value) === name) return;
    this.#secrets.set(value, name);
    this.#replacements = undefined;
  }

  addRedacted(values: ReadonlyArray<string | number>): void {
    for (const value of values) {
      const text = typeof value === 'number' ? String(value) : value;
      if (text.length === 0 || this.#redacted.has(text)) continue;
      this.#redacted.add(text);
      this.#replacements = undefined;
    }
  }

  /** The name of a secret whose value (as it is, or JSON-escaped) is in `payload`; undefined if none. */
  secretIn(payload: string | Uint8Array | undefined | null): string | undefined {
    if (payload === undefined || payload === null || this.#secrets.size === 0) return undefined;
    for (const [value, name] of this.#secrets) {
      if (typeof payload === 'string') {
        if (payload.includes(value) || payload.includes(jsonEscaped(value))) return name;
      } else if (Buffer.from(payload.buffer, payload.byteOffset, payload.byteLength).includes(Buffer.from(value, 'utf8'))) {
        return name;
      }
    }
    return undefined;
  }

  /** A text with every secret replaced by [secret:name] and every redacted value by [redacted]. */
  maskText(text: string): string {
    if (this.empty) return text;
    const secret = this.#secrets.get(text);
    if (secret !== undefined) return secretMark(secret);
    if (this.#redacted.has(text)) return REDACTED;
    let masked = text;
    for (const replacement of this.#ordered()) {
      if (!replacement.inText) continue;
      for (const form of replacement.forms) if (masked.includes(form)) masked = masked.split(form).join(replacement.mark);
    }
    return masked;
  }

  /**
   * A copy of `value` with every string (and object key) masked by maskText, and every
   * number equal to a redacted value replaced by [redacted]. Errors become their
   * serialized form, masked. Other objects (dates, buffers) are kept as they are.
   */
  mask<T>(value: T): T {
    if (this.empty) return value;
    return this.#mask(value, 0) as T;
  }

  #mask(value: unknown, depth: number): unknown {
    if (typeof value === 'string') return this.maskText(value);
    if (typeof value === 'number') {
      const name = this.#secrets.get(String(value));
      return name !== undefined ? secretMark(name) : this.#redacted.has(String(value)) ? REDACTED : value;
    }
    if (value === null || typeof value !== 'object' || depth > 100) return value;
    if (value instanceof Error) return this.#mask(serializeError(value), depth + 1);
    if (Array.isArray(value)) return value.map((item) => this.#mask(item, depth + 1));
    const proto = Object.getPrototypeOf(value);
    if (proto !== Object.prototype && proto !== null) return value;
    const out: Record<string, unknown> = {};
    for (const [key, item] of Object.entries(value)) out[this.maskText(key)] = this.#mask(item, depth + 1);
    return out;
  }

  /** Longest first, so a value containing another is replaced whole. */
  #ordered(): Replacement[] {
    if (this.#replacements) return this.#replacements;
    const all: Replacement[] = [];
    const forms = (value: string) => [...new Set([value, jsonEscaped(value)])];
    for (const [value, name] of this.#secrets) all.push({ forms: forms(value), mark: secretMark(name), inText: true });
    for (const value of this.#redacted) {
      if (this.#secrets.has(value)) continue;
      all.push({ forms: forms(value), mark: REDACTED, inText: value.length >= MIN_TEXT_MATCH });
    }
    // Secrets before redacted values of the same length: a secret is named.
    all.sort((a, b) => b.forms[0]!.length - a.forms[0]!.length || (a.mark === REDACTED ? 1 : 0) - (b.mark === REDACTED ? 1 : 0));
    this.#replacements = all;
    return all;
  }
}
