/**
 * A model result as a checkpoint holds it: JSON, with the AI SDK's few non-JSON values
 * (bytes of a generated file, the response's Date) written as tagged objects and read
 * back as what they were, so that a replay hands the AI SDK the same values as the call.
 */
export function toStored(value: unknown): unknown {
  if (value instanceof Uint8Array) return { $bytes: Buffer.from(value).toString('base64') };
  if (value instanceof Date) return { $date: value.toISOString() };
  if (value instanceof URL) return { $url: value.href };
  if (Array.isArray(value)) return value.map(toStored);
  if (value !== null && typeof value === 'object') {
    const out: Record<string, unknown> = {};
    for (const [key, inner] of Object.entries(value)) if (inner !== undefined) out[key] = toStored(inner);
    return out;
  }
  return value;
}

export function fromStored(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(fromStored);
  if (value !== null && typeof value === 'object') {
    const tagged = value as { $bytes?: unknown; $date?: unknown; $url?: unknown };
    const keys = Object.keys(value);
    if (keys.length === 1 && typeof tagged.$bytes === 'string') return new Uint8Array(Buffer.from(tagged.$bytes, 'base64'));
    if (keys.length === 1 && typeof tagged.$date === 'string') return new Date(tagged.$date);
    if (keys.length === 1 && typeof tagged.$url === 'string') return new URL(tagged.$url);
    const out: Record<string, unknown> = {};
    for (const [key, inner] of Object.entries(value)) out[key] = fromStored(inner);
    return out;
  }
  return value;
}
