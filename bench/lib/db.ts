import pg from 'pg';
import { sleep } from './stats.js';
import { uncountedClient } from './pg-count.js';
import { config } from './config.js';

/** `create database` for a benchmark database: with BENCH_DB_LOCALE's collation when it is set. */
export function createDatabaseSql(name: string): string {
  return config.dbLocale
    ? `create database ${name} template template0 locale '${config.dbLocale.replace(/'/g, "''")}'`
    : `create database ${name}`;
}

export function urlFor(baseUrl: string, database: string): string {
  const url = new URL(baseUrl);
  url.pathname = `/${database}`;
  return url.toString();
}

export async function withAdmin<T>(adminUrl: string, fn: (client: pg.Client) => Promise<T>): Promise<T> {
  const client = uncountedClient(adminUrl);
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

export async function createDatabase(adminUrl: string, name: string): Promise<string> {
  await withAdmin(adminUrl, async (c) => {
    await c.query(`drop database if exists ${name} with (force)`);
    await c.query(createDatabaseSql(name));
  });
  return urlFor(adminUrl, name);
}

export async function dropDatabase(adminUrl: string, name: string): Promise<void> {
  await withAdmin(adminUrl, (c) => c.query(`drop database if exists ${name} with (force)`)).catch(() => undefined);
}

/**
 * xact_commit of one database, read from the admin database so the reader's own
 * transactions are not counted. Call it after every connection to `database` is
 * closed (backends flush their statistics when they exit), it waits until the
 * figure stops moving.
 */
/**
 * With `idleSince` (performance.now() of the moment the sessions that stay open went quiet,
 * e.g. a paused worker's): an idle backend flushes its pending statistics only after
 * PGSTAT_IDLE_INTERVAL (10 s), so this waits until 11 s have passed since then, and then
 * takes two equal reads as settled without waiting for those sessions to close.
 */
export async function settledCommits(adminUrl: string, database: string, idleSince?: number): Promise<number> {
  const sessionsMayStayOpen = idleSince !== undefined;
  if (sessionsMayStayOpen) await sleep(Math.max(0, idleSince + 11_000 - performance.now()));
  return withAdmin(adminUrl, async (c) => {
    const read = async () =>
      Number((await c.query('select xact_commit::bigint as n from pg_stat_database where datname = $1', [database])).rows[0]?.n ?? 0);
    let last = await read();
    for (let i = 0; i < 40; i++) {
      await sleep(i === 0 ? 300 : 500);
      const now = await read();
      const others = Number(
        (await c.query('select count(*)::int as n from pg_stat_activity where datname = $1 and pid <> pg_backend_pid()', [database]))
          .rows[0].n,
      );
      // a paused worker keeps its sessions open: then two equal reads 0.5 s apart (after the first 0.3 s) settle it
      if (now === last && (others === 0 || (sessionsMayStayOpen && i >= 2))) return now;
      last = now;
    }
    return last;
  });
}

/** Marks the harness's own statements, so pg_stat_statements figures can leave them out. */
export const PROBE_TAG = '/* bench-probe */';

/** A probe connection on the benchmark database; counts its own statements so they can be subtracted from commits. */
export class Probe {
  statements = 0;
  private readonly client: pg.Client;
  constructor(url: string) {
    this.client = uncountedClient(url);
  }
  connect() {
    return this.client.connect();
  }
  async query<R extends pg.QueryResultRow = any>(text: string, values?: unknown[]): Promise<pg.QueryResult<R>> {
    this.statements++;
    return this.client.query<R>(`${PROBE_TAG} ${text}`, values as any[]);
  }
  async scalar(text: string, values?: unknown[]): Promise<number> {
    const r = await this.query(text, values);
    return Number(Object.values(r.rows[0] ?? { n: 0 })[0]);
  }
  end() {
    return this.client.end();
  }
}
