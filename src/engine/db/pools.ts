import type pg from 'pg';
import { serializeError } from '../core/errors.js';

import type { LogFunction } from '../core/log.js';

/** A connection killed by the server (restart, pg_terminate_backend) must not crash the process; the pool replaces it. */
export function guardPool(pool: pg.Pool, label: string, log: LogFunction): void {
  const onError = (error: Error) => log('warn', `${label}: connection lost`, { error: serializeError(error) });
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
