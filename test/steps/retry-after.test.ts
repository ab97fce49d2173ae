import { describe, expect, it } from 'vitest';
import { ConfigError, ModelError, RetryAfterError } from '../../src/index.js';
import { retryAfterMs } from '../../src/steps/retry-after.js';

/** Where a failed call's "call again later" is read from: runledger's error and the shapes providers' SDKs throw. */
describe('retryAfterMs', () => {
  const now = Date.parse('2026-12-07T12:00:00Z');

  it('reads a RetryAfterError, a duration or milliseconds', () => {
    expect(retryAfterMs(new RetryAfterError('2s'))).toBe(2_000);
    expect(retryAfterMs(new RetryAfterError(1_500))).toBe(1_500);
    expect(new RetryAfterError('1m')).toMatchObject({ code: 'RETRY_AFTER', retryAfterMs: 60_000 });
    expect(() => new RetryAfterError('soon')).toThrow(ConfigError);
  });

  it('reads 429 and 503 with Retry-After in seconds, as an HTTP date, or retry-after-ms, from a record or Headers', () => {
    expect(retryAfterMs({ statusCode: 429, responseHeaders: { 'retry-after': '3' } })).toBe(3_000);
    expect(retryAfterMs({ status: 503, headers: new Headers({ 'Retry-After': '0.5' }) })).toBe(500);
    expect(retryAfterMs({ status: 429, headers: new Headers({ 'retry-after-ms': '1200', 'retry-after': '9' }) })).toBe(1_200);
    expect(retryAfterMs({ status: 429, headers: { 'Retry-After': 'Mon, 07 Dec 2026 12:00:05 GMT' } }, now)).toBe(5_000);
    expect(retryAfterMs({ response: { status: 429, headers: new Headers({ 'retry-after': '4' }) } })).toBe(4_000);
  });

  it('finds it on a cause, and on the ModelError of openAiChatModel (details.retryAfterMs)', () => {
    const apiError = { statusCode: 429, responseHeaders: { 'retry-after': '7' } };
    expect(retryAfterMs(new ModelError('rate limited', { status: 429, retryable: true, cause: apiError }))).toBe(7_000);
    expect(retryAfterMs(new ModelError('rate limited', { status: 429, retryable: true, details: { retryAfterMs: 2_500 } }))).toBe(2_500);
  });

  it('ignores other statuses, a missing or unreadable header, and caps a provider at a day', () => {
    expect(retryAfterMs({ status: 500, headers: { 'retry-after': '3' } })).toBeUndefined();
    expect(retryAfterMs({ status: 429, headers: {} })).toBeUndefined();
    expect(retryAfterMs({ status: 429, headers: { 'retry-after': 'whenever' } })).toBeUndefined();
    expect(retryAfterMs(new Error('plain'))).toBeUndefined();
    expect(retryAfterMs(null)).toBeUndefined();
    expect(retryAfterMs({ status: 429, headers: { 'retry-after': '999999' } })).toBe(86_400_000);
  });
});
