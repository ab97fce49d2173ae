import { createHash } from 'node:crypto';
import { sql } from 'kysely';
import type pg from 'pg';
import type { StepContext } from '../steps/context.js';
import { UNREADABLE, type Execution } from '../engine/run/execution.js';
import { NO_CODEC, type Payloads } from '../engine/core/payloads.js';
import { InvalidInputError, PayloadTooLargeError } from '../engine/core/errors.js';
import { assertStorable, toJsonText } from '../engine/core/json.js';
import { executionOf } from './execution-of.js';
import { storeBlob } from '../steps/blob.js';

/** An artifact's content (text or bytes, stored once by sha256), or a reference to where it lives. */
export type ArtifactContent = string | Uint8Array | { ref: string; sha256?: string; size?: number };

export interface ArtifactRecord {
  artifactId: string;
  runId: string;
  name: string;
  kind: 'artifact' | 'value';
  /** sha256 (hex) of the content; null for a reference given without one. */
  sha256: string | null;
  /** Bytes; null for a reference given without a size. */
  size: number | null;
  /** Where the content lives when it is not stored here. */
  ref: string | null;
  stepPosition: number | null;
  createdAt: string;
}

/**
 * Step results whose JSON text is larger than this are worth storing by reference
 * (storeLarge): the checkpoint then holds `{ "$artifact": sha256, "size": n }`, about
 * 100 bytes, and the content is stored once in runledger.artifact_blobs.
 */
export const LARGE_VALUE_THRESHOLD_BYTES = 64 * 1024;

/**
 * The largest artifact or stored value: PostgreSQL's bytea holds at most 1 GB, and the
 * content travels as one parameter; half of that keeps clear of the edge.
 */
export const MAX_ARTIFACT_BYTES = 512 * 1024 * 1024;

/** What a checkpoint holds in place of a large value. */
export interface LargeValueRef {
  $artifact: string;
  size: number;
}

const NAME_MAX = 200;
const REF_MAX = 2000;
const SHA256 = /^[0-9a-f]{64}$/;

interface ArtifactRow {
  artifact_id: string;
  run_id: string;
  name: string;
  kind: 'artifact' | 'value';
  sha256: string | null;
  size: number | string | null;
  ref: string | null;
  step_position: number | null;
  created_at: string | Date;
}

function toRecord(row: ArtifactRow): ArtifactRecord {
  return {
    artifactId: row.artifact_id,
    runId: row.run_id,
    name: row.name,
    kind: row.kind,
    sha256: row.sha256,
    size: row.size === null ? null : Number(row.size),
    ref: row.ref,
    stepPosition: row.step_position,
    createdAt: new Date(row.created_at).toISOString(),
  };
}

function checkName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || name.length === 0 || name.length > NAME_MAX) {
    throw new InvalidInputError(`artifact name must be a string of 1 to ${NAME_MAX} characters, got ${JSON.stringify(name)}`);
  }
  assertStorable(name, 'artifact name');
}

function sha256Of(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

function checkSize(what: string, bytes: number): void {
  if (bytes > MAX_ARTIFACT_BYTES) {
    throw new PayloadTooLargeError(`${what} is ${bytes} bytes, over the limit of ${MAX_ARTIFACT_BYTES}`, {
      details: { bytes, limit: MAX_ARTIFACT_BYTES },
    });
  }
}

type Prepared = { kind: 'content'; bytes: Buffer } | { kind: 'ref'; ref: string; sha256: string | null; size: number | null };

function prepare(name: string, content: ArtifactContent): Prepared {
  if (typeof content === 'string') return { kind: 'content', bytes: Buffer.from(content, 'utf8') };
  if (content instanceof Uint8Array) return { kind: 'content', bytes: Buffer.from(content.buffer, content.byteOffset, content.byteLength) };
  const given = content as { ref?: unknown; sha256?: unknown; size?: unknown } | null;
  if (typeof given !== 'object' || given === null || typeof given.ref !== 'string') {
    throw new InvalidInputError(`artifact ${name}: content must be a string, bytes (Uint8Array) or { ref }`);
  }
  if (given.ref.length === 0 || given.ref.length > REF_MAX) {
    throw new InvalidInputError(`artifact ${name}: ref must be 1 to ${REF_MAX} characters`);
  }
  if (given.sha256 !== undefined && (typeof given.sha256 !== 'string' || !SHA256.test(given.sha256))) {
    throw new InvalidInputError(`artifact ${name}: sha256 must be 64 lowercase hex digits`);
  }
  if (given.size !== undefined && (typeof given.size !== 'number' || !Number.isSafeInteger(given.size) || given.size < 0)) {
    throw new InvalidInputError(`artifact ${name}: size must be a whole number of bytes >= 0`);
  }
  return { kind: 'ref', ref: given.ref, sha256: given.sha256 ?? null, size: given.size ?? null };
}

/**
 * `ctx.artifact(name, content | { ref })`: a transaction step that stores the content
 * (once per sha256, however many runs record it; not sent again when already stored) and
 * records the artifact row with the step's checkpoint, so a replay returns the record
 * without recording it twice.
 */
export async function recordArtifact(ctx: StepContext, exec: Execution, name: string, content: ArtifactContent): Promise<ArtifactRecord> {
  checkName(name);
  const prepared = prepare(name, content);
  if (prepared.kind === 'content') checkSize(`artifact ${name}`, prepared.bytes.byteLength);
  if (prepared.kind === 'content') exec.checkPayload(prepared.bytes, `the content of artifact ${JSON.stringify(name)}`);
  else exec.checkText(prepared.ref, `the content of artifact ${JSON.stringify(name)}`);
  // The position the transaction below takes (taken synchronously, before any await).
  const position = exec.stepsTaken;
  const runId = exec.runId;
  const record = await ctx.transaction(`artifact:${name}`, async (trx) => {
    let row: ArtifactRow;
    if (prepared.kind === 'ref') {
      const result = await sql<{
        record: ArtifactRow;
      }>`select runledger._record_artifact(p_run_id => ${runId}, p_position => ${position}, p_name => ${name}, p_kind => 'artifact',
          p_sha256 => ${prepared.sha256}, p_size => ${prepared.size}, p_content => null, p_ref => ${prepared.ref}) as record`.execute(trx);
      row = result.rows[0]!.record;
    } else {
      // With a codec the blob is the content's envelope: its sha256 and size are those of the stored bytes.
      const content = exec.payloads.bytes(prepared.bytes);
      checkSize(`artifact ${name} (encoded)`, content.byteLength);
      const sha = sha256Of(content);
      const held = await sql<{ held: boolean }>`select runledger._artifact_blob_held(p_sha256 => ${sha}) as held`.execute(trx);
      const bytes = held.rows[0]!.held ? null : content;
      const result = await sql<{
        record: ArtifactRow;
      }>`select runledger._record_artifact(p_run_id => ${runId}, p_position => ${position}, p_name => ${name}, p_kind => 'artifact',
          p_sha256 => ${sha}, p_size => ${content.byteLength}, p_content => ${bytes}, p_ref => null) as record`.execute(trx);
      row = result.rows[0]!.record;
    }
    return toRecord(row);
  });
  return record as ArtifactRecord;
}

/** The value texts this execution stored, by sha256, so its first loadLarge needs no read back. */
const stored = new WeakMap<Execution, Map<string, string>>();

/**
 * For a step that may return a large value (a tool's output): call it on the value
 * inside the step and return what it returns. A value whose JSON text is at most
 * LARGE_VALUE_THRESHOLD_BYTES comes back as it is; a larger one is stored once as a
 * blob (by sha256; a run's row of kind 'value' keeps it referenced) and comes back as
 * `{ $artifact: sha256, size }`, which is what the step's checkpoint holds. Pass the
 * step's result to loadLarge to get the value, on the first execution as on a replay.
 *
 * Storing is idempotent (content-addressed), so a step that runs again after a crash
 * stores nothing twice.
 */
export async function storeLarge(ctx: StepContext | Execution, name: string, value: unknown): Promise<unknown> {
  checkName(name);
  const exec = executionOf(ctx);
  const text = toJsonText(value, `value ${name}`);
  if (text === undefined) return value;
  exec.checkPayload(text, `the stored value ${JSON.stringify(name)}`);
  if (Buffer.byteLength(text) <= LARGE_VALUE_THRESHOLD_BYTES) return value;
  // Stored as the codec has it (its envelope's JSON text), and addressed by the sha256 of that.
  const bytes = Buffer.from(exec.payloads.text(text), 'utf8');
  checkSize(`value ${name}`, bytes.byteLength);
  // Already the codec's form: stored as it is.
  const { sha256: sha } = await storeBlob(exec, { name, kind: 'value', bytes, position: exec.activeSteps.at(-1) ?? null, encoded: true });
  let texts = stored.get(exec);
  if (!texts) stored.set(exec, (texts = new Map()));
  texts.set(sha, text);
  return { $artifact: sha, size: bytes.byteLength } satisfies LargeValueRef;
}

/** True for what storeLarge returns in place of a large value: exactly `{ $artifact: <sha256>, size: <n> }`. */
export function isLargeValueRef(value: unknown): value is LargeValueRef {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) return false;
  const keys = Object.keys(value);
  const v = value as Record<string, unknown>;
  return keys.length === 2 && typeof v.$artifact === 'string' && SHA256.test(v.$artifact) && typeof v.size === 'number';
}

/**
 * The value behind what storeLarge returned (anything else comes back as it is): the
 * stored JSON text parsed, so the first execution and every replay get the same value.
 */
export async function loadLarge(ctx: StepContext | Execution, value: unknown): Promise<unknown> {
  if (!isLargeValueRef(value)) return value;
  const exec = executionOf(ctx);
  const texts = stored.get(exec);
  const text = texts?.get(value.$artifact);
  if (text !== undefined) {
    texts!.delete(value.$artifact); // read back once in memory; a later load reads the blob
    return JSON.parse(text) as unknown;
  }
  // As text, not bytea: node-postgres would receive bytea as hex, twice the bytes to read and decode.
  const result = await exec.deps.pool.query<{ text: string }>(
    "select convert_from(content, 'UTF8') as text from runledger.artifact_blobs where sha256 = $1",
    [value.$artifact],
  );
  const row = result.rows[0];
  if (!row) throw new InvalidInputError(`stored value ${value.$artifact} not found in runledger.artifact_blobs`);
  // The blob holds the value as the codec stored it (a value written before the codec: as it is).
  const decoded = exec.readable(() => exec.payloads.decode(JSON.parse(row.text)));
  return decoded === UNREADABLE ? exec.suspend() : decoded;
}

export interface ArtifactContentRead {
  record: ArtifactRecord;
  /** The stored content; null for an artifact recorded by reference. */
  content: Buffer | null;
}

/** engine.readArtifact: an artifact's record and content (decoded by the engine's codec), or undefined for an unknown id. */
export async function readArtifact(
  pool: pg.Pool,
  artifactId: string,
  payloads: Payloads = NO_CODEC,
): Promise<ArtifactContentRead | undefined> {
  const result = await pool.query<ArtifactRow & { content: Buffer | null }>(
    `select a.artifact_id, a.run_id, a.name, a.kind, a.sha256, a.size, a.ref, a.step_position, a.created_at, b.content
       from runledger.artifacts a left join runledger.artifact_blobs b on b.sha256 = a.blob
      where a.artifact_id = $1`,
    [artifactId],
  );
  const row = result.rows[0];
  if (!row) return undefined;
  return { record: toRecord(row), content: row.content === null ? null : payloads.decodeBytes(row.content) };
}
