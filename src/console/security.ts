/**
 * The console's security model (docs/console.md, "Security"):
 *
 * - Reads are open to whoever reaches the port, which is loopback unless told otherwise.
 * - An action needs the token. The operator types it once into the sign-in form; the
 *   console answers with an HttpOnly, SameSite=Strict cookie that holds an HMAC of the
 *   token (never the token), and every action form carries a second HMAC of it (the CSRF
 *   field). A POST needs both, so another site can neither send the cookie (SameSite) nor
 *   know the field.
 * - A POST whose Origin (or Sec-Fetch-Site) says it comes from another site is refused
 *   before anything else, and so is any request whose Host is not the console's own
 *   address (a DNS-rebinding page would send its own host name).
 * - Actions are POST only: a GET on an action's address changes nothing (405).
 */
import { createHmac, timingSafeEqual } from 'node:crypto';

export const SESSION_COOKIE = 'runledger_console';
export const NAME_COOKIE = 'runledger_console_name';

const mac = (token: string, purpose: string) => createHmac('sha256', token).update(`runledger-console:${purpose}`).digest('hex');

/** Equal strings, compared in constant time (a length difference is not secret). */
export function sameSecret(a: string | undefined, b: string): boolean {
  if (a === undefined) return false;
  const x = Buffer.from(a);
  const y = Buffer.from(b);
  return x.length === y.length && timingSafeEqual(x, y);
}

export class Guard {
  readonly sessionValue: string | undefined;
  readonly csrfValue: string | undefined;

  constructor(readonly token: string | undefined) {
    this.sessionValue = token ? mac(token, 'session') : undefined;
    this.csrfValue = token ? mac(token, 'csrf') : undefined;
  }

  get actionsEnabled(): boolean {
    return this.token !== undefined;
  }

  tokenMatches(given: string | undefined): boolean {
    return this.token !== undefined && given !== undefined && sameSecret(mac(given, 'session'), this.sessionValue!);
  }

  signedIn(cookie: string | undefined): boolean {
    return this.sessionValue !== undefined && sameSecret(cookie, this.sessionValue);
  }

  csrfMatches(field: string | undefined): boolean {
    return this.csrfValue !== undefined && sameSecret(field, this.csrfValue);
  }
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
