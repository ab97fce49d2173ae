/**
 * The console's security model (docs/console.md, "Security"):
 *
 * - Reads are open to whoever reaches the port, which is loopback unless told otherwise.
 * - An action needs the token. The operator types it once into the sign-in form; the
 *   console opens a session: a random id it keeps in memory (never the token), sent back
 *   in an HttpOnly, SameSite=Strict cookie, and every action form carries an HMAC of the
 *   token and that id (the CSRF field). A POST needs both, so another site can neither
 *   send the cookie (SameSite) nor know the field. Signing out closes the session on the
 *   server: a copy of the cookie taken before no longer works. Sessions end after
 *   SESSION_MS, and all of them when the console stops.
 * - Where to go after signing in (`back=`) is a path of this console or `/`, never
 *   another site (safeBack).
 * - What PostgreSQL cannot hold (a NUL, half of a UTF-16 surrogate pair) in the path, the
 *   query or a form field is refused with 400 INVALID_INPUT before any SQL.
 * - A POST whose Origin (or Sec-Fetch-Site) says it comes from another site is refused
 *   before anything else, and so is any request whose Host is not the console's own
 *   address (a DNS-rebinding page would send its own host name).
 * - Actions are POST only: a GET on an action's address changes nothing (405).
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';

export const SESSION_COOKIE = 'runledger_console';
export const NAME_COOKIE = 'runledger_console_name';
/** How long a session lasts after its sign-in: a working day. */
export const SESSION_MS = 12 * 60 * 60 * 1000;
/** Sessions kept at most; a sign-in past it closes the oldest. */
export const MAX_SESSIONS = 1_000;

const mac = (token: string, purpose: string) => createHmac('sha256', token).update(`runledger-console:${purpose}`).digest('hex');

/** Equal strings, compared in constant time (a length difference is not secret). */
export function sameSecret(a: string | undefined, b: string): boolean {
  if (a === undefined) return false;
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

export class Guard {
  /** A key of this process's own, to compare a given token with the token as two HMACs of equal length. */
  readonly #key = randomBytes(32);
  readonly #tokenMac: string | undefined;
  /** Open sessions: id -> when it ends (ms since the epoch), oldest sign-in first. */
  readonly #sessions = new Map<string, number>();

  constructor(readonly token: string | undefined) {
    this.#tokenMac = token ? this.#digest(token) : undefined;
  }

  get actionsEnabled(): boolean {
    return this.token !== undefined;
  }

  /**
   * The token is the HMAC's message, not its key: HMAC pads a short key with zero bytes,
   * so a token used as the key would also be matched by itself with NULs appended.
   */
  #digest(token: string): string {
    return createHmac('sha256', this.#key).update(token, 'utf8').digest('hex');
  }

  tokenMatches(given: string | undefined): boolean {
    return this.#tokenMac !== undefined && typeof given === 'string' && sameSecret(this.#digest(given), this.#tokenMac);
  }

  /** A new session, after a sign-in with the token: its id, the cookie's value. */
  openSession(now = Date.now()): string {
    if (this.token === undefined) throw new Error('a console without a token opens no session');
    for (const [id, ends] of this.#sessions) if (ends <= now) this.#sessions.delete(id);
    while (this.#sessions.size >= MAX_SESSIONS) this.#sessions.delete(this.#sessions.keys().next().value!);
    const id = randomBytes(32).toString('base64url');
    this.#sessions.set(id, now + SESSION_MS);
    return id;
  }

  /** The open session a cookie names (its id), or undefined: none, closed by sign-out, ended, or from before a restart. */
  session(cookie: string | undefined, now = Date.now()): string | undefined {
    if (this.token === undefined || typeof cookie !== 'string') return undefined;
    const ends = this.#sessions.get(cookie);
    if (ends === undefined) return undefined;
    if (ends <= now) {
      this.#sessions.delete(cookie);
      return undefined;
    }
    return cookie;
  }

  /** Signing out: the session's cookie, wherever a copy of it is, no longer works. */
  closeSession(id: string): void {
    this.#sessions.delete(id);
  }

  /** The CSRF field of a session's forms: an HMAC of the token and the session id. */
  csrfFor(sessionId: string): string {
    return mac(this.token!, `csrf:${sessionId}`);
  }

  csrfMatches(field: string | undefined, sessionId: string): boolean {
    return this.token !== undefined && sameSecret(field, this.csrfFor(sessionId));
  }
}

/**
 * Where to go back to after signing in or an action: a path of this console, else `/`.
 * Accepted: `/` alone, or `/` and a letter, digit, `?` or `#`, then printable ASCII
 * without a backslash. Refused: `//evil` and `/\evil` (another host to a browser),
 * `https://evil`, and anything holding a space or a control character, which browsers
 * strip from a Location (`/<TAB>/evil` would become `//evil`).
 */
export function safeBack(raw: unknown): string {
  if (typeof raw !== 'string' || !/^\/(?:[A-Za-z0-9?#][\x21-\x5b\x5d-\x7e]*)?$/.test(raw)) return '/';
  const base = 'http://console.invalid';
  try {
    return new URL(raw, base).origin === base ? raw : '/';
  } catch {
    return '/';
  }
}

/** A NUL or half of a UTF-16 surrogate pair: what PostgreSQL's text and jsonb cannot hold. */
const UNSTORABLE = /\0|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/** True for a string PostgreSQL cannot hold (see UNSTORABLE); a JSON value is checked in its strings and keys. */
export function unstorable(value: unknown): boolean {
  if (typeof value === 'string') return UNSTORABLE.test(value);
  if (Array.isArray(value)) return value.some(unstorable);
  if (typeof value === 'object' && value !== null) return Object.entries(value).some(([k, v]) => UNSTORABLE.test(k) || unstorable(v));
  return false;
}

/** Hosts that are this machine: binding to one of them keeps the console off the network. */
export function isLoopback(host: string): boolean {
  const h = host.replace(/^\[|\]$/g, '');
  return h === 'localhost' || h === '::1' || /^127\.\d+\.\d+\.\d+$/.test(h);
}

/**
 * The Host headers the console answers to: the address it is bound to and, when that is
 * loopback, the usual names of loopback. Anything else is a browser sent here by another
 * name (DNS rebinding), refused.
 */
export function allowedHosts(host: string, port: number): Set<string> {
  const withPort = (h: string) => (h.includes(':') && !h.startsWith('[') ? `[${h}]:${port}` : `${h}:${port}`);
  const names = new Set([withPort(host)]);
  if (isLoopback(host)) for (const h of ['localhost', '127.0.0.1', '[::1]']) names.add(withPort(h));
  return names;
}

/** A POST from another site: its Origin is not ours, or the browser says cross-site. Clients without either header (curl) pass. */
export function crossSite(headers: { origin?: string | undefined; host?: string | undefined; fetchSite?: string | undefined }): boolean {
  if (headers.origin !== undefined) return headers.origin === 'null' || headers.origin !== `http://${headers.host}`;
  if (headers.fetchSite !== undefined) return !['same-origin', 'none'].includes(headers.fetchSite);
  return false;
}
