import { ENCODE_JSON_TEXT, type JsonTextEncoder, type JsonValue, type PayloadCodec } from './codec.js';
import { PayloadUnreadableError, RunledgerError } from './errors.js';

/**
 * The engine's side of the payload codec (createEngine's `codec`): where a user payload
 * is written it goes through here, and where one is read it comes back through here.
 * Without a codec every method returns what it is given, so the hot path pays nothing.
 *
 * What is a user payload, and where it sits in what is stored (everything else the engine
 * writes, names, statuses, times, errors, events, stays clear):
 * - runs.input and runs.output; a verify's evidence in the termination record;
 * - a checkpoint's output (steps.output), by kind: all of it for a step or transaction;
 *   `value` of an operation (SQL copies it to operations.result); `payload` of a signal
 *   wait and `output` of a child wait (SQL copies them from the signal and from the
 *   child's run); the `note`s of an approval decision. The rest of those objects is the
 *   engine's own (ids, statuses, timestamps);
 * - signals.payload, approvals.evidence, what an approval asks (approvals.action, and the
 *   `action` of a waiting approval's spec in steps.output), decision notes (approvals.note,
 *   approval_votes.note), operations.result given by resolve_operation, step_progress.progress,
 *   stream_chunks.chunk, session_entries.content, artifact_blobs.content.
 *
 * Errors the engine makes never quote a payload when a codec is on (an invalid reconcile
 * answer is described, not shown); errors the workflow's own code throws are stored as
 * thrown (docs/security.md, "What stays clear").
 */
export class Payloads {
  readonly #codec: PayloadCodec | undefined;
  /** A payload's JSON text to the stored JSON text. */
  readonly #text: ((jsonText: string) => string) | undefined;
  /** A payload's JSON text to the stored value. */
  readonly #fromText: ((jsonText: string) => JsonValue) | undefined;

  constructor(codec?: PayloadCodec) {
    this.#codec = codec;
    if (!codec) return;
    // The codec sees each payload's JSON form (parsed from the text the engine checked), never a Date or a class.
    this.#fromText = (text) => codec.encode(JSON.parse(text) as JsonValue);
    const fast = (codec as Partial<JsonTextEncoder>)[ENCODE_JSON_TEXT];
    this.#text = fast
      ? (text) => fast.call(codec, text)
      : (text) => {
          const stored = JSON.stringify(codec.encode(JSON.parse(text) as JsonValue));
          if (stored === undefined) throw new PayloadUnreadableError('the codec encoded a payload as undefined, which cannot be stored');
          return stored;
        };
  }

  /** True when payloads are encoded. */
  get enabled(): boolean {
    return this.#codec !== undefined;
  }

  /** The stored JSON text of a payload given as its (checked) JSON text. */
  text(jsonText: string): string {
    return this.#text ? this.#text(jsonText) : jsonText;
  }

  /** text() for an optional payload: undefined (nothing stored) stays undefined. */
  optionalText(jsonText: string | undefined): string | undefined {
    return jsonText === undefined ? undefined : this.text(jsonText);
  }

  /** The stored form of a payload that goes inside engine-written JSON (a wait's spec, a session entry): a JSON value. */
  value(value: unknown): unknown {
    if (!this.#fromText || value === undefined) return value;
    return this.#fromText(JSON.stringify(value));
  }

  /** The payload a stored value stands for; a value the codec did not encode comes back as it is. */
  decode<T = unknown>(stored: unknown): T {
    if (!this.#codec || stored === null || stored === undefined) return stored as T;
    try {
      return this.#codec.decode(stored as JsonValue) as T;
    } catch (error) {
      if (error instanceof RunledgerError) throw error;
      throw new PayloadUnreadableError(`the codec could not decode a stored payload: ${(error as Error)?.message ?? String(error)}`, {
        cause: error,
      });
    }
  }

  /** A payload kept in a text column (a decision note, an approval's action): the JSON text of its encoded form. */
  note(note: string | null | undefined): string | null {
    if (note === undefined || note === null) return null;
    return this.#text ? this.#text(JSON.stringify(note)) : note;
  }

  /** A text payload (note, action) as given, or the text an encoded one stands for. */
  decodeNote<T>(note: T): T {
    if (!this.#codec || typeof note !== 'string' || !note.startsWith('{')) return note;
    let parsed: unknown;
    try {
      parsed = JSON.parse(note);
    } catch {
      return note;
    }
    const decoded = this.decode(parsed);
    return (decoded !== parsed && typeof decoded === 'string' ? decoded : note) as T;
  }

  /** Artifact content: its encoded form as bytes (the JSON text of the codec's value for the content as base64). */
  bytes(content: Buffer): Buffer {
    if (!this.#text) return content;
    return Buffer.from(this.text(JSON.stringify(content.toString('base64'))), 'utf8');
  }

  /** The content stored bytes stand for; bytes the codec did not encode (written before it, or by reference) as they are. */
  decodeBytes(stored: Buffer): Buffer {
    if (!this.#codec || stored.length === 0 || stored[0] !== 0x7b /* { */) return stored;
    let parsed: unknown;
    try {
      parsed = JSON.parse(stored.toString('utf8'));
    } catch {
      return stored;
    }
    const decoded = this.decode(parsed);
    if (decoded === parsed) return stored;
    if (typeof decoded !== 'string') throw new PayloadUnreadableError('an encoded artifact does not hold base64 content');
    return Buffer.from(decoded, 'base64');
  }

  /** A checkpoint's output as stored (steps.output, not wrapped), in clear. See the class comment for what is payload by kind. */
  decodeStepOutput(kind: string, stored: unknown): unknown {
    if (!this.#codec || stored === null || stored === undefined) return stored;
    switch (kind) {
      case 'step':
      case 'transaction':
        return this.decode(stored);
      case 'operation':
        return this.#field(stored, 'value', (v) => this.decode(v));
      case 'signal':
        return this.#field(stored, 'payload', (v) => this.decode(v));
      case 'child':
        return this.#field(stored, 'output', (v) => this.decode(v));
      case 'approval':
        return this.#approvalSpec(
          this.#notes(stored, (n) => this.decodeNote(n)),
          (action) => this.decodeNote(action),
          (evidence) => this.decode(evidence),
        );
      default:
        return stored; // sleep, child_start: the engine's own
    }
  }

  /** The inverse of decodeStepOutput, for checkpoints a migration writes. */
  encodeStepOutput(kind: string, output: unknown): unknown {
    if (!this.#codec || output === undefined) return output;
    switch (kind) {
      case 'step':
      case 'transaction':
        return this.value(output);
      case 'operation':
        return this.#field(output, 'value', (v) => this.value(v));
      case 'signal':
        return this.#field(output, 'payload', (v) => this.value(v));
      case 'child':
        return this.#field(output, 'output', (v) => this.value(v));
      case 'approval':
        return this.#approvalSpec(
          this.#notes(output, (n) => (typeof n === 'string' ? this.note(n) : n)),
          (action) => (typeof action === 'string' ? this.note(action) : action),
          (evidence) => (evidence === null ? evidence : this.value(evidence)),
        );
      default:
        return output;
    }
  }

  #field(object: unknown, key: string, map: (value: unknown) => unknown): unknown {
    if (typeof object !== 'object' || object === null || Array.isArray(object) || !(key in object)) return object;
    const before = (object as Record<string, unknown>)[key];
    const after = map(before);
    return after === before ? object : { ...object, [key]: after };
  }

  /** A waiting approval's checkpoint, `{ wake_at, spec: { action, evidence, ... } }`: its action and evidence mapped. */
  #approvalSpec(output: unknown, action: (value: unknown) => unknown, evidence: (value: unknown) => unknown): unknown {
    return this.#field(output, 'spec', (spec) => this.#field(this.#field(spec, 'action', action), 'evidence', evidence));
  }

  #notes(decision: unknown, map: (note: unknown) => unknown): unknown {
    const withNote = this.#field(decision, 'note', map);
    const votes = (withNote as { votes?: unknown } | null)?.votes;
    if (!Array.isArray(votes)) return withNote;
    return { ...(withNote as object), votes: votes.map((vote) => this.#field(vote, 'note', map)) };
  }
}

/** No codec: what every engine without one (and code that builds its own ExecutionDeps) uses. */
export const NO_CODEC = new Payloads();
