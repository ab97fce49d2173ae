import { toMs, type Duration } from '../engine/core/duration.js';
import { RunledgerError } from '../engine/core/errors.js';

/**
 * Throw it from a step, operation, tool or model call when the provider said when to call
 * again: the next attempt waits at least that long, and on a `rateLimit` key every run's
 * calls on the key wait until then (the circuit opens for everyone). Retried like any error,
 * within the retry policy.
 */
export class RetryAfterError extends RunledgerError {
  readonly retryAfterMs: number;
  constructor(retryAfter: Duration, message?: string, options: { cause?: unknown } = {}) {
    const ms = toMs(retryAfter, 'RetryAfterError');
    super('RETRY_AFTER', message ?? `the provider asked to be called again in ${ms} ms`, {
      cause: options.cause,
      details: { retryAfterMs: ms },
    });
    this.retryAfterMs = ms;
  }
}

/** The longest pause a Retry-After may impose: a day (a provider's answer is not trusted for longer). */
const MAX_RETRY_AFTER_MS = 86_400_000;

/**
 * How long the outside world asked us to wait, from the error of a failed call, or undefined:
 * a RetryAfterError; else an error (or its cause, a few levels down) with HTTP status 429 or 503
 * and a `retry-after-ms` or `retry-after` header (seconds or an HTTP date), as the AI SDK's
 * APICallError (statusCode, responseHeaders), the OpenAI SDK's errors (status, headers),
 * fetch Responses and runledger's ModelError (details.retryAfterMs) carry them.
 */
export function retryAfterMs(error: unknown, now = Date.now()): number | undefined {
  for (let e = error, depth = 0; e !== null && typeof e === 'object' && depth < 5; e = (e as { cause?: unknown }).cause, depth++) {
    if (e instanceof RetryAfterError) return Math.min(e.retryAfterMs, MAX_RETRY_AFTER_MS);
    const found = fromHttpError(e as Record<string, unknown>, now);
    if (found !== undefined) return Math.min(found, MAX_RETRY_AFTER_MS);
  }
  return undefined;
}

function fromHttpError(e: Record<string, unknown>, now: number): number | undefined {
  const status = [e.status, e.statusCode, (e.response as { status?: unknown } | undefined)?.status].find((s) => typeof s === 'number');
  if (status !== 429 && status !== 503) return undefined;
  // runledger's own ModelError (openAiChatModel) carries the header's value in its details.
  const given = (e.details as { retryAfterMs?: unknown } | undefined)?.retryAfterMs;
  if (typeof given === 'number' && Number.isFinite(given) && given >= 0) return Math.ceil(given);
  const headers = e.responseHeaders ?? e.headers ?? (e.response as { headers?: unknown } | undefined)?.headers;
  const ms = header(headers, 'retry-after-ms');
  if (ms !== undefined && /^\d+(\.\d+)?$/.test(ms.trim())) return Math.ceil(Number(ms));
  const after = header(headers, 'retry-after');
  if (after === undefined) return undefined;
  if (/^\d+(\.\d+)?$/.test(after.trim())) return Math.ceil(Number(after) * 1000);
  const at = Date.parse(after);
  return Number.isNaN(at) ? undefined : Math.max(0, at - now);
}

function header(headers: unknown, name: string): string | undefined {
  if (!headers || typeof headers !== 'object') return undefined;
  if (typeof (headers as { get?: unknown }).get === 'function') {
    const value = (headers as { get: (n: string) => unknown }).get(name);
    return typeof value === 'string' ? value : undefined;
  }
  for (const [key, value] of Object.entries(headers)) {
    if (key.toLowerCase() === name) return typeof value === 'string' ? value : Array.isArray(value) ? String(value[0]) : undefined;
  }
  return undefined;
}
