import { afterAll, describe, expect, it } from 'vitest';
import { createWorld, type RunledgerWorld } from '../../src/workflow-world/index.js';
import { useTestEngine } from '../helpers/test-engine.js';

/**
 * runledger/workflow-world's streams: written chunks read back whole, in pages (getChunks)
 * and as a tail that a reader started before the writes receives as they land (get), with
 * list and getInfo, which the SDK's suite does not call.
 */
const t = useTestEngine();
let world: RunledgerWorld;
afterAll(() => world?.close());
const w = () => (world ??= createWorld({ engine: t.engine, baseUrl: 'http://127.0.0.1:9' }));
const text = (chunk: Uint8Array) => Buffer.from(chunk).toString('utf8');

async function readAll(stream: ReadableStream<Uint8Array>): Promise<string[]> {
  const out: string[] = [];
  for await (const chunk of stream as unknown as AsyncIterable<Uint8Array>) out.push(text(chunk));
  return out;
}

describe('streams', () => {
  it('write, writeMulti and close; list, getInfo and getChunks in pages', async () => {
    const runId = 'wrun_streams_1';
    await w().streams.write(runId, 'strm_a', 'one');
    await w().streams.writeMulti!(runId, 'strm_a', ['two', new Uint8Array([0, 116, 104, 0])]);
    await w().streams.write(runId, 'strm_b', 'other');
    expect(await w().streams.getInfo(runId, 'strm_a')).toEqual({ tailIndex: 2, done: false });
    await w().streams.close(runId, 'strm_a');
    expect(await w().streams.getInfo(runId, 'strm_a')).toEqual({ tailIndex: 2, done: true });
    expect(await w().streams.list(runId)).toEqual(['strm_a', 'strm_b']);
    expect(await w().streams.getInfo(runId, 'strm_none')).toEqual({ tailIndex: -1, done: false });

    const page1 = await w().streams.getChunks(runId, 'strm_a', { limit: 2 });
    expect(page1.data.map((c) => [c.index, text(c.data)])).toEqual([
      [0, 'one'],
      [1, 'two'],
    ]);
    expect(page1).toMatchObject({ hasMore: true, done: true });
    const page2 = await w().streams.getChunks(runId, 'strm_a', { limit: 2, cursor: page1.cursor! });
    expect(page2.data.map((c) => c.index)).toEqual([2]);
    expect([...page2.data[0]!.data]).toEqual([0, 116, 104, 0]);
    expect(page2).toMatchObject({ hasMore: false, cursor: null, done: true });
    await expect(w().streams.getChunks(runId, 'strm_a', { cursor: 'not-a-cursor' })).rejects.toThrow('not a stream cursor');

    expect(await readAll(await w().streams.get(runId, 'strm_a'))).toEqual(['one', 'two', '\u0000th\u0000']);
    expect(await readAll(await w().streams.get(runId, 'strm_a', 1))).toEqual(['two', '\u0000th\u0000']);
    // From the end: the last chunk.
    expect(await readAll(await w().streams.get(runId, 'strm_a', -1))).toEqual(['\u0000th\u0000']);
  });

  it('a stream name or run id PostgreSQL cannot store is INVALID_INPUT; chunk bytes are any bytes', async () => {
    await expect(w().streams.write('wrun_streams_3', 'strm_\u0000', 'x')).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(w().streams.write('wrun_\ud800', 'strm_ok', 'x')).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(w().streams.getInfo('wrun_streams_3', 'strm_\u0000')).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(w().streams.getChunks('wrun_streams_3', 'strm_ok', { limit: 0 })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    expect(await w().streams.list('wrun_streams_3')).toEqual([]);
  });

  it('a reader that starts first receives the chunks as they are written, and ends at close', async () => {
    const runId = 'wrun_streams_2';
    const reading = readAll(await w().streams.get(runId, 'strm_live'));
    // Another World (another process, in effect) writes: the reader hears of it by NOTIFY.
    const writer = createWorld({ engine: t.newEngine(), baseUrl: 'http://127.0.0.1:9' });
    try {
      for (const part of ['a', 'b', 'c']) await writer.streams.write(runId, 'strm_live', part);
      await writer.streams.close(runId, 'strm_live');
    } finally {
      await writer.close();
    }
    expect(await reading).toEqual(['a', 'b', 'c']);
  });
});
