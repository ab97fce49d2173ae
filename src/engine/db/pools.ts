import type pg from 'pg';
import { serializeError } from '../core/errors.js';

import type { LogFunction } from '../core/log.js';

/** A connection killed by the server (restart, pg_terminate_backend) must not crash the process; the pool replaces it. */
export function guardPool(pool: pg.Pool, label: string, log: LogFunction): void {
  const onError = (error: Error) => log('warn', `${label}: connection lost`, { error: serializeError(error) });
  pool.on('error', onError);
  pool.on('connect', (client) => client.on('error', onError));
}
