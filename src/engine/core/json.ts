import { NotSerializableError, PayloadTooLargeError } from './errors.js';

/** PAYLOAD_TOO_LARGE for a payload's text over the limit (maxPayloadBytes). */
export function checkPayloadSize(text: string, what: string, limit: number): void {
  const bytes = Buffer.byteLength(text);
  if (bytes > limit) throw new PayloadTooLargeError(`${what} is ${bytes} bytes, over the limit of ${limit}`);
}

/**
 * Checks that a value survives JSON unchanged in meaning and returns its JSON
 * text (or undefined for `undefined`). Functions, symbols, bigints, non-finite
 * numbers and cycles are refused with a clear error instead of being silently
 * dropped, so a checkpoint never stores something other than what the step returned.
 */
export function toJsonText(value: unknown, what: string): string | undefined {
  if (value === undefined) return undefined;
  check(value, what, new Set());
  return JSON.stringify(value);
}

function check(value: unknown, path: string, seen: Set<object>): void {
  switch (typeof value) {
    case 'string':
    case 'boolean':
      return;
    case 'number':
      if (!Number.isFinite(value)) throw new NotSerializableError(`${path} is ${value}, which JSON cannot represent`);
      return;
    case 'undefined':
      return; // dropped inside objects, null inside arrays: JSON's own rule, harmless
    case 'bigint':
      throw new NotSerializableError(`${path} is a bigint, which JSON cannot represent (convert it to a string)`);
    case 'function':
    case 'symbol':
      throw new NotSerializableError(`${path} is a ${typeof value}, which cannot be stored in a checkpoint`);
    case 'object': {
      if (value === null) return;
      if (typeof (value as { toJSON?: unknown }).toJSON === 'function') return; // Date and friends
      if (seen.has(value)) throw new NotSerializableError(`${path} contains a cycle`);
      seen.add(value);
      if (Array.isArray(value)) {
        value.forEach((item, i) => check(item, `${path}[${i}]`, seen));
      } else if (value instanceof Map || value instanceof Set) {
        throw new NotSerializableError(
          `${path} is a ${value.constructor.name}, which JSON stores as {} (convert it to an array or object)`,
        );
      } else {
        for (const [key, item] of Object.entries(value)) check(item, `${path}.${key}`, seen);
      }
      seen.delete(value);
      return;
    }
  }
}
