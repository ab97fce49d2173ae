import { WorkflowWorldError } from '@workflow/errors';
import { unstorableReason } from '../index.js';

/**
 * Bad input to the World: a WorkflowWorldError (the SDK's own error class, status 400) with
 * runledger's stable code INVALID_INPUT, thrown before anything is written.
 */
export function invalid(message: string): WorkflowWorldError {
  return new WorkflowWorldError(`runledger/workflow-world: ${message}`, { status: 400, code: 'INVALID_INPUT' });
}

/**
 * Refuses a value bound for a text or jsonb column (ids, names, tokens, attributes, headers,
 * idempotency keys) that holds a string PostgreSQL cannot store: a NUL, which it refuses, or a
 * lone surrogate, which jsonb refuses and a text column would silently store as U+FFFD, so two
 * different tokens would become one. Payloads go to json columns, which keep both as escapes.
 */
export function storable(what: string, value: unknown): void {
  if (typeof value === 'string') {
    const reason = unstorableReason(value);
    if (reason) throw invalid(`${what} holds ${reason}`);
  } else if (Array.isArray(value)) value.forEach((item, i) => storable(`${what}[${i}]`, item));
  else if (value !== null && typeof value === 'object' && !(value instanceof Uint8Array) && !(value instanceof Date))
    for (const [key, inner] of Object.entries(value)) {
      storable(`${what} key`, key);
      storable(`${what}.${key}`, inner);
    }
}
