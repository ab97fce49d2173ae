/**
 * Durable streams: how fast one run writes its stream (ctx.stream(topic).write) and how
 * fast readers get it (engine.readStream), on a fresh database per repetition.
 *
 *   npm run build && cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx streams.ts
 *   CHUNKS=20000 REPS=3 READERS=8 ...           (the defaults)
 *
 * Write: one run, one step, CHUNKS small chunks ({ i, text: 'token ' }, 27 bytes of JSON)
 * written without await (the writer batches them), timed from the first write until the
 * close is stored (every chunk before it is then stored too). The same with every write
 * awaited (one round trip per chunk: the floor), on AWAITED chunks. And CHUNKS chunks over
 * 20 steps (each step's chunks stored before its checkpoint).
 * Read: after the run, one reader and READERS readers at once reading the whole stream
 * (chunks/s delivered, all readers together); and live, one reader started before the run,
 * with how long after the writer's close it had the last chunk.
 * Prints the figures and writes bench/results/<date>-streams-pg<major>.md (RESULT_FILE overrides).
 */
import { mkdirSync, writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import pg from 'pg';
import { createEngine, type Engine } from '../dist/index.js';

const CHUNKS = Number(process.env.CHUNKS ?? 20_000);
const AWAITED = Number(process.env.AWAITED ?? 2_000);
const REPS = Number(process.env.REPS ?? 3);
const READERS = Number(process.env.READERS ?? 8);
const adminUrl = process.env.DATABASE_URL;
if (!adminUrl) throw new Error('set DATABASE_URL (a server where databases may be created)');

type Mode = 'buffered' | 'awaited' | 'steps';
interface WriteTiming {
  ms: number;
}
const timings = new Map<string, WriteTiming>();

function defineBench(engine: Engine) {
  return engine.workflow({ name: 'stream-bench', queue: 'bench' }, async (ctx, input: { mode: Mode; chunks: number }) => {
    const out = ctx.stream('model');
    let t0 = 0;
    if (input.mode === 'steps') {
      const per = input.chunks / 20;
      for (let s = 0; s < 20; s++) {
        await ctx.step(`chunks-${s}`, () => {
          if (s === 0) t0 = performance.now();
          for (let i = 0; i < per; i++) void out.write({ i: s * per + i, text: 'token ' });
          return s;
        });
      }
      await out.close();
    } else {
      await ctx.step('write', async () => {
        t0 = performance.now();
        for (let i = 0; i < input.chunks; i++) {
          const stored = out.write({ i, text: 'token ' });
          if (input.mode === 'awaited') await stored;
        }
        await out.close();
        return input.chunks;
      });
    }
    timings.set(ctx.runId, { ms: performance.now() - t0 });
    return 'done';
  });
}

const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
const serverVersion = (await admin.query('show server_version')).rows[0].server_version as string;

async function withDatabase<T>(label: string, fn: (engine: Engine, url: string) => Promise<T>): Promise<T> {
  const database = `rl_streams_${label}_${process.pid}`;
  await admin.query(`create database ${database}`);
  const url = new URL(adminUrl!);
  url.pathname = `/${database}`;
  const engine = createEngine({ connectionString: url.toString(), poolMax: READERS + 8, log: () => {} });
  try {
    await engine.migrate();
    return await fn(engine, url.toString());
  } finally {
    await engine.close();
    await admin.query(`drop database ${database} with (force)`);
  }
}

async function drainReader(engine: Engine, runId: string): Promise<number> {
  let n = 0;
  let expected = 0;
  for await (const { offset } of engine.readStream(runId, 'model')) {
    if (offset !== expected++) throw new Error(`reader got offset ${offset}, expected ${expected - 1}`);
    n++;
  }
  return n;
}

interface Rep {
  bufferedPerS: number;
  awaitedPerS: number;
  stepsPerS: number;
  readOnePerS: number;
  readManyPerS: number;
  livePerS: number;
  bytesPerChunk: number;
}

async function rep(index: number): Promise<Rep> {
  return withDatabase(`r${index}`, async (engine) => {
    const bench = defineBench(engine);
    await engine.runWorker({ concurrency: 4, pollIntervalMs: 200 });
    const run = async (mode: Mode, chunks: number) => {
      const handle = await engine.start(bench, { mode, chunks });
      await handle.result();
      return { runId: handle.runId, ms: timings.get(handle.runId)!.ms };
    };
    await run('buffered', 500); // warm-up: connections, prepared statements

    const buffered = await run('buffered', CHUNKS);
    const bytes = Number((await engine.pool.query(`select pg_total_relation_size('runledger.stream_chunks')::bigint as b`)).rows[0].b);
    const awaited = await run('awaited', AWAITED);
    const steps = await run('steps', CHUNKS);

    let t0 = performance.now();
    const one = await drainReader(engine, buffered.runId);
    const readOneMs = performance.now() - t0;
    t0 = performance.now();
    const many = await Promise.all(Array.from({ length: READERS }, () => drainReader(engine, buffered.runId)));
    const readManyMs = performance.now() - t0;
    if (one !== CHUNKS || many.some((n) => n !== CHUNKS)) throw new Error('a reader missed chunks');

    // Live: the reader is waiting before the run starts.
    const handle = await engine.start(bench, { mode: 'buffered', chunks: CHUNKS });
    let first = 0;
    let last = 0;
    let n = 0;
    for await (const _ of engine.readStream(handle.runId, 'model')) {
      if (n++ === 0) first = performance.now();
      last = performance.now();
    }
    await handle.result();
    if (n !== CHUNKS) throw new Error('the live reader missed chunks');
    return {
      bufferedPerS: CHUNKS / (buffered.ms / 1000),
      awaitedPerS: AWAITED / (awaited.ms / 1000),
      stepsPerS: CHUNKS / (steps.ms / 1000),
      readOnePerS: CHUNKS / (readOneMs / 1000),
      readManyPerS: (READERS * CHUNKS) / (readManyMs / 1000),
      livePerS: CHUNKS / ((last - first) / 1000),
      bytesPerChunk: bytes / (CHUNKS + 500),
    };
  });
}

const loadBefore = loadavg()[0]!;
const median = (values: number[]) => [...values].sort((a, b) => a - b)[Math.floor(values.length / 2)]!;
const reps: Rep[] = [];
for (let i = 0; i < REPS; i++) {
  reps.push(await rep(i));
  console.error(`rep ${i + 1}/${REPS}: ${JSON.stringify(reps.at(-1), (_, v) => (typeof v === 'number' ? Math.round(v) : v))}`);
}
await admin.end();

const row = (label: string, key: keyof Rep, unit: string) =>
  `| ${label} | ${Math.round(median(reps.map((r) => r[key]))).toLocaleString('en-US')} ${unit} | ${reps
    .map((r) => Math.round(r[key]).toLocaleString('en-US'))
    .join(', ')} |`;
const date = new Date().toISOString().slice(0, 10);
const report = [
  `# Durable streams, ${date}`,
  '',
  `\`bench/streams.ts\` on PostgreSQL ${serverVersion} (${adminUrl.replace(/\/\/[^@]*@/, '//')}), ${cpus().length} cores, Node ${process.version};`,
  `${REPS} repetitions on a fresh database each, median first. Chunks are \`{ i, text: 'token ' }\` (27 bytes of JSON), topic \`model\`.`,
  `Load average (1 min) ${loadBefore.toFixed(1)} before and ${loadavg()[0]!.toFixed(1)} after: the machine is shared, so figures move between runs.`,
  '',
  '| figure | median | each repetition |',
  '| --- | --- | --- |',
  row(`write, one step, ${CHUNKS.toLocaleString('en-US')} chunks without await (batched)`, 'bufferedPerS', 'chunks/s'),
  row(`write, ${CHUNKS.toLocaleString('en-US')} chunks over 20 steps (stored before each checkpoint)`, 'stepsPerS', 'chunks/s'),
  row(`write, ${AWAITED.toLocaleString('en-US')} chunks each awaited (one round trip each)`, 'awaitedPerS', 'chunks/s'),
  row('read after the run, 1 reader', 'readOnePerS', 'chunks/s'),
  row(`read after the run, ${READERS} readers at once (all together)`, 'readManyPerS', 'chunks/s'),
  row('read live, 1 reader started before the run (first to last chunk)', 'livePerS', 'chunks/s'),
  row('table size per chunk (stream_chunks with its primary key)', 'bytesPerChunk', 'bytes'),
  '',
  'Write: from the first write until the close is stored (every chunk before it is then stored).',
  'The batched writer sends one batch (up to 1,000 chunks, about 1 MiB) per round trip, one at a time per stream;',
  'an awaited write waits for its own batch. Read: `engine.readStream` reads 1,000 chunks per query.',
  '',
].join('\n');
console.log(report);
mkdirSync(new URL('./results/', import.meta.url), { recursive: true });
const file = process.env.RESULT_FILE ?? `${date}-streams-pg${serverVersion.split('.')[0]}.md`;
writeFileSync(new URL(`./results/${file}`, import.meta.url), report);
