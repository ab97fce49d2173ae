import { RunledgerError } from '../engine/core/errors.js';

/**
 * A model call failed: the provider answered an HTTP error, the connection failed, the
 * request was aborted, or the reply was not a reply (no message, no usage). `retryable`
 * says whether the same request may succeed later (HTTP 408, 409, 429 and 5xx, a refused
 * or dropped connection); `ctx.generate`'s default retry policy retries only those.
 * `status` is the HTTP status, null when there was no HTTP answer.
 */
export class ModelError extends RunledgerError {
  readonly status: number | null;
  readonly retryable: boolean;

  constructor(
    message: string,
    options: { status?: number | null; retryable: boolean; cause?: unknown; details?: Record<string, unknown> },
  ) {
    const status = options.status ?? null;
    super('MODEL_ERROR', message, {
      cause: options.cause,
      details: { status, retryable: options.retryable, ...options.details },
    });
    this.status = status;
    this.retryable = options.retryable;
    // A non-retryable model error stops ctx.step's retries whatever the policy says.
    if (!options.retryable) Object.defineProperty(this, 'nonRetryable', { value: true, enumerable: false });
  }
}

/** The HTTP statuses worth asking again: timeouts, conflicts, rate limits and server errors. */
export function isRetryableStatus(status: number): boolean {
  return status === 408 || status === 409 || status === 429 || status >= 500;
}
