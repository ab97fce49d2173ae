import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { AggregationTemporality, MeterProvider, MetricReader, type DataPoint, type Histogram } from '@opentelemetry/sdk-metrics';
import { createEngine, type Engine, type Worker } from '../../../src/index.js';
import { createMetrics } from '../../../src/engine/observe/metrics.js';
import { createTestDatabase, waitFor, type TestDatabase } from '../../helpers/database.js';
import { register as registerOrders } from '../../fixtures/cli-workflows.js';

const ROOT = fileURLToPath(new URL('../../..', import.meta.url));

/** A reader collected by hand: each collect() reads the counters and runs the gauges' callback once. */
class TestReader extends MetricReader {
  constructor() {
    super({ aggregationTemporalitySelector: () => AggregationTemporality.CUMULATIVE });
  }
  protected async onForceFlush(): Promise<void> {}
  protected async onShutdown(): Promise<void> {}
}

type Point = DataPoint<number | Histogram>;

async function collect(reader: TestReader): Promise<Map<string, Point[]>> {
  const { resourceMetrics, errors } = await reader.collect();
  expect(errors).toEqual([]);
  const byName = new Map<string, Point[]>();
  for (const scope of resourceMetrics.scopeMetrics) {
    for (const metric of scope.metrics) byName.set(metric.descriptor.name, metric.dataPoints as Point[]);
  }
  return byName;
}

/** The point of `name` whose attributes include `attributes`; undefined when none. */
function point(metrics: Map<string, Point[]>, name: string, attributes: Record<string, unknown>): Point | undefined {
  return metrics.get(name)?.find((p) => Object.entries(attributes).every(([k, v]) => p.attributes[k] === v));
}

const value = (p: Point | undefined): number | undefined => (p === undefined ? undefined : (p.value as number));
const count = (p: Point | undefined): number | undefined => (p === undefined ? undefined : (p.value as Histogram).count);

let db: TestDatabase;
let reader: TestReader;
let provider: MeterProvider;
let engine: Engine;
let worker: Worker;
const others: Engine[] = [];
const silent = { log: () => {} };

beforeAll(async () => {
  db = await createTestDatabase();
  reader = new TestReader();
  provider = new MeterProvider({ readers: [reader] });
  engine = createEngine({ connectionString: db.url, meterProvider: provider, ...silent });
});

afterAll(async () => {
  await worker?.stop();
  for (const other of others) await other.close();
  await engine?.close();
  await provider?.shutdown();
  await db?.drop();
});

describe('counters and histograms', () => {
  it('records runs started and finished, step and run durations, group commits and commits', async () => {
    const ok = engine.workflow({ name: 'm-ok', version: '3', queue: 'm-main' }, async (ctx, input: { n: number }) => {
      const a = await ctx.step('a', async () => input.n + 1);
      return ctx.step('b', async () => a * 2);
    });
    const fails = engine.workflow({ name: 'm-fails', queue: 'm-main' }, async (ctx) => {
      await ctx.step('a', async () => 1);
      throw new Error('no');
    });
    const waits = engine.workflow({ name: 'm-waits', queue: 'm-main' }, async (ctx) => {
      const got = await ctx.waitForSignal<{ go: boolean }>('go');
      return got?.go ?? false;
    });
    const poison = engine.workflow({ name: 'm-poison', queue: 'm-main', maxRecoveryAttempts: 0 }, async (ctx) => {
      await ctx.step('boom', async () => 'never recorded');
      return 'done';
    });
    worker = await engine.runWorker({ manual: true, leaseMs: 500, queues: ['m-main'] });

    const [first, second] = await engine.startMany(ok, [{ n: 1 }, { n: 2 }]);
    const failed = await engine.start(fails, undefined);
    await worker.drain();
    await expect(first!.result()).resolves.toBe(4);
    await expect(second!.result()).resolves.toBe(6);
    await expect(failed.result()).rejects.toThrow('no');

    // The final status is read after the terminal write commits, so the counts land a moment later.
    let metrics = await waitFor('runs.finished recorded', async () => {
      const m = await collect(reader);
      return value(point(m, 'runledger.runs.finished', { workflow: 'm-fails' })) === 1 &&
        value(point(m, 'runledger.runs.finished', { workflow: 'm-ok' })) === 2
        ? m
        : undefined;
    });
    expect(value(point(metrics, 'runledger.runs.started', { workflow: 'm-ok', version: '3' }))).toBe(2);
    expect(value(point(metrics, 'runledger.runs.started', { workflow: 'm-fails', version: '1' }))).toBe(1);
    expect(point(metrics, 'runledger.runs.finished', { workflow: 'm-ok' })?.attributes).toEqual({
      workflow: 'm-ok',
      version: '3',
      status: 'SUCCEEDED',
      reason: 'COMPLETED',
      verified: false,
      runtime: expect.stringMatching(/^runledger@/),
    });
    expect(point(metrics, 'runledger.runs.finished', { workflow: 'm-fails' })?.attributes).toMatchObject({
      status: 'FAILED',
      reason: 'FAILED',
    });
    const okDuration = point(metrics, 'runledger.run.duration', { workflow: 'm-ok', status: 'SUCCEEDED' });
    expect(count(okDuration)).toBe(2);
    expect((okDuration!.value as Histogram).sum).toBeGreaterThanOrEqual(0);
    expect(count(point(metrics, 'runledger.step.duration', { workflow: 'm-ok', step: 'a', kind: 'step', status: 'SUCCEEDED' }))).toBe(2);
    expect(count(point(metrics, 'runledger.step.duration', { workflow: 'm-ok', step: 'b' }))).toBe(2);
    expect(count(point(metrics, 'runledger.step.duration', { workflow: 'm-fails', step: 'a' }))).toBe(1);
    // Every checkpoint and completion of these runs went through the worker's group commit.
    const batches = point(metrics, 'runledger.group_commit.batch_size', {});
    const items = (batches!.value as Histogram).sum!;
    expect(items).toBeGreaterThanOrEqual(3); // at least the three completions
    expect(value(point(metrics, 'runledger.commits', { kind: 'group' }))).toBe(count(batches));
    expect(value(point(metrics, 'runledger.commits', { kind: 'finish' }))).toBe(1); // the failure, on its own

    // A wait: the gauges see it, a signal resumes it.
    const waiting = await engine.start(waits, undefined);
    await worker.drain();
    metrics = await collect(reader);
    expect(value(point(metrics, 'runledger.runs.waiting', { kind: 'signal' }))).toBe(1);
    expect(value(point(metrics, 'runledger.runs.waiting', { kind: 'timer' }))).toBe(0);
    expect(value(point(metrics, 'runledger.resumes', { workflow: 'm-waits' }))).toBeUndefined();
    await engine.signal(waiting.runId, 'go', { go: true });
    await worker.drain();
    await expect(waiting.result()).resolves.toBe(true);
    metrics = await waitFor('the resumed run finished', async () => {
      const m = await collect(reader);
      return value(point(m, 'runledger.runs.finished', { workflow: 'm-waits' })) === 1 ? m : undefined;
    });
    expect(point(metrics, 'runledger.resumes', { workflow: 'm-waits' })?.attributes).toEqual({
      workflow: 'm-waits',
      version: '1',
      recovered: false,
    });
    expect(value(point(metrics, 'runledger.resumes', { workflow: 'm-waits' }))).toBe(1);
    expect(value(point(metrics, 'runledger.runs.waiting', { kind: 'signal' }))).toBe(0);

    // A dead letter through max_recovery_attempts: a worker dies in the step, this engine's
    // sweeper finds the lease expired and, with no attempt left, dead-letters the run.
    const crashing = createEngine({ connectionString: db.url, crashAt: { step: 'boom', when: 'after-call' }, ...silent });
    others.push(crashing);
    crashing.workflow({ name: 'm-poison', queue: 'm-main', maxRecoveryAttempts: 0 }, async (ctx) => {
      await ctx.step('boom', async () => 'never recorded');
      return 'done';
    });
    const dying = await crashing.runWorker({ manual: true, leaseMs: 500 });
    const doomed = await engine.start(poison, undefined);
    await dying.drain();
    expect(dying.crashed).toBe(true);
    await waitFor('the run dead-lettered', async () => {
      await worker.runOnce();
      return (await engine.getRun(doomed.runId))?.status === 'DEAD_LETTER';
    });
    metrics = await collect(reader);
    expect(point(metrics, 'runledger.dead_letters', { workflow: 'm-poison' })?.attributes).toEqual({
      workflow: 'm-poison',
      version: '1',
      reason: 'MAX_RECOVERY_ATTEMPTS',
    });
    expect(value(point(metrics, 'runledger.dead_letters', { workflow: 'm-poison' }))).toBe(1);
    expect(value(point(metrics, 'runledger.recoveries', { outcome: 'dead_letter' }))).toBe(1);
    expect(value(point(metrics, 'runledger.runs.finished', { workflow: 'm-poison', status: 'DEAD_LETTER' }))).toBe(1);
  });

  it('counts what runs spent, by version, runtime, manifest entries and verified (the cost of a verified run)', async () => {
    const agent = engine.workflow(
      {
        name: 'm-agent',
        version: '2',
        queue: 'm-cost',
        manifest: { agent: 'a7', prompt: 'p3', tools: { git: 'v1' } },
        limits: { budget: { tokens: 10_000, costUsd: 10 } },
        verify: (output) => (output === 'good' ? { ok: true } : { ok: false, reason: 'bad' }),
      },
      async (ctx, input: { good: boolean }) => {
        await ctx.step('call', () => ctx.charge({ tokens: 120, costUsd: 0.25 }));
        return input.good ? 'good' : 'bad';
      },
    );
    const costWorker = await engine.runWorker({ manual: true, leaseMs: 500, queues: ['m-cost'] });
    try {
      const handles = await engine.startMany(agent, [{ good: true }, { good: true }, { good: false }]);
      await costWorker.drain();
      await Promise.allSettled(handles.map((h) => h.result()));
      const metrics = await waitFor('the spend counted', async () => {
        const m = await collect(reader);
        return value(point(m, 'runledger.run.cost_usd', { workflow: 'm-agent', verified: false })) === 0.25 ? m : undefined;
      });
      const verified = point(metrics, 'runledger.run.cost_usd', { workflow: 'm-agent', verified: true });
      expect(value(verified)).toBe(0.5);
      expect(verified?.attributes).toEqual({
        workflow: 'm-agent',
        version: '2',
        status: 'SUCCEEDED',
        verified: true,
        runtime: expect.stringMatching(/^runledger@/),
        'manifest.agent': 'a7',
        'manifest.prompt': 'p3',
      });
      expect(value(point(metrics, 'runledger.run.tokens', { workflow: 'm-agent', verified: true }))).toBe(240);
      expect(value(point(metrics, 'runledger.runs.finished', { workflow: 'm-agent', reason: 'UNVERIFIED' }))).toBe(1);
    } finally {
      await costWorker.stop();
    }
  });

  it('counts a lease lost and a recovery back to PENDING', async () => {
    const slow = engine.workflow({ name: 'm-slow', queue: 'm-lease' }, async (ctx) => {
      await ctx.step('one', async () => 1);
      return 'ok';
    });
    const other = createEngine({ connectionString: db.url, crashAt: { step: 'one', when: 'after-call' }, ...silent });
    others.push(other);
    other.workflow({ name: 'm-slow', queue: 'm-lease' }, async (ctx) => {
      await ctx.step('one', async () => 1);
      return 'ok';
    });
    const dying = await other.runWorker({ manual: true, leaseMs: 500 });
    const handle = await engine.start(slow, undefined);
    await dying.drain();
    const leaseWorker = await engine.runWorker({ manual: true, leaseMs: 500, queues: ['m-lease'] });
    try {
      await waitFor('the run recovered and finished', async () => {
        await leaseWorker.runOnce();
        return (await engine.getRun(handle.runId))?.status === 'SUCCEEDED';
      });
      const metrics = await waitFor('the recovered run counted', async () => {
        const m = await collect(reader);
        return value(point(m, 'runledger.runs.finished', { workflow: 'm-slow' })) === 1 ? m : undefined;
      });
      expect(value(point(metrics, 'runledger.recoveries', { outcome: 'requeued' }))).toBe(1);
      expect(point(metrics, 'runledger.resumes', { workflow: 'm-slow' })).toBeUndefined(); // it had no checkpoint yet
    } finally {
      await leaseWorker.stop();
    }

    // A lease taken over under a live execution: its heartbeat finds the run gone and it lets go.
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const held = engine.workflow({ name: 'm-held', queue: 'm-held' }, async (ctx) => {
      await ctx.step('first', async () => {
        await gate;
        return 1;
      });
      return 'ok';
    });
    const holder = await engine.runWorker({ manual: true, leaseMs: 600, queues: ['m-held'] });
    try {
      const run = await engine.start(held, undefined);
      const executing = holder.runOnce();
      await waitFor('the run claimed', async () => (await engine.getRun(run.runId))?.status === 'RUNNING');
      // As another worker's claim would: a new owner and fencing token, a lease of its own.
      await db.pool.query(
        `update runledger.runs set lease_owner = 'elsewhere', fencing_token = fencing_token + 1,
                lease_expires_at = runledger.now() + interval '1 hour' where run_id = $1`,
        [run.runId],
      );
      const metrics = await waitFor('the lease loss counted', async () => {
        const m = await collect(reader);
        return value(point(m, 'runledger.lease.lost', { workflow: 'm-held' })) === 1 ? m : undefined;
      });
      expect(point(metrics, 'runledger.lease.lost', { workflow: 'm-held' })?.attributes).toEqual({ workflow: 'm-held', version: '1' });
      release();
      await executing;
      // Nothing of the lost execution was written.
      const steps = await db.pool.query('select count(*)::int as n from runledger.steps where run_id = $1', [run.runId]);
      expect(steps.rows).toEqual([{ n: 0 }]);
    } finally {
      release();
      await holder.stop();
    }
  });
});

describe('gauges', () => {
  it('reads queue depth, running and admission wait per queue from the database, once per collection', async () => {
    const idle = engine.workflow({ name: 'm-idle', queue: 'm-unserved' }, async () => 'x');
    await engine.setQueue('m-empty', { concurrency: 2 });
    await engine.startMany(idle, [1, 2, 3]);
    await db.pool.query(`update runledger.runs set created_at = created_at - interval '90 seconds' where workflow_name = 'm-idle'`);
    const gaugeWorker = await engine.runWorker({ manual: true, queues: ['m-gauges'] });
    try {
      const metrics = await collect(reader);
      expect(value(point(metrics, 'runledger.queue.depth', { queue: 'm-unserved' }))).toBe(3);
      expect(value(point(metrics, 'runledger.queue.running', { queue: 'm-unserved' }))).toBe(0);
      expect(value(point(metrics, 'runledger.queue.admission_wait', { queue: 'm-unserved' }))).toBeGreaterThanOrEqual(90);
      expect(value(point(metrics, 'runledger.queue.admission_wait', { queue: 'm-unserved' }))).toBeLessThan(600);
      // A configured queue without runs reports zeros.
      expect(value(point(metrics, 'runledger.queue.depth', { queue: 'm-empty' }))).toBe(0);
      expect(value(point(metrics, 'runledger.queue.admission_wait', { queue: 'm-empty' }))).toBe(0);
    } finally {
      await gaugeWorker.stop();
    }
  });
});

describe('without a provider', () => {
  it('records nothing and runs workflows as before', async () => {
    expect(createMetrics()).toBeUndefined(); // nothing registered globally
    const plain = createEngine({ connectionString: db.url, ...silent });
    others.push(plain);
    const wf = plain.workflow({ name: 'm-plain', queue: 'm-plain' }, async (ctx) => ctx.step('s', async () => 7));
    const w = await plain.runWorker({ manual: true });
    const handle = await plain.start(wf, undefined);
    await w.drain();
    await expect(handle.result()).resolves.toBe(7);
    await w.stop();
    const metrics = await collect(reader);
    expect(point(metrics, 'runledger.runs.started', { workflow: 'm-plain' })).toBeUndefined();
  });
});

describe('runledger worker --metrics-port', () => {
  it('serves the metrics of the runs it ran at /metrics in the Prometheus text format, on 127.0.0.1', async () => {
    const child = spawn(
      process.execPath,
      ['--import', 'tsx', 'src/cli/main.ts', 'worker', '--module', 'test/fixtures/cli-workflows.ts', '--metrics-port', '0'],
      { cwd: ROOT, env: { ...process.env, DATABASE_URL: db.url }, stdio: ['ignore', 'pipe', 'pipe'] },
    );
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (chunk) => (stdout += chunk));
    child.stderr.on('data', (chunk) => (stderr += chunk));
    const exited = new Promise<number | null>((resolve) => child.on('close', (code) => resolve(code)));
    try {
      const url = await waitFor(
        `the worker's metrics address (stdout: ${stdout}, stderr: ${stderr})`,
        async () => /metrics at (http:\/\/\S+)/.exec(stdout)?.[1],
      );
      expect(url).toMatch(/^http:\/\/127\.0\.0\.1:\d+\/metrics$/);
      const client = createEngine({ connectionString: db.url, ...silent });
      others.push(client);
      const orders = registerOrders(client);
      const handles = await client.startMany(orders, [
        { item: 'a', amount: 1 },
        { item: 'b', amount: 2 },
      ]);
      for (const handle of handles) await handle.result({ timeoutMs: 30_000 });
      const text = await waitFor('both runs in /metrics', async () => {
        const body = await (await fetch(url)).text();
        return /runledger_runs_finished_total\{[^}]*workflow="cli-order"[^}]*\} 2\b/.test(body) ? body : undefined;
      });
      expect(text).toMatch(/# TYPE runledger_runs_finished_total counter/);
      expect(text).toMatch(
        /runledger_runs_finished_total\{[^}]*workflow="cli-order",version="1",status="SUCCEEDED",reason="COMPLETED"[^}]*\} 2/,
      );
      expect(text).toMatch(/# TYPE runledger_run_duration histogram/);
      expect(text).toMatch(/runledger_run_duration_count\{[^}]*workflow="cli-order",version="1",status="SUCCEEDED"[^}]*\} 2/);
      expect(text).toMatch(/runledger_group_commit_batch_size_sum\{[^}]*\} [1-9]/);
      expect(text).toMatch(/runledger_commits_total\{kind="group"[^}]*\} [1-9]/);
      // The gauges: the queue it serves, empty now, and no run waiting.
      expect(text).toMatch(/runledger_queue_depth\{queue="cli-orders"[^}]*\} 0\n/);
      expect(text).toMatch(/runledger_queue_running\{queue="cli-orders"[^}]*\} 0\n/);
      expect(text).toMatch(/runledger_queue_admission_wait\{queue="cli-orders"[^}]*\} 0\n/);
      expect(text).toMatch(/runledger_runs_waiting\{kind="signal"[^}]*\} 0\n/);
      // Only /metrics is served.
      expect((await fetch(url.replace('/metrics', '/other'))).status).toBe(404);
      child.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect(stdout).toContain('stopped');
    } finally {
      child.kill('SIGTERM');
      await exited;
    }
  });
});
