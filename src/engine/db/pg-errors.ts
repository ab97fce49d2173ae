/** Postgres SQLSTATEs that mean "try the whole transaction again". */
const RETRYABLE_TRANSACTION_CODES = new Set([
  '40001', // serialization_failure
  '40P01', // deadlock_detected
]);

export function isRetryableTransactionError(error: unknown): boolean {
  return RETRYABLE_TRANSACTION_CODES.has(String((error as { code?: unknown } | null)?.code));
}

/** SQLSTATEs of a session that ended under us (terminated backend, server shutdown). */
const SESSION_ENDED_CODES = new Set(['57P01', '57P02', '57P03']);
/** Socket-level codes Node sets on system errors. */
const SOCKET_CODES = new Set(['ECONNRESET', 'ECONNREFUSED', 'EPIPE', 'ETIMEDOUT', 'ENOTCONN', 'EHOSTUNREACH']);

/**
 * True when the error says the connection, not the statement, failed: the
 * statement's outcome may be unknown. node-postgres gives a lost socket no code,
 * only its own fixed messages, so those are matched as a last resort.
 */
export function isConnectionError(error: unknown): boolean {
  const code = String((error as { code?: unknown } | null)?.code ?? '');
  if (code.startsWith('08') || SESSION_ENDED_CODES.has(code) || SOCKET_CODES.has(code)) return true;
  const message = String((error as { message?: unknown } | null)?.message ?? '');
  return /Connection terminated|Client has encountered a connection error|Client was closed and is not queryable|connection timeout|timeout exceeded when trying to connect/i.test(
    message,
  );
}

export function pgCode(error: unknown): string | undefined {
  const code = (error as { code?: unknown } | null)?.code;
  return typeof code === 'string' ? code : undefined;
}
