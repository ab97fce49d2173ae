import pg from 'pg';

/**
 * Connection strings naming several hosts, as libpq takes them, which node-postgres
 * does not: `postgres://u@a:5432,b:5433/db?target_session_attrs=read-write` or
 * `host=a,b port=5432,5433 dbname=db target_session_attrs=read-write`. Each new
 * connection goes to the host that answered last; when it fails (down, or read-only
 * after a failover when read-write is asked for), the next connection probes the
 * hosts in order and takes the first that fits, so workers follow a promoted replica.
 */
export interface HostPort {
  host: string;
  port: number;
}

export interface MultiHostTarget {
  hosts: HostPort[];
  /** target_session_attrs=read-write (or primary): a server in recovery is refused. */
  readWrite: boolean;
  /** Everything else of the connection string, as node-postgres's config (no host, no port). */
  config: pg.ClientConfig;
}

const DEFAULT_PORT = 5432;
/** A probe of one candidate host gives up after this long, so a host that is down costs little. */
const PROBE_TIMEOUT_MS = 3_000;

/** The hosts of a multi-host connection string; undefined for a string naming one host (left to node-postgres as before). */
export function parseMultiHost(connectionString: string): MultiHostTarget | undefined {
  const url = /^(postgres(?:ql)?:\/\/)([^@/?]*@)?([^/?]*)(.*)$/.exec(connectionString);
  if (url) {
    const [, scheme, auth = '', hostList = '', rest = ''] = url;
    const hosts = hostList.split(',').map((entry) => hostPort(entry));
    const attrs = /[?&]target_session_attrs=([^&]*)/.exec(rest)?.[1];
    if (hosts.length < 2 && attrs === undefined) return undefined;
    const cleaned = rest.replace(/([?&])target_session_attrs=[^&]*&?/, '$1').replace(/[?&]$/, '');
    const single = `${scheme}${auth}${hosts[0]!.host}:${hosts[0]!.port}${cleaned}`;
    return { hosts, readWrite: isReadWrite(attrs), config: { connectionString: single } };
  }
  if (!/^\s*\w+\s*=/.test(connectionString)) return undefined;
  const pairs = keyValues(connectionString);
  const hostNames = (pairs.host ?? 'localhost').split(',');
  if (hostNames.length < 2 && pairs.target_session_attrs === undefined) return undefined;
  const ports = (pairs.port ?? '').split(',');
  const hosts = hostNames.map((host, i) => ({ host, port: Number(ports[i] ?? ports[0] ?? DEFAULT_PORT) || DEFAULT_PORT }));
  const config: pg.ClientConfig = {};
  if (pairs.user) config.user = pairs.user;
  if (pairs.password) config.password = pairs.password;
  if (pairs.dbname) config.database = pairs.dbname;
  if (pairs.application_name) config.application_name = pairs.application_name;
  if (pairs.connect_timeout) config.connectionTimeoutMillis = Number(pairs.connect_timeout) * 1000;
  if (pairs.sslmode && pairs.sslmode !== 'disable') config.ssl = pairs.sslmode === 'require' ? { rejectUnauthorized: false } : true;
  return { hosts, readWrite: isReadWrite(pairs.target_session_attrs), config };
}

function hostPort(entry: string): HostPort {
  const bracketed = /^\[([^\]]+)\](?::(\d+))?$/.exec(entry);
  if (bracketed) return { host: bracketed[1]!, port: Number(bracketed[2] ?? DEFAULT_PORT) };
  const [host, port] = entry.split(':');
  return { host: decodeURIComponent(host || 'localhost'), port: Number(port || DEFAULT_PORT) };
}

function isReadWrite(attrs: string | undefined): boolean {
  return attrs === 'read-write' || attrs === 'primary';
}

/** libpq's key=value form, with single-quoted values and backslash escapes. */
function keyValues(text: string): Record<string, string> {
  const pairs: Record<string, string> = {};
  const pattern = /(\w+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))/g;
  for (let match = pattern.exec(text); match; match = pattern.exec(text)) {
    pairs[match[1]!] = (match[2] ?? match[3] ?? '').replace(/\\(.)/g, '$1');
  }
  return pairs;
}

/** Raised when no listed host takes the connection: a connection error (SQLSTATE class 08), so callers back off and retry. */
export class NoServerError extends Error {
  readonly code = '08001';
}

/**
 * A pg.Client class (for pg.Pool's `Client` option and for LISTEN connections) that
 * connects to the fitting host of `target`. The last good host is shared by every
 * connection of the engine, so after a failover one probe moves them all.
 */
export function multiHostClient(target: MultiHostTarget): typeof pg.Client {
  let current: HostPort | undefined;

  const fits = async (candidate: HostPort): Promise<boolean> => {
    const probe = new pg.Client({ ...target.config, connectionTimeoutMillis: PROBE_TIMEOUT_MS });
    // Set after construction: the connection string's own host would win over a host in the config.
    probe.host = candidate.host;
    probe.port = candidate.port;
    probe.on('error', () => {});
    try {
      await probe.connect();
      if (!target.readWrite) return true;
      const result = await probe.query('select pg_is_in_recovery() as standby');
      return result.rows[0]?.standby === false;
    } catch {
      return false;
    } finally {
      await probe.end().catch(() => undefined);
    }
  };
  const pick = async (): Promise<HostPort> => {
    if (current) return current;
    for (const candidate of target.hosts) {
      if (await fits(candidate)) return (current = candidate);
    }
    const listed = target.hosts.map((h) => `${h.host}:${h.port}`).join(',');
    throw new NoServerError(`no ${target.readWrite ? 'read-write ' : ''}server answered among ${listed}`);
  };

  const baseConnect = pg.Client.prototype.connect as unknown as (this: pg.Client) => Promise<void>;
  const connectToTarget = async (client: pg.Client): Promise<void> => {
    const chosen = await pick();
    client.host = chosen.host;
    client.port = chosen.port;
    try {
      await baseConnect.call(client);
      if (target.readWrite) {
        const result = await client.query('select pg_is_in_recovery() as standby');
        if (result.rows[0]?.standby !== false) {
          await client.end().catch(() => undefined);
          throw new NoServerError(`${chosen.host}:${chosen.port} is in recovery (read-only); looking for the read-write server`);
        }
      }
    } catch (error) {
      if (current === chosen) current = undefined;
      throw error;
    }
  };

  class MultiHostClient extends pg.Client {
    constructor(config?: pg.ClientConfig) {
      super({ ...config, ...target.config });
    }
  }
  // pg.Pool calls connect(callback), a LISTEN connection connect(): both forms, as pg.Client has them.
  Object.defineProperty(MultiHostClient.prototype, 'connect', {
    value: function (this: pg.Client, callback?: (err: Error | null, client?: pg.Client) => void) {
      const connecting = connectToTarget(this);
      if (!callback) return connecting.then(() => this);
      connecting.then(
        () => callback(null, this),
        (error: Error) => callback(error),
      );
      return undefined;
    },
  });
  return MultiHostClient as unknown as typeof pg.Client;
}
