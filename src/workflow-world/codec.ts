/**
 * How the World stores the Workflow SDK's values in runledger's json columns: JSON, with
 * binary data (the SDK's serialized payloads are Uint8Array) tagged as base64 and dates tagged
 * as ISO strings, so that a value reads back exactly as it was written. Both tags are what the
 * SDK's own JSON transports use, so a stored payload is also readable in psql.
 */

const BYTES = 'Uint8Array';
const DATE = 'Date';

interface Tagged {
  __type?: unknown;
  data?: unknown;
  value?: unknown;
}

/** JSON text of `value`, or null for undefined (an absent field). */
export function encodeValue(value: unknown): string | null {
  if (value === undefined) return null;
  return JSON.stringify(value, function replace(this: Record<string, unknown>, key: string, current: unknown) {
    const raw = this[key];
    if (raw instanceof Uint8Array) return { __type: BYTES, data: Buffer.from(raw).toString('base64') };
    if (raw instanceof Date) return { __type: DATE, value: Number.isNaN(raw.getTime()) ? null : raw.toISOString() };
    return current;
  });
}

/** Reverses a tag of encodeValue; any other value as it is. */
function revive(_key: string, value: unknown): unknown {
  if (value === null || typeof value !== 'object') return value;
  const tagged = value as Tagged;
  if (tagged.__type === BYTES && typeof tagged.data === 'string') return new Uint8Array(Buffer.from(tagged.data, 'base64'));
  if (tagged.__type === DATE && (typeof tagged.value === 'string' || tagged.value === null)) return new Date(tagged.value ?? Number.NaN);
  return value;
}

/** The value of a json column read as text (`column::text`); null (SQL NULL) is undefined. */
export function decodeValue(stored: string | null | undefined): unknown {
  if (stored === null || stored === undefined) return undefined;
  return JSON.parse(stored, revive);
}
