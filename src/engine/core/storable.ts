/**
 * Characters a JavaScript string can hold and PostgreSQL cannot store: NUL (text and
 * jsonb refuse U+0000) and half of a UTF-16 surrogate pair (a "lone surrogate", as
 * `'Great 😀'.slice(0, 7)` leaves). Sent as jsonb, JSON.stringify writes them as the
 * escapes `\u0000` and `\ud83d`, which PostgreSQL refuses (22P05, 22P02); sent as text, a
 * NUL is refused (22021) and Node's UTF-8 encoder silently turns a lone surrogate into
 * U+FFFD, so two different keys would be stored as one. Either way one such value must
 * fail where it is produced, never a statement shared with other runs.
 */
const UNSTORABLE = /\0|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

/**
 * The same characters as JSON.stringify escapes them. JSON.stringify writes a valid pair
 * as the characters themselves, so an escaped surrogate is a lone one unless another
 * producer escaped a whole pair (high escape then low escape), which stays allowed. The
 * escape counts only after an even run of backslashes (`\\u0000` is a backslash and text).
 */
const UNSTORABLE_ESCAPE =
  /(?<!\\)((?:\\\\)*)\\u(?:0000|d[89ab][0-9a-f]{2}(?!\\ud[c-f][0-9a-f]{2}))|(?<!\\)(?<!\\ud[89ab][0-9a-f]{2})((?:\\\\)*)\\ud[c-f][0-9a-f]{2}/gi;

/** Where the first unstorable character of `text` is, or -1. */
export function unstorableIndex(text: string): number {
  const match = UNSTORABLE.exec(text);
  return match ? match.index : -1;
}

/** "a NUL character (U+0000) at index 3", for an error message. */
function describeAt(text: string, index: number): string {
  const unit = text.charCodeAt(index);
  return unit === 0
    ? `a NUL character (U+0000) at index ${index}`
    : `a lone surrogate (U+${unit.toString(16).toUpperCase()}, half of a character) at index ${index}`;
}

/** Why `text` cannot be stored, or undefined when it can. */
export function unstorableReason(text: string): string | undefined {
  const index = unstorableIndex(text);
  return index < 0 ? undefined : `${describeAt(text, index)}, which PostgreSQL cannot store`;
}

/** True when JSON text (JSON.stringify's) holds an escape PostgreSQL's jsonb refuses. */
export function hasUnstorableEscape(json: string): boolean {
  if (!json.includes('\\u')) return false; // JSON.stringify escapes with \u only control characters and lone surrogates
  UNSTORABLE_ESCAPE.lastIndex = 0;
  return UNSTORABLE_ESCAPE.test(json);
}

/**
 * Diagnostics (a thrown error's message and stack, evidence the engine builds from them)
 * are kept rather than refused: the unstorable characters become U+FFFD, so the record of
 * why a run failed is stored. User payloads are never changed this way: they are refused.
 */
export function storableText(text: string): string {
  return unstorableIndex(text) < 0 ? text : text.replace(new RegExp(UNSTORABLE.source, 'g'), '\ufffd');
}

/** storableText for JSON text: the escapes jsonb refuses become `\ufffd`. */
export function storableJson(json: string): string {
  if (!hasUnstorableEscape(json)) return json;
  UNSTORABLE_ESCAPE.lastIndex = 0;
  return json.replace(UNSTORABLE_ESCAPE, (_match, before?: string, beforeLow?: string) => `${before ?? beforeLow ?? ''}\\ufffd`);
}
