import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { describe, expect, it, onTestFailed } from 'vitest';
import type { StreamChunk } from '../../src/index.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import type { WorkerProcess } from '../helpers/worker-process.js';
import { defineStreamWorkflows, expectedChunks } from '../fixtures/stream-workflows.js';

/**
 * A stream reader across a worker crash, with real processes: a worker process is
 * SIGKILLed in the middle of a run that writes its stream across several steps (and from
 * the workflow body between them), another worker process finishes the run, and a reader
 * in this process, started before the run and reading throughout, receives every offset
 * exactly once and in order. The table shows the same: no gap, no duplicate, the exact
 * chunks a crash-free run writes.
 */
const t = useTestEngine();
const { db } = t;
const { processes } = stoppedAfterEach();
const SCRIPT = fileURLToPath(new URL('../fixtures/stream-worker.ts', import.meta.url));
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

async function streamWorker(env: Record<string, string> = {}): Promise<WorkerProcess> {
  const child = spawn(process.execPath, ['--import', 'tsx', SCRIPT], {
    cwd: ROOT,
    env: { ...process.env, DATABASE_URL: db.url, LEASE_MS: '1000', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let output = '';
  child.stdout.on('data', (chunk) => (output += chunk));
  child.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) =>
    child.on('exit', (code, signal) => resolve({ code, signal })),
  );
  await waitFor('the worker process ready', async () => {
    if (output.includes('ready ')) return true;
    if (child.exitCode !== null || child.signalCode !== null) throw new Error(`exited before ready:\n${output}`);
    return false;
  });
  const worker: WorkerProcess = {
    child,
    pid: child.pid!,
    exited,
    kill: (signal = 'SIGKILL') => void child.kill(signal),
    output: () => output,
  };
  processes.push(worker);
  onTestFailed(() => console.error(`--- stream worker ${worker.pid} output ---\n${output.slice(-4000)}`));
  return worker;
}

describe('a stream across a worker crash', () => {
  it('SIGKILL in the middle of a step: the reader gets every chunk once, in order; the table has no gap and no duplicate', async () => {
    const { chunked } = defineStreamWorkflows(t.engine);
    // 205 per step: each step ends with 5 chunks not awaited, stored by the flush before its checkpoint.
    const input = { steps: 6, perStep: 205 };
    const expected = expectedChunks(input);
    const handle = await t.engine.start(chunked, input);

    // The reader starts before any worker serves the run, and reads throughout.
    const received: Array<StreamChunk> = [];
    const reading = (async () => {
      for await (const chunk of t.engine.readStream(handle.runId, 'out')) received.push(chunk);
    })();

    // Killed in step 3 right after writing its chunk 120: 100 of its chunks were stored (awaited at 49 and 99), the
    // next 21 only buffered (the kill comes in the same synchronous run of writes, before the batch is sent).
    const doomed = await streamWorker({ KILL_AT: '3:120' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const atCrash = (await db.pool.query(`select count(*)::int as n from runledger.stream_chunks where run_id = $1`, [handle.runId]))
      .rows[0].n;
    // Steps 0-2 with their body chunks were complete, and step 3 had begun: the crash was in the middle of the stream.
    expect(atCrash).toBe(3 * 206 + 1 + 100);
    expect(atCrash).toBeLessThan(expected.length);
    // Meanwhile the reader's LISTEN connection is cut: it reads on a backoff until it is back.
    const cut = await db.pool.query(
      `select pg_terminate_backend(pid) from pg_stat_activity where datname = current_database() and query = 'listen runledger_finished'`,
    );
    expect(cut.rowCount).toBe(1);

    await streamWorker();
    expect(await handle.result()).toBe('done');
    await reading;

    // The reader: every offset once, in order, with the chunks a run without a crash writes.
    expect(received.map((c) => c.offset)).toEqual(expected.map((_, i) => i));
    expect(received.map((c) => c.chunk)).toEqual(expected);
    // Written by two executions: the second one (attempt 2) took over in step 3.
    expect(new Set(received.map((c) => c.attempt))).toEqual(new Set([1, 2]));
    expect(received.findIndex((c) => c.attempt === 2)).toBeGreaterThanOrEqual(atCrash);

    // The table: offsets 0..N-1, each once, in the order the workflow wrote them.
    const table = await db.pool.query(
      `select count(*)::int as n, count(distinct "offset")::int as distinct_offsets, min("offset")::int as min, max("offset")::int as max
         from runledger.stream_chunks where run_id = $1 and topic = 'out'`,
      [handle.runId],
    );
    expect(table.rows[0]).toEqual({ n: expected.length, distinct_offsets: expected.length, min: 0, max: expected.length - 1 });
    const stored = await db.pool.query(`select chunk from runledger.stream_chunks where run_id = $1 and topic = 'out' order by "offset"`, [
      handle.runId,
    ]);
    expect(stored.rows.map((r) => r.chunk)).toEqual(expected);
    const end = await db.pool.query(`select end_offset::int as end_offset from runledger.stream_ends where run_id = $1`, [handle.runId]);
    expect(end.rows).toEqual([{ end_offset: expected.length }]);
    // Steps 0-2 ran once (their checkpoints committed before the crash), step 3 twice.
    const steps = await db.pool.query(`select seq, fencing_token::int as token from runledger.steps where run_id = $1 order by seq`, [
      handle.runId,
    ]);
    const tokens = steps.rows.map((r) => r.token);
    expect(tokens.slice(0, 3).every((token) => token === tokens[0])).toBe(true);
    expect(tokens.slice(3).every((token) => token > tokens[0])).toBe(true);
  });
});
