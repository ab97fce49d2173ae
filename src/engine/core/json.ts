import { InvalidInputError, NotSerializableError, PayloadTooLargeError } from './errors.js';
import { hasUnstorableEscape, unstorableReason } from './storable.js';

/** PAYLOAD_TOO_LARGE for a payload's text over the limit (maxPayloadBytes). */
export function checkPayloadSize(text: string, what: string, limit: number): void {
  const bytes = Buffer.byteLength(text);
  if (bytes > limit) throw new PayloadTooLargeError(`${what} is ${bytes} bytes, over the limit of ${limit}`);
}

/** A value produced inside a workflow: OUTPUT_NOT_SERIALIZABLE naming `what` (its path) and the character. */
export function assertStorable(text: string, what: string): void {
  const why = unstorableReason(text);
  if (why !== undefined) throw new NotSerializableError(`${what} holds ${why}`);
}

/** A value given to a client call (a key, an id, a reason): INVALID_INPUT, nothing stored. */
export function assertStorableInput(text: string | undefined | null, what: string): void {
  if (typeof text !== 'string') return;
  const why = unstorableReason(text);
  if (why !== undefined) throw new InvalidInputError(`${what} holds ${why}; nothing was stored`, { details: { argument: what } });
}

/** assertStorableInput for each named argument of a client call (`engine.signal`: runId, topic...). */
export function assertStorableInputs(call: string, args: Record<string, string | undefined | null>): void {
  for (const [name, value] of Object.entries(args)) assertStorableInput(value, `${call}: ${name}`);
}

/** toJsonText for a value a client call was given: INVALID_INPUT rather than OUTPUT_NOT_SERIALIZABLE, nothing stored. */
export function inputJsonText(value: unknown, what: string): string | undefined {
  try {
    return toJsonText(value, what);
  } catch (error) {
    if (error instanceof NotSerializableError) throw new InvalidInputError(`${error.message}; nothing was stored`, { cause: error });
    throw error;
  }
}

/**
 * Checks that a value survives JSON unchanged in meaning and returns its JSON
 * text (or undefined for `undefined`). Functions, symbols, bigints, non-finite
 * numbers and cycles are refused with a clear error instead of being silently
 * dropped, so a checkpoint never stores something other than what the step returned.
 * A string (value or key) PostgreSQL cannot store (a NUL, a lone surrogate: core/storable.ts)
 * is refused here too, naming its path, so it fails the call that produced it and never a
 * statement shared with other runs.
 */
export function toJsonText(value: unknown, what: string): string | undefined {
  if (value === undefined) return undefined;
  check(value, what, new Set());
  const text = JSON.stringify(value);
  // What a toJSON (a class of the user's) returned was not walked above.
  if (text !== undefined && hasUnstorableEscape(text)) {
    throw new NotSerializableError(`${what} holds a NUL character or a lone surrogate (from a toJSON), which PostgreSQL cannot store`);
  }
  return text;
}

function check(value: unknown, path: string, seen: Set<object>): void {
  switch (typeof value) {
    case 'string':
      assertStorable(value, path);
      return;
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
        for (const [key, item] of Object.entries(value)) {
          assertStorable(key, `the key ${JSON.stringify(key)} of ${path}`);
          check(item, `${path}.${key}`, seen);
        }
      }
      seen.delete(value);
      return;
    }
  }
}
