import { expect } from 'vitest';
import type { TestEngine } from './test-engine.js';
import { waitFor } from './database.js';
import { spawnWorker, type WorkerProcess } from './worker-process.js';

export interface ResumeStormOptions {
  runs: number;
  workers?: number;
  concurrency?: number;
  /** The queue's concurrency limit (runledger.set_queue). */
  queueLimit?: number;
  poolMax?: number;
  /** How long parking and resuming may each take. */
  timeoutMs: number;
}

export interface ResumeStormFigures {
  runs: number;
  parkMs: number;
  signalMs: number;
  drainMs: number;
  runsPerSecond: number;
  peakRunning: number;
  runningBound: number;
  peakConnections: number;
  connectionBound: number;
  samples: number;
}

const QUEUE = 'storm';

/**
 * Fault drill (issue 18): a resume storm. `runs` runs of the fixture workflow `signalled`
 * are started (runledger.start_runs, 1,000 a statement) and parked WAITING by real worker
 * processes, then one SQL statement signals them all. A sampler reads every 100 ms how
 * many runs are RUNNING and how many connections the test database has: neither may pass
 * its bound (the slots and the queue's limit; the pools' maxima). Every run must finish,
 * with its one business row and its one checkpoint.
 */
export async function resumeStorm(t: TestEngine, options: ResumeStormOptions): Promise<ResumeStormFigures> {
  const { db } = t;
  const workers = options.workers ?? 2;
  const concurrency = options.concurrency ?? 16;
  const queueLimit = options.queueLimit ?? 20;
  const poolMax = options.poolMax ?? 10;
  await t.engine.setQueue(QUEUE, { concurrency: queueLimit });
  // The workflow must be registered before start_runs names it: the worker processes do it.
  const processes: WorkerProcess[] = [];
  const sampler = startSampler(db.pool);
  try {
    for (let i = 0; i < workers; i++) {
      processes.push(
        await spawnWorker({
          DATABASE_URL: db.url,
          CONCURRENCY: String(concurrency),
          QUEUES: QUEUE,
          LEASE_MS: '10000',
          POOL_MAX: String(poolMax),
        }),
      );
    }
    const startedAt = Date.now();
    for (let done = 0; done < options.runs; done += 1_000) {
      const batch = Math.min(1_000, options.runs - done);
      await db.pool.query(`select runledger.start_runs('signalled', (select jsonb_agg('{}'::jsonb) from generate_series(1, $1)), $2)`, [
        batch,
        JSON.stringify({ queue: QUEUE }),
      ]);
    }
    await waitFor(
      'every run parked WAITING',
      async () => (await countStatus(db.pool, 'WAITING')) === options.runs || undefined,
      options.timeoutMs,
    );
    const parkMs = Date.now() - startedAt;

    const signalledAt = Date.now();
    const sent = await db.pool.query(
      `select count(*) filter (where runledger.send_signal(run_id, 'go', '{}'))::int as n
         from runledger.runs where status = 'WAITING' and queue_name = $1`,
      [QUEUE],
    );
    expect(sent.rows[0].n).toBe(options.runs);
    const signalMs = Date.now() - signalledAt;
    await waitFor(
      'every run SUCCEEDED',
      async () => (await countStatus(db.pool, 'SUCCEEDED')) === options.runs || undefined,
      options.timeoutMs,
    );
    const drainMs = Date.now() - signalledAt;
    const samples = sampler.stop();

    // Nothing lost, nothing twice: every run succeeded with one business row and one checkpoint of its transaction step.
    const statuses = await db.pool.query(
      `select status::text, count(*)::int as n from runledger.runs where queue_name = $1 group by status`,
      [QUEUE],
    );
    expect(statuses.rows).toEqual([{ status: 'SUCCEEDED', n: options.runs }]);
    const effects = await db.pool.query(
      `select count(*)::int as n, count(distinct run_id)::int as runs from orders o
        where item = 'effect' and exists (select 1 from runledger.runs r where r.run_id = o.run_id and r.queue_name = $1)`,
      [QUEUE],
    );
    expect(effects.rows[0]).toEqual({ n: options.runs, runs: options.runs });
    const checkpoints = await db.pool.query(
      `select count(*)::int as n, count(distinct s.run_id)::int as runs from runledger.steps s
         join runledger.runs r using (run_id) where r.queue_name = $1 and s.name = 'effect'`,
      [QUEUE],
    );
    expect(checkpoints.rows[0]).toEqual({ n: options.runs, runs: options.runs });

    // Bounds. RUNNING never above the slots or the queue's limit, whichever is lower. Connections:
    // each worker process's pool and its LISTEN connection, this engine's pool and listener, the
    // test's own pool (5), the sampler's connection.
    const runningBound = Math.min(workers * concurrency, queueLimit);
    const connectionBound = workers * (poolMax + 1) + (20 + 2) + 5 + 1;
    const peakRunning = Math.max(...samples.map((s) => s.running));
    const peakConnections = Math.max(...samples.map((s) => s.connections));
    expect(samples.length).toBeGreaterThan(5);
    expect(peakRunning).toBeGreaterThan(0); // the sampler saw the storm
    expect(peakRunning).toBeLessThanOrEqual(runningBound);
    expect(peakConnections).toBeLessThanOrEqual(connectionBound);
    return {
      runs: options.runs,
      parkMs,
      signalMs,
      drainMs,
      runsPerSecond: Math.round((options.runs * 1000) / drainMs),
      peakRunning,
      runningBound,
      peakConnections,
      connectionBound,
      samples: samples.length,
    };
  } finally {
    sampler.stop();
    for (const p of processes) p.kill('SIGTERM');
    await Promise.all(processes.map((p) => p.exited));
  }
}

async function countStatus(pool: TestEngine['db']['pool'], status: string): Promise<number> {
  const { rows } = await pool.query(`select count(*)::int as n from runledger.runs where queue_name = $1 and status = $2`, [QUEUE, status]);
  return rows[0].n;
}

interface Sample {
  running: number;
  connections: number;
}

/** Every ~100 ms (one query at a time, on one pooled connection): RUNNING runs of the queue and connections to this database. */
function startSampler(pool: TestEngine['db']['pool']): { stop: () => Sample[] } {
  const samples: Sample[] = [];
  let stopped = false;
  const loop = async () => {
    while (!stopped) {
      const { rows } = await pool.query(
        `select (select count(*)::int from runledger.runs where queue_name = $1 and status in ('RUNNING', 'CANCELLING')) as running,
                (select count(*)::int from pg_stat_activity where datname = current_database()) as connections`,
        [QUEUE],
      );
      samples.push(rows[0]);
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  };
  const done = loop().catch(() => undefined);
  void done;
  return {
    stop: () => {
      stopped = true;
      return samples;
    },
  };
}
