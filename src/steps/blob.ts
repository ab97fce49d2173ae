import { createHash } from 'node:crypto';
import type { Execution } from '../engine/run/execution.js';

export interface StoredBlob {
  /** The artifact row as runledger._record_artifact returns it (snake_case columns). */
  row: Record<string, unknown>;
  /** sha256 (hex) of the stored bytes: with a codec, of their envelope. */
  sha256: string;
  size: number;
}

/**
 * Stores bytes as one of the run's artifacts (kind 'artifact') or stored values ('value'),
 * in a transaction of its own, at `position` (the step it belongs to): the content goes to
 * runledger.artifact_blobs once per sha256 (not sent when already stored), through the
 * engine's codec. Content-addressed, so a step that runs again stores no blob twice.
 */
export async function storeBlob(
  exec: Execution,
  options: {
    name: string;
    kind: 'artifact' | 'value';
    bytes: Buffer;
    position: number | null;
    /** The bytes are already in the codec's form (a stored value's envelope text): stored as they are. */
    encoded?: boolean;
  },
): Promise<StoredBlob> {
  const content = options.encoded ? options.bytes : exec.payloads.bytes(options.bytes);
  const sha256 = createHash('sha256').update(content).digest('hex');
  const client = await exec.deps.pool.connect();
  try {
    await client.query('begin');
    const held = await client.query<{ held: boolean }>('select runledger._artifact_blob_held(p_sha256 => $1) as held', [sha256]);
    const recorded = await client.query<{ record: Record<string, unknown> }>(
      'select runledger._record_artifact(p_run_id => $1, p_position => $2, p_name => $3, p_kind => $4, p_sha256 => $5, p_size => $6, p_content => $7, p_ref => null) as record',
      [exec.runId, options.position, options.name, options.kind, sha256, content.byteLength, held.rows[0]!.held ? null : content],
    );
    await client.query('commit');
    return { row: recorded.rows[0]!.record, sha256, size: content.byteLength };
  } catch (error) {
    await client.query('rollback').catch(() => {});
    throw error;
  } finally {
    client.release();
  }
}
