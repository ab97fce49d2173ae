import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import {
  streamToSse,
  type DurableStream,
  type Engine,
  type StreamChunk,
  InvalidInputError,
  NotFoundError,
  NotInWorkflowError,
} from '../../src/index.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { runCli } from '../helpers/cli.js';

/**
 * Durable streams (ctx.stream, engine.readStream, the SSE helper, `runledger tail`):
 * chunks stored once per offset and read live, in order, exactly once. The crash case
 * with real processes is test/steps/streams-crash.slow.test.ts.
 */
const t = useTestEngine({
  engine: { maxPayloadBytes: 4_096 },
});
const { db } = t;

let flows: ReturnType<typeof defineFlows>;
/** A stream object kept past its run's end, to show a late write is refused. */
let leaked: DurableStream | undefined;

function defineFlows(e: Engine) {
  /** Writes `perStep` chunks in each of `steps` steps, unawaited, then closes (unless told not to). */
  const writer = e.workflow(
    { name: 'st-writer', queue: 'streams' },
    async (ctx, input: { steps: number; perStep: number; close?: boolean }) => {
      for (let s = 0; s < input.steps; s++) {
        await ctx.step(`write-${s}`, () => {
          const out = ctx.stream('out');
          for (let i = 0; i < input.perStep; i++) void out.write({ s, i });
          return s;
        });
      }
      if (input.close !== false) await ctx.stream('out').close();
      return 'done';
    },
  );
  /** Writes, waits for a signal (the run parks, its first chunks readable), writes on and closes. */
  const waiter = e.workflow({ name: 'st-waiter', queue: 'streams' }, async (ctx) => {
    const out = ctx.stream('model');
    void out.write('hello ');
    await ctx.step('first', () => {
      void ctx.stream('model').write('from ');
      return 1;
    });
    await ctx.waitForSignal('go');
    void out.write('the ');
    await ctx.step('second', async () => {
      await ctx.stream('model').write('stream');
      return 2;
    });
    void out.close();
    return 'ok';
  });
  /**
   * The replay rule: the body's write at position 0 happens again on the replay after the wait
   * (same offset, stored once); step a is replayed from its checkpoint, so its chunks are not
   * written again, and the write after the wait must still continue after them.
   */
  const replayed = e.workflow({ name: 'st-replayed', queue: 'streams' }, async (ctx) => {
    void ctx.stream('log').write(`body before, attempt ${ctx.attempt}`);
    await ctx.step('a', () => {
      for (const x of ['a1', 'a2', 'a3']) void ctx.stream('log').write(x);
      return 'a';
    });
    await ctx.transaction('t', async () => {
      void ctx.stream('log').write('in a transaction');
      return 't';
    });
    await ctx.waitForSignal('go');
    void ctx.stream('log').write('after the wait');
    return 'ok';
  });
  /** The refusals: each is caught and reported; none stores anything. */
  const refusals = e.workflow({ name: 'st-refusals', queue: 'streams' }, async (ctx) => {
    const codes: Record<string, unknown> = {};
    const attempt = (what: string, fn: () => unknown) => {
      try {
        fn();
        codes[what] = 'accepted';
      } catch (error) {
        codes[what] = (error as { code?: string }).code;
      }
    };
    attempt('badTopic', () => ctx.stream('no spaces allowed'));
    attempt('emptyTopic', () => ctx.stream(''));
    attempt('tooLarge', () => ctx.stream('big').write('x'.repeat(5_000)));
    attempt('undefinedChunk', () => ctx.stream('big').write(undefined));
    attempt('notJson', () => ctx.stream('big').write({ n: 10n }));
    await ctx.stream('closed').close();
    attempt('afterClose', () => ctx.stream('closed').write('late'));
    leaked = ctx.stream('leaked');
    return codes;
  });
  /** A step that fails once and is retried after a durable backoff (the run waits between the attempts). */
  const retried = e.workflow({ name: 'st-retried', queue: 'streams' }, async (ctx) => {
    await ctx.step(
      'flaky',
      ({ attempt }) => {
        for (const x of ['a', 'b']) void ctx.stream('out').write(`try ${attempt} ${x}`);
        if (attempt === 1) throw new Error('first attempt fails');
        return attempt;
      },
      { retry: { maxAttempts: 2, initialDelayMs: 50, jitter: false, durableAfterMs: 0 } },
    );
    return 'ok';
  });
  /** Ends without closing: readers stop at the terminal run. */
  const unclosed = e.workflow({ name: 'st-unclosed', queue: 'streams' }, async (ctx) => {
    const out = ctx.stream('out');
    for (let i = 0; i < 5; i++) void out.write(i);
    return 'ok';
  });
  return { writer, waiter, replayed, refusals, unclosed, retried };
}

beforeAll(async () => {
  flows = defineFlows(t.engine);
  await t.engine.runWorker({ queues: ['streams'], concurrency: 8, leaseMs: 2_000, pollIntervalMs: 100 });
});

async function collect<T = unknown>(iterable: AsyncIterable<StreamChunk<T>>): Promise<Array<StreamChunk<T>>> {
  const out: Array<StreamChunk<T>> = [];
  for await (const chunk of iterable) out.push(chunk);
  return out;
}

async function rows(runId: string, topic: string) {
  const result = await db.pool.query(
    `select "offset"::int as offset, chunk, seq, attempt, fencing_token::int as token
       from runledger.stream_chunks where run_id = $1 and topic = $2 order by "offset"`,
    [runId, topic],
  );
  return result.rows as Array<{ offset: number; chunk: unknown; seq: number; attempt: number; token: number }>;
}

const range = (n: number) => Array.from({ length: n }, (_, i) => i);

describe('writing and reading', () => {
  it('stores the chunks of several steps in order, and a reader gets each once, in order, then the end', async () => {
    const handle = await t.engine.start(flows.writer, { steps: 3, perStep: 40 });
    const read = await collect(t.engine.readStream(handle.runId, 'out'));
    expect(await handle.result()).toBe('done');
    expect(read.map((c) => c.offset)).toEqual(range(120));
    expect(read.map((c) => c.chunk)).toEqual(range(120).map((n) => ({ s: Math.floor(n / 40), i: n % 40 })));
    expect(read.every((c) => c.attempt === 1)).toBe(true);
    const stored = await rows(handle.runId, 'out');
    // Each step's chunks carry its position (step s is at position s).
    expect(stored.map((r) => r.seq)).toEqual(range(120).map((n) => Math.floor(n / 40)));
    const ends = await db.pool.query('select end_offset::int as end_offset from runledger.stream_ends where run_id = $1', [handle.runId]);
    expect(ends.rows).toEqual([{ end_offset: 120 }]);
  });

  it('stores every chunk written without await before the run completes (many batches)', async () => {
    const handle = await t.engine.start(flows.writer, { steps: 1, perStep: 2_500, close: false });
    await handle.result();
    // Read only once the run is SUCCEEDED: nothing may arrive after.
    const stored = await rows(handle.runId, 'out');
    expect(stored.map((r) => r.offset)).toEqual(range(2_500));
    const read = await collect(t.engine.readStream(handle.runId, 'out', { batchSize: 700 }));
    expect(read.map((c) => c.offset)).toEqual(range(2_500));
  });

  it('a reader started before the writes receives them live: the first chunks before the run can end', async () => {
    const handle = await t.engine.start(flows.waiter, {});
    const received: string[] = [];
    const reading = (async () => {
      for await (const { chunk } of t.engine.readStream<string>(handle.runId, 'model')) received.push(chunk);
    })();
    await waitFor('the chunks before the wait', async () => received.join('') === 'hello from ');
    // The run cannot end before the signal: the reader had them live.
    expect(['RUNNING', 'WAITING']).toContain((await t.engine.getRun(handle.runId))?.status);
    await t.engine.signal(handle.runId, 'go', {});
    await reading;
    expect(received.join('')).toBe('hello from the stream');
    expect(await handle.result()).toBe('ok');
  });

  it('reads from an offset', async () => {
    const handle = await t.engine.start(flows.writer, { steps: 2, perStep: 10 });
    await handle.result();
    const read = await collect(t.engine.readStream(handle.runId, 'out', { fromOffset: 13 }));
    expect(read.map((c) => c.offset)).toEqual(range(7).map((n) => n + 13));
    expect(read[0]!.chunk).toEqual({ s: 1, i: 3 });
    expect(await collect(t.engine.readStream(handle.runId, 'out', { fromOffset: 20 }))).toEqual([]);
    expect(await collect(t.engine.readStream(handle.runId, 'out', { fromOffset: 500 }))).toEqual([]);
  });

  it('a stream never closed ends for its readers when the run ends', async () => {
    const handle = await t.engine.start(flows.unclosed, {});
    const read = await collect(t.engine.readStream(handle.runId, 'out'));
    expect(read.map((c) => c.chunk)).toEqual([0, 1, 2, 3, 4]);
    expect((await t.engine.getRun(handle.runId))?.status).toBe('SUCCEEDED');
  });

  it('an aborted reader ends quietly; a reader of a topic nobody writes ends with the run', async () => {
    const handle = await t.engine.start(flows.waiter, {});
    const stop = new AbortController();
    const got: unknown[] = [];
    const reading = (async () => {
      for await (const { chunk } of t.engine.readStream(handle.runId, 'model', { signal: stop.signal })) got.push(chunk);
    })();
    await waitFor('the first chunks', async () => got.length === 2);
    stop.abort();
    await reading;
    const silent = collect(t.engine.readStream(handle.runId, 'nobody-writes-this'));
    await t.engine.signal(handle.runId, 'go', {});
    expect(await silent).toEqual([]);
    await handle.result();
  });

  it('a reader whose connections are cut (its LISTEN and its pool) reads on from where it was', async () => {
    const url = new URL(db.url);
    url.searchParams.set('application_name', 'stream-reader');
    const reader = t.newEngine({ connectionString: url.toString() });
    const handle = await t.engine.start(flows.waiter, {});
    const received: Array<StreamChunk<string>> = [];
    const reading = (async () => {
      for await (const chunk of reader.readStream<string>(handle.runId, 'model')) received.push(chunk);
    })();
    await waitFor('the chunks before the wait', async () => received.length === 2);
    const cut = await db.pool.query(
      `select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and application_name = 'stream-reader'`,
    );
    expect(cut.rowCount).toBeGreaterThanOrEqual(2); // the LISTEN connection and at least one pooled one
    await t.engine.signal(handle.runId, 'go', {});
    await reading;
    expect(received.map((c) => [c.offset, c.chunk])).toEqual([
      [0, 'hello '],
      [1, 'from '],
      [2, 'the '],
      [3, 'stream'],
    ]);
    await handle.result();
  });

  it('refuses bad arguments at the call, and an unknown run when iterated', async () => {
    expect(() => t.engine.readStream('r', 'bad topic')).toThrow(InvalidInputError);
    expect(() => t.engine.readStream('r', 'ok', { fromOffset: -1 })).toThrow(InvalidInputError);
    expect(() => t.engine.readStream('', 'ok')).toThrow(InvalidInputError);
    await expect(collect(t.engine.readStream('no-such-run', 'out'))).rejects.toBeInstanceOf(NotFoundError);
  });
});

describe('replay', () => {
  it('a replay writes the same offsets again and stores them once; a step replayed from its checkpoint is counted', async () => {
    const handle = await t.engine.start(flows.replayed, {});
    await waitFor('the run parked', async () => (await t.engine.getRun(handle.runId))?.status === 'WAITING');
    const before = await rows(handle.runId, 'log');
    expect(before.map((r) => [r.offset, r.chunk])).toEqual([
      [0, 'body before, attempt 1'],
      [1, 'a1'],
      [2, 'a2'],
      [3, 'a3'],
      [4, 'in a transaction'],
    ]);
    await t.engine.signal(handle.runId, 'go', {});
    expect(await handle.result()).toBe('ok');
    const after = await rows(handle.runId, 'log');
    // The second execution wrote offset 0 again (deduplicated: the first write stays), ran neither step a nor
    // transaction t, and wrote 'after the wait' after their chunks, not over them.
    expect(after.map((r) => [r.offset, r.chunk, r.seq])).toEqual([
      [0, 'body before, attempt 1', 0],
      [1, 'a1', 0],
      [2, 'a2', 0],
      [3, 'a3', 0],
      [4, 'in a transaction', 1],
      [5, 'after the wait', 3],
    ]);
    expect(after[5]!.token).toBeGreaterThan(after[0]!.token);
  });

  it('a step retried after a durable backoff appends after its failed attempt (its chunks stored before the run parked)', async () => {
    const handle = await t.engine.start(flows.retried, {});
    expect(await handle.result()).toBe('ok');
    const read = await collect(t.engine.readStream(handle.runId, 'out'));
    expect(read.map((c) => [c.offset, c.chunk])).toEqual([
      [0, 'try 1 a'],
      [1, 'try 1 b'],
      [2, 'try 2 a'],
      [3, 'try 2 b'],
    ]);
    const stored = await rows(handle.runId, 'out');
    expect(stored.every((r) => r.seq === 0)).toBe(true);
    expect(stored[2]!.token).toBeGreaterThan(stored[0]!.token); // two executions: the run waited between the attempts
  });

  it('the SQL write is fenced and idempotent: the same batch twice stores one row per offset, a stale token gets RL001', async () => {
    const handle = await t.engine.start(flows.unclosed, {});
    await handle.result();
    const runId = await insertExecutingRun();
    const write = (token: number, first: number | null, chunks: unknown[], close = false) =>
      db.pool.query(
        `select runledger._stream_write(p_run_id => $1, p_token => $2, p_topic => 't', p_attempt => 1, p_first_offset => $3,
                p_base_seq => 0, p_after_earlier => false, p_seqs => $4::int[], p_chunks => $5::jsonb, p_close => $6) as next`,
        [runId, token, first, chunks.map(() => 0), JSON.stringify(chunks), close],
      );
    expect((await write(1, null, ['a', 'b', 'c'])).rows[0].next).toBe('3');
    expect((await write(1, null, ['A', 'B', 'C'])).rows[0].next).toBe('3'); // a re-execution of position 0: same offsets
    expect((await write(1, 3, ['d'], true)).rows[0].next).toBe('4');
    expect((await write(1, 4, ['past the end'])).rows[0].next).toBe('5'); // after the close: not stored
    expect((await rows(runId, 't')).map((r) => r.chunk)).toEqual(['a', 'b', 'c', 'd']);
    await expect(write(2, 4, ['stale'])).rejects.toMatchObject({ code: 'RL001' });
    await db.pool.query(`update runledger.runs set fencing_token = 2 where run_id = $1`, [runId]);
    await expect(write(1, 4, ['old owner'])).rejects.toMatchObject({ code: 'RL001' });
    await expect(
      db.pool.query(`select runledger._stream_write($1, 2, 'bad topic', 1, 0, 0, false, '{0}'::int[], '["x"]'::jsonb)`, [runId]),
    ).rejects.toMatchObject({ code: 'RL003' });
    expect((await rows(runId, 't')).map((r) => r.chunk)).toEqual(['a', 'b', 'c', 'd']);
  });
});

/** A RUNNING run with fencing token 1, written straight into the table (no worker owns it). */
async function insertExecutingRun(): Promise<string> {
  const runId = `exec-${Math.random().toString(36).slice(2)}`;
  await db.pool.query(
    `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, lease_owner, lease_expires_at, fencing_token, started_at)
     select $1, workflow_name, workflow_version, 'streams', 'RUNNING', 'wk-test', now() + interval '1 hour', 1, now()
       from runledger.workflows where workflow_name = 'st-unclosed'`,
    [runId],
  );
  return runId;
}

describe('bad input', () => {
  it('a bad topic, a chunk over the payload limit, a non-JSON chunk and a write after close are refused with codes; nothing is stored', async () => {
    const handle = await t.engine.start(flows.refusals, {});
    expect(await handle.result()).toEqual({
      badTopic: 'INVALID_INPUT',
      emptyTopic: 'INVALID_INPUT',
      tooLarge: 'PAYLOAD_TOO_LARGE',
      undefinedChunk: 'INVALID_INPUT',
      notJson: 'OUTPUT_NOT_SERIALIZABLE',
      afterClose: 'INVALID_STATE',
    });
    const stored = await db.pool.query('select topic, count(*)::int as n from runledger.stream_chunks where run_id = $1 group by 1', [
      handle.runId,
    ]);
    expect(stored.rows).toEqual([]);
    const ends = await db.pool.query('select topic, end_offset::int as end_offset from runledger.stream_ends where run_id = $1', [
      handle.runId,
    ]);
    expect(ends.rows).toEqual([{ topic: 'closed', end_offset: 0 }]);
  });

  it('a write after the run ended is refused like any ctx call', async () => {
    expect(leaked).toBeDefined();
    expect(() => leaked!.write('too late')).toThrow(NotInWorkflowError);
    expect(() => leaked!.close()).toThrow(NotInWorkflowError);
  });
});

describe('psql', () => {
  it('read_stream, the streams view, and prune removing chunks with their run', async () => {
    const handle = await t.engine.start(flows.writer, { steps: 2, perStep: 3 });
    await handle.result();
    const read = await db.pool.query(`select "offset"::int as o, chunk, seq from runledger.read_stream($1, 'out', 4)`, [handle.runId]);
    expect(read.rows).toEqual([
      { o: 4, chunk: { s: 1, i: 1 }, seq: 1 },
      { o: 5, chunk: { s: 1, i: 2 }, seq: 1 },
    ]);
    await expect(db.pool.query(`select * from runledger.read_stream('nope', 'out')`)).rejects.toMatchObject({ code: 'RL002' });
    await expect(db.pool.query(`select * from runledger.read_stream($1, 'bad topic')`, [handle.runId])).rejects.toMatchObject({
      code: 'RL003',
    });
    const view = await db.pool.query(
      `select topic, chunks::int, next_offset::int, closed, end_offset::int from runledger.streams where run_id = $1`,
      [handle.runId],
    );
    expect(view.rows).toEqual([{ topic: 'out', chunks: 6, next_offset: 6, closed: true, end_offset: 6 }]);

    await db.pool.query(`update runledger.runs set finished_at = now() - interval '2 days' where run_id = $1`, [handle.runId]);
    await db.pool.query(`select runledger.prune(interval '1 day')`);
    const left = await db.pool.query(
      `select (select count(*)::int from runledger.stream_chunks where run_id = $1) as chunks,
              (select count(*)::int from runledger.stream_ends where run_id = $1) as ends`,
      [handle.runId],
    );
    expect(left.rows[0]).toEqual({ chunks: 0, ends: 0 });
  });
});

describe('server-sent events', () => {
  let server: Server;
  let base: string;
  beforeAll(async () => {
    server = createServer((req, res) => {
      const url = new URL(req.url!, 'http://localhost');
      void streamToSse(t.engine, req, res, url.searchParams.get('run')!, url.searchParams.get('topic') ?? 'out', { keepAliveMs: 0 });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((resolve) => server.close(() => resolve())));

  const events = (text: string) =>
    text
      .split('\n\n')
      .filter(Boolean)
      .map((block) =>
        Object.fromEntries(block.split('\n').map((line) => [line.slice(0, line.indexOf(':')), line.slice(line.indexOf(':') + 2)])),
      );

  it('sends each chunk as id/data, honours Last-Event-ID, and ends with an end event', async () => {
    const handle = await t.engine.start(flows.writer, { steps: 1, perStep: 4 });
    const response = await fetch(`${base}/?run=${handle.runId}`);
    expect(response.status).toBe(200);
    expect(response.headers.get('content-type')).toMatch(/^text\/event-stream/);
    expect(events(await response.text())).toEqual([
      // jsonb stores an object's keys in its own order (shorter first): the chunk comes back equal, not byte for byte.
      ...range(4).map((i) => ({ id: String(i), data: JSON.stringify({ i, s: 0 }) })),
      { event: 'end', data: '{"nextOffset":4}' },
    ]);
    const resumed = await fetch(`${base}/?run=${handle.runId}`, { headers: { 'Last-Event-ID': '1' } });
    expect(events(await resumed.text()).map((e) => e.id ?? e.event)).toEqual(['2', '3', 'end']);
  });

  it('answers 404 for an unknown run and 400 for a bad topic or Last-Event-ID', async () => {
    const unknown = await fetch(`${base}/?run=no-such-run`);
    expect(unknown.status).toBe(404);
    expect((await unknown.json()).error.code).toBe('NOT_FOUND');
    expect((await fetch(`${base}/?run=x&topic=${encodeURIComponent('bad topic')}`)).status).toBe(400);
    expect((await fetch(`${base}/?run=x`, { headers: { 'Last-Event-ID': 'abc' } })).status).toBe(400);
  });
});

describe('runledger tail', () => {
  const cli = (args: string[]) => runCli(db.url, args);

  it('prints a text stream as text (default topic model), JSON values as lines, --json and --from', async () => {
    const text = await t.engine.start(flows.waiter, {});
    const tailing = cli(['tail', text.runId]); // started before the run has finished: it follows it live
    await waitFor('the run parked', async () => (await t.engine.getRun(text.runId))?.status === 'WAITING');
    await t.engine.signal(text.runId, 'go', {});
    expect(await tailing).toEqual({ code: 0, stdout: 'hello from the stream\n', stderr: '' });

    const values = await t.engine.start(flows.writer, { steps: 1, perStep: 3 });
    await values.result();
    const plain = await cli(['tail', values.runId, 'out']);
    expect(plain).toMatchObject({ code: 0, stdout: '{"i":0,"s":0}\n{"i":1,"s":0}\n{"i":2,"s":0}\n' });
    const json = await cli(['tail', values.runId, 'out', '--json', '--from', '2']);
    expect(json).toMatchObject({ code: 0, stdout: '{"offset":2,"chunk":{"i":2,"s":0},"attempt":1}\n' });
    const hinted = await cli(['tail', values.runId]);
    expect(hinted).toMatchObject({ code: 0, stdout: '' });
    expect(hinted.stderr).toContain("has no stream on topic 'model' yet; its streams: out");
  });

  it('refuses an unknown run (exit 1) and a bad topic (exit 2)', async () => {
    const unknown = await cli(['tail', 'no-such-run']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/^error \[NOT_FOUND\]: .*no-such-run/);
    const bad = await cli(['tail', 'r', 'bad topic']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/^error \[USAGE\]: invalid topic/);
  });
});
