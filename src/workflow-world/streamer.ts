/**
 * The World's streams (Streamer): a stream's chunks are rows of runledger.wf_stream_chunks in
 * seq order, closed by an eof row. A reader reads what is there, then tails the stream: each
 * write NOTIFYs runledger_wf_stream with the stream's name, and a reader also looks again every
 * second, so a notification lost with its connection only slows it down.
 */
import { EventEmitter } from 'node:events';
import type { GetChunksOptions, StreamChunksResponse, StreamInfoResponse, Streamer } from '@workflow/world';
import pg from 'pg';
import { invalid, storable } from './invalid.js';

const CHANNEL = 'runledger_wf_stream';
const POLL_MS = 1_000;

interface ChunkRow {
  seq: string;
  data: Buffer;
  eof: boolean;
}

function bytes(chunk: string | Uint8Array): Buffer {
  return typeof chunk === 'string' ? Buffer.from(chunk, 'utf8') : Buffer.from(chunk.buffer, chunk.byteOffset, chunk.byteLength);
}

/** A getChunks cursor: the last seq read and the index of the next chunk. */
function readCursor(cursor: string | undefined): { seq: string; index: number } {
  if (!cursor) return { seq: '0', index: 0 };
  try {
    const parsed = JSON.parse(Buffer.from(cursor, 'base64url').toString('utf8')) as { s?: unknown; i?: unknown };
    if (typeof parsed.s === 'string' && /^\d+$/.test(parsed.s) && Number.isInteger(parsed.i))
      return { seq: parsed.s, index: parsed.i as number };
  } catch {
    // fall through
  }
  throw invalid(`not a stream cursor: ${cursor}`);
}

export interface StreamerHandle extends Streamer {
  close(): Promise<void>;
}

export function createStreamer(pool: pg.Pool): StreamerHandle {
  const written = new EventEmitter();
  written.setMaxListeners(0);
  let listener: Promise<pg.Client> | undefined;
  let closed = false;

  /** One LISTEN connection, opened by the first reader; readers poll if it cannot be opened. */
  const listen = (): void => {
    if (listener || closed) return;
    // The pool's own connection settings (URL, user, password, ssl) for the LISTEN connection.
    const client = new pg.Client(pool.options);
    listener = client.connect().then(async () => {
      client.on('notification', (message) => written.emit(message.payload ?? '', undefined));
      client.on('error', () => {
        listener = undefined;
      });
      await client.query(`listen ${CHANNEL}`);
      return client;
    });
    listener.catch(() => {
      listener = undefined;
    });
  };

  const insert = async (runId: string, name: string, chunks: Buffer[], eof: boolean) => {
    storable('runId', runId);
    storable('stream name', name);
    await pool.query(
      `with written as (
         insert into runledger.wf_stream_chunks (stream_name, run_id, data, eof)
         select $1, $2, chunk, $4 from unnest($3::bytea[]) as chunk returning 1)
       select pg_notify('${CHANNEL}', $1) from (select count(*) from written) w`,
      [name, runId, chunks, eof],
    );
  };

  const streams: Streamer['streams'] = {
    async write(runId, name, chunk) {
      await insert(await runId, name, [bytes(chunk)], false);
    },
    async writeMulti(runId, name, chunks) {
      if (chunks.length > 0) await insert(await runId, name, chunks.map(bytes), false);
    },
    async close(runId, name) {
      await insert(await runId, name, [Buffer.alloc(0)], true);
    },
    async list(runId) {
      storable('runId', runId);
      const { rows } = await pool.query<{ stream_name: string }>(
        'select distinct stream_name from runledger.wf_stream_chunks where run_id = $1 order by stream_name',
        [runId],
      );
      return rows.map((row) => row.stream_name);
    },
    async getInfo(_runId, name): Promise<StreamInfoResponse> {
      storable('stream name', name);
      const { rows } = await pool.query<{ chunks: number; done: boolean }>(
        `select (count(*) filter (where not eof))::int as chunks, bool_or(eof) is true as done
           from runledger.wf_stream_chunks where stream_name = $1`,
        [name],
      );
      const [info] = rows;
      return { tailIndex: (info?.chunks ?? 0) - 1, done: info?.done ?? false };
    },
    async getChunks(_runId, name, options?: GetChunksOptions): Promise<StreamChunksResponse> {
      storable('stream name', name);
      const limit = Math.min(options?.limit ?? 100, 1000);
      if (!Number.isInteger(limit) || limit < 1) throw invalid(`limit must be a whole number >= 1, got ${String(options?.limit)}`);
      const from = readCursor(options?.cursor);
      const { rows } = await pool.query<ChunkRow & { done: boolean }>(
        `select seq::text as seq, data, eof,
                exists (select from runledger.wf_stream_chunks e where e.stream_name = $1 and e.eof) as done
           from runledger.wf_stream_chunks
          where stream_name = $1 and not eof and seq > $2::bigint
          order by seq limit $3`,
        [name, from.seq, limit + 1],
      );
      const page = rows.slice(0, limit);
      const hasMore = rows.length > limit;
      const last = page.at(-1);
      const done = rows[0]?.done ?? (await streams.getInfo('', name)).done;
      return {
        data: page.map((row, i) => ({ index: from.index + i, data: new Uint8Array(row.data) })),
        cursor: hasMore && last ? Buffer.from(JSON.stringify({ s: last.seq, i: from.index + page.length })).toString('base64url') : null,
        hasMore,
        done,
      };
    },
    async get(_runId, name, startIndex = 0) {
      storable('stream name', name);
      listen();
      let lastSeq = '0';
      let skip = startIndex;
      let pumping: Promise<void> | undefined;
      let again = false;
      let timer: NodeJS.Timeout | undefined;
      let onWrite: (() => void) | undefined;
      const stop = () => {
        if (timer) clearInterval(timer);
        if (onWrite) written.off(name, onWrite);
      };
      return new ReadableStream<Uint8Array>({
        async start(controller) {
          if (skip < 0) {
            // From the end: -n is the last n chunks written so far.
            const info = await streams.getInfo('', name);
            skip = Math.max(0, info.tailIndex + 1 + skip);
          }
          const pump = async (): Promise<void> => {
            const { rows } = await pool.query<ChunkRow>(
              'select seq::text as seq, data, eof from runledger.wf_stream_chunks where stream_name = $1 and seq > $2::bigint order by seq',
              [name, lastSeq],
            );
            for (const row of rows) {
              lastSeq = row.seq;
              if (row.eof) {
                stop();
                controller.close();
                return;
              }
              if (skip > 0) skip -= 1;
              else controller.enqueue(new Uint8Array(row.data));
            }
          };
          // One read at a time; a wake-up during a read asks for one more.
          const wake = () => {
            if (pumping) {
              again = true;
              return;
            }
            pumping = pump()
              .catch((error: unknown) => {
                stop();
                controller.error(error);
              })
              .finally(() => {
                pumping = undefined;
                if (again) {
                  again = false;
                  wake();
                }
              });
          };
          onWrite = wake;
          written.on(name, onWrite);
          timer = setInterval(wake, POLL_MS);
          timer.unref();
          wake();
        },
        cancel() {
          stop();
        },
      });
    },
  };

  return {
    streams,
    async close() {
      closed = true;
      const client = await listener?.catch(() => undefined);
      listener = undefined;
      await client?.end().catch(() => undefined);
    },
  };
}
