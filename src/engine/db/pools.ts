import type pg from 'pg';
import { serializeError } from '../core/errors.js';

import type { LogFunction } from '../core/log.js';

/** After a logged loss, further losses of the same pool within this window are counted and logged as one line. */
const LOSS_WINDOW_MS = 10_000;

/**
 * A connection killed by the server (restart, pg_terminate_backend) must not crash the process; the pool replaces it.
 * A restart kills every connection at once, and node-postgres reports an idle one both on the client and on the
 * pool: the first loss is logged, the rest of the outage becomes one "N more" line, so the log grows per outage,
 * not per connection.
 */
export function guardPool(pool: pg.Pool, label: string, log: LogFunction): void {
  const seen = new WeakSet<Error>();
  let windowOpen = false;
  let more = 0;
  const onError = (error: Error) => {
    if (seen.has(error)) return; // the same error, re-emitted by the pool for an idle client
    seen.add(error);
    if (windowOpen) {
      more++;
      return;
    }
    windowOpen = true;
    log('warn', `${label}: connection lost`, { error: serializeError(error) });
    setTimeout(() => {
      windowOpen = false;
      if (more > 0) log('warn', `${label}: ${more} more connection(s) lost in the ${LOSS_WINDOW_MS / 1000} s after that`);
      more = 0;
    }, LOSS_WINDOW_MS).unref();
  };
  pool.on('error', onError);
  pool.on('connect', (client) => client.on('error', onError));
}

/** Default of createEngine's queryTimeoutMs: longer than any statement runledger itself sends. */
export const QUERY_TIMEOUT_MS_DEFAULT = 60_000;

/**
 * Timeouts of every connection the engine opens itself, so that no query waits forever
 * on a half-open connection (a peer or middlebox gone without FIN or RST):
 * query_timeout gives up on a query without an answer (pg then discards the
 * connection), connectionTimeoutMillis on a connection (or a free pool slot) that does
 * not come, and TCP keepalive lets the kernel find a dead peer on an idle socket.
 */
export function connectionTimeouts(queryTimeoutMs: number): pg.PoolConfig {
  return {
    query_timeout: queryTimeoutMs,
    connectionTimeoutMillis: queryTimeoutMs,
    keepAlive: true,
    keepAliveInitialDelayMillis: Math.min(10_000, queryTimeoutMs),
  };
}
