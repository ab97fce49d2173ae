import { spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { context, trace, SpanStatusCode, type Span } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-base';
import { afterAll, beforeAll, beforeEach, describe, expect, it, onTestFailed } from 'vitest';
import type { Engine } from '../../../src/index.js';
import { waitFor } from '../../helpers/database.js';
import { runCli } from '../../helpers/cli.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';
import { defineTracingWorkflows } from '../../fixtures/tracing-workflows.js';
import type { SpanLine } from '../../fixtures/tracing-worker.js';

/**
 * OpenTelemetry traces (docs/observability.md#traces): the caller's traceparent is stored on
 * the run at start, and every execution of the run, in this process or in another one after
 * a SIGKILL, opens its span under it, with its steps, operations, waits and group commits.
 */
const t = useTestEngine();
const { db } = t;
const { processes: spawned, workers } = stoppedAfterEach();
const TRACING_WORKER = new URL('../../fixtures/tracing-worker.ts', import.meta.url).pathname;
const NO_OTEL = new URL('../../fixtures/no-otel.mjs', import.meta.url).pathname;
const UNTRACED_RUN = new URL('../../fixtures/untraced-run.ts', import.meta.url).pathname;

// The application's side: a context manager, so a span started with startActiveSpan is the
// active one when it calls engine.start (runledger registers nothing itself).
const contextManager = new AsyncLocalStorageContextManager();
const exporter = new InMemorySpanExporter();
const provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
const caller = provider.getTracer('caller');
let dir: string;

beforeAll(() => {
  context.setGlobalContextManager(contextManager.enable());
  dir = mkdtempSync(join(tmpdir(), 'runledger-tracing-'));
});
afterAll(() => {
  context.disable();
  trace.disable();
  rmSync(dir, { recursive: true, force: true });
});
beforeEach(() => exporter.reset());

/** The caller's span, ended once fn settled; fn runs with it active. */
async function underSpan<T>(fn: (span: Span) => Promise<T>): Promise<{ value: T; traceId: string; spanId: string }> {
  return caller.startActiveSpan('caller', async (span) => {
    try {
      const value = await fn(span);
      return { value, ...span.spanContext() };
    } finally {
      span.end();
    }
  });
}

const runSpans = (runId: string) =>
  exporter.getFinishedSpans().filter((s) => s.name.startsWith('runledger.run ') && s.attributes['runledger.run_id'] === runId);
const childrenOf = (parent: ReadableSpan) =>
  exporter.getFinishedSpans().filter((s) => s.parentSpanContext?.spanId === parent.spanContext().spanId);

async function runRow(runId: string): Promise<{ status: string; traceparent: string | null; execution_traceparent: string | null }> {
  const { rows } = await db.pool.query('select status, traceparent, execution_traceparent from runledger.runs where run_id = $1', [runId]);
  return rows[0];
}

describe('in one process', () => {
  let engine: Engine;
  beforeAll(() => {
    engine = t.newEngine({ tracerProvider: provider });
  });

  it('traces each execution under the caller: steps, operations, a wait, the group commit; the traceparent stored', async () => {
    const app = provider.getTracer('app');
    const wf = engine.workflow({ name: 'traced-local' }, async (ctx) => {
      const a = await ctx.step('a', () => 1);
      const b = await ctx.operation('b', { idempotent: true }, async () => a + 1);
      await ctx.sleep('nap', 20);
      // The application's own span inside a step nests under the step's span.
      const c = await ctx.step('c', () => app.startActiveSpan('app-work', (span) => (span.end(), b + 1)));
      return { c };
    });
    workers.push(await engine.runWorker({ pollIntervalMs: 50, leaseMs: 5_000 }));
    const started = await underSpan(() => engine.start(wf, {}));
    const runId = started.value.runId;
    expect(await started.value.result({ timeoutMs: 20_000 })).toEqual({ c: 3 });

    // The run is parked by the sleep: two executions, both in the caller's trace.
    const [first, second] = await waitFor('both executions ended', async () => {
      const spans = runSpans(runId);
      return spans.length === 2
        ? spans.sort((x, y) => Number(x.attributes['runledger.fencing_token']) - Number(y.attributes['runledger.fencing_token']))
        : undefined;
    });
    for (const span of [first!, second!]) {
      expect(span.name).toBe('runledger.run traced-local');
      expect(span.spanContext().traceId).toBe(started.traceId);
      expect(span.parentSpanContext?.spanId).toBe(started.spanId);
      expect(span.attributes).toMatchObject({
        'runledger.run_id': runId,
        'runledger.workflow': 'traced-local',
        'runledger.version': wf.version,
        'runledger.attempt': 1,
      });
    }
    expect(first!.attributes['runledger.fencing_token']).toBe('1');
    expect(first!.attributes['runledger.outcome']).toBe('suspended');
    expect(first!.events.map((e) => [e.name, e.attributes?.['runledger.step'], e.attributes?.['runledger.parked']])).toEqual([
      ['runledger.wait', 'nap', true],
    ]);
    expect(second!.attributes['runledger.fencing_token']).toBe('2');
    expect(second!.attributes['runledger.outcome']).toBe('succeeded');
    // The second execution links to the first (runs.execution_traceparent).
    expect(second!.links.map((l) => l.context.spanId)).toEqual([first!.spanContext().spanId]);

    const firstChildren = childrenOf(first!).map((s) => [s.name, s.attributes['runledger.step'], s.attributes['runledger.attempt']]);
    expect(firstChildren).toEqual([
      ['runledger.step a', 'a', 1],
      ['runledger.operation b', 'b', 1],
    ]);
    const [stepC, ...rest] = childrenOf(second!);
    expect([stepC!.name, rest.length]).toEqual(['runledger.step c', 0]);
    expect(childrenOf(stepC!).map((s) => s.name)).toEqual(['app-work']);

    // Group commits are linked to the executions they wrote for, not parented by them.
    const commits = exporter.getFinishedSpans().filter((s) => s.name === 'runledger.group_commit');
    const linked = commits.filter((s) => s.links.some((l) => l.context.spanId === second!.spanContext().spanId));
    expect(linked.length).toBeGreaterThan(0);
    expect(linked[0]!.parentSpanContext).toBeUndefined();
    expect(linked[0]!.attributes['runledger.batch_size']).toBeGreaterThanOrEqual(1);

    const row = await runRow(runId);
    expect(row.traceparent).toBe(`00-${started.traceId}-${started.spanId}-01`);
    expect(row.execution_traceparent).toBe(`00-${started.traceId}-${second!.spanContext().spanId}-01`);
    expect(await engine.getRun(runId)).toMatchObject({ traceparent: row.traceparent, executionTraceparent: row.execution_traceparent });
    const shown = await runCli(db.url, ['show', runId]);
    expect(shown.code).toBe(0);
    expect(shown.stdout).toMatch(new RegExp(`\\ntrace\\s+${row.traceparent} \\(started under\\)\\n`));
    expect(shown.stdout).toMatch(new RegExp(`\\nlast span\\s+${row.execution_traceparent} \\(latest traced execution\\)\\n`));
  });

  it('marks a failed step and a failed run ERROR, with the error recorded', async () => {
    const wf = engine.workflow({ name: 'traced-failing' }, async (ctx) => {
      await ctx.step('breaks', () => {
        throw new Error('the step broke');
      });
    });
    workers.push(await engine.runWorker({ pollIntervalMs: 50, leaseMs: 5_000 }));
    const { value: handle } = await underSpan(() => engine.start(wf, {}));
    await expect(handle.result({ timeoutMs: 20_000 })).rejects.toThrow(/FAILED/);
    const [run] = await waitFor('the execution ended', async () =>
      runSpans(handle.runId).length === 1 ? runSpans(handle.runId) : undefined,
    );
    expect(run!.status).toMatchObject({ code: SpanStatusCode.ERROR, message: expect.stringContaining('the step broke') });
    expect(run!.events.map((e) => e.name)).toContain('exception');
    expect(run!.attributes['runledger.outcome']).toBe('failed');
    const [step] = childrenOf(run!);
    expect([step!.name, step!.status.code, step!.status.message]).toEqual([
      'runledger.step breaks',
      SpanStatusCode.ERROR,
      'the step broke',
    ]);
  });

  it('uses the globally registered provider when the engine is given none', async () => {
    const global = t.newEngine();
    const wf = global.workflow({ name: 'traced-global' }, async (ctx) => ctx.step('only', () => 7));
    workers.push(await global.runWorker({ pollIntervalMs: 50, leaseMs: 5_000 }));
    trace.setGlobalTracerProvider(provider);
    try {
      const started = await underSpan(() => global.start(wf, {}));
      expect(await started.value.result({ timeoutMs: 20_000 })).toBe(7);
      const [run] = await waitFor('the execution ended', async () =>
        runSpans(started.value.runId).length === 1 ? runSpans(started.value.runId) : undefined,
      );
      expect(run!.spanContext().traceId).toBe(started.traceId);
      expect(childrenOf(run!).map((s) => s.name)).toEqual(['runledger.step only']);
    } finally {
      trace.disable();
    }
  });
});

describe('without a tracer provider', () => {
  it('runs as always, stores the caller traceparent it is given, and records no span', async () => {
    const plain = t.newEngine();
    const wf = plain.workflow({ name: 'untraced' }, async (ctx) => ctx.step('only', () => 1));
    workers.push(await plain.runWorker({ pollIntervalMs: 50, leaseMs: 5_000 }));
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const handle = await plain.start(wf, {}, { traceparent });
    expect(await handle.result({ timeoutMs: 20_000 })).toBe(1);
    // No provider: the api is there, nothing records, nothing is written for the execution.
    expect(exporter.getFinishedSpans().filter((s) => s.name.startsWith('runledger.'))).toEqual([]);
    expect(await runRow(handle.runId)).toEqual({ status: 'SUCCEEDED', traceparent, execution_traceparent: null });
    // Under the caller's active span (a provider the engine does not use), its traceparent is taken.
    const started = await underSpan(() => plain.start(wf, {}));
    expect(await started.value.result({ timeoutMs: 20_000 })).toBe(1);
    expect((await runRow(started.value.runId)).traceparent).toBe(`00-${started.traceId}-${started.spanId}-01`);
  });

  it('works in a process where @opentelemetry/api is not installed', async () => {
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01';
    const child = spawn(process.execPath, ['--import', NO_OTEL, '--import', 'tsx', UNTRACED_RUN], {
      cwd: new URL('../../..', import.meta.url).pathname,
      env: { ...process.env, DATABASE_URL: db.url, TRACEPARENT: traceparent },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    child.stdout.on('data', (chunk) => (output += chunk));
    child.stderr.on('data', (chunk) => (output += chunk));
    const code = await new Promise<number | null>((resolve) => child.on('close', resolve));
    expect({ code, output }).toMatchObject({ code: 0 });
    expect(JSON.parse(output.trim().split('\n').pop()!)).toEqual({
      apiLoadable: false,
      output: 21,
      traceparent,
      executionTraceparent: null,
    });
  });

  it('refuses a traceparent that is not W3C, from engine.start and from SQL', async () => {
    const plain = t.newEngine();
    const wf = plain.workflow({ name: 'untraced-bad' }, async () => 1);
    await expect(plain.start(wf, {}, { traceparent: 'not-a-traceparent' })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await plain.start(wf, {}, { runId: 'registers-untraced-bad', traceparent: null });
    await expect(
      db.pool.query(`select runledger.start_run('untraced-bad', '{}', '{"traceparent": "00-${'0'.repeat(32)}-00f067aa0ba902b7-01"}')`),
    ).rejects.toMatchObject({ code: 'RL003' });
    // psql: start_run's option, as a caller outside JavaScript passes it.
    const traceparent = '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00';
    const { rows } = await db.pool.query(
      `select runledger.start_run('untraced-bad', '{}', jsonb_build_object('traceparent', $1::text)) as run_id`,
      [traceparent],
    );
    expect((await runRow(rows[0].run_id)).traceparent).toBe(traceparent);
    const many = await db.pool.query(
      `select runledger.start_runs('untraced-bad', '[1, 2]', jsonb_build_object('traceparent', $1::text)) as run_ids`,
      [traceparent],
    );
    for (const runId of many.rows[0].run_ids) expect((await runRow(runId)).traceparent).toBe(traceparent);
  });
});

describe('across a SIGKILL', () => {
  async function tracingWorker(name: string, env: Record<string, string> = {}): Promise<{ process: WorkerProcess; file: string }> {
    const file = join(dir, `${name}.jsonl`);
    const process = await spawnWorker({ DATABASE_URL: db.url, TRACE_FILE: file, LEASE_MS: '1000', ...env }, TRACING_WORKER);
    spawned.push(process);
    onTestFailed(() => console.error(`--- worker ${name} (${process.pid}) output ---\n${process.output().slice(-4000)}`));
    return { process, file };
  }
  const spansIn = (file: string): SpanLine[] =>
    readFileSync(file, 'utf8')
      .split('\n')
      .filter(Boolean)
      .map((line) => JSON.parse(line) as SpanLine);

  it('one trace: the killed execution and the recovering one carry the caller trace id, each with its own steps', async () => {
    const starter = t.newEngine();
    const { traced } = defineTracingWorkflows(starter);
    const started = await underSpan(() => starter.start(traced, { n: 1 }));
    const runId = started.value.runId;

    // A: SIGKILLs itself once step "second" returned, before its checkpoint.
    const a = await tracingWorker('a', { RUNLEDGER_FAILPOINTS: 'before-checkpoint:second' });
    expect((await a.process.exited).signal).toBe('SIGKILL');
    // B recovers the run once A's lease expired, and finishes it.
    const b = await tracingWorker('b');
    await waitFor('the run succeeded', async () => (await runRow(runId)).status === 'SUCCEEDED' || undefined);
    expect(await started.value.result({ timeoutMs: 1_000 })).toEqual({ charged: 400 });

    const aSpans = spansIn(a.file);
    const bSpans = spansIn(b.file);
    const runOf = (spans: SpanLine[], phase: SpanLine['phase']) =>
      spans.filter((s) => s.phase === phase && s.name === 'runledger.run traced' && s.attributes['runledger.run_id'] === runId);
    // A's execution span was started and never ended (the process died); B's ended.
    const [aRun] = runOf(aSpans, 'start');
    expect(runOf(aSpans, 'end')).toEqual([]);
    const [bRun] = runOf(bSpans, 'end');
    expect(aRun && bRun).toBeTruthy();
    for (const run of [aRun!, bRun!]) {
      expect(run.traceId).toBe(started.traceId);
      expect(run.parentSpanId).toBe(started.spanId);
      expect(run.attributes).toMatchObject({
        'runledger.run_id': runId,
        'runledger.workflow': 'traced',
        'runledger.version': traced.version,
      });
    }
    expect(aRun!.pid).not.toBe(bRun!.pid);
    expect(aRun!.attributes['runledger.attempt']).toBe(1);
    expect(bRun!.attributes['runledger.attempt']).toBe(2);
    expect(Number(bRun!.attributes['runledger.fencing_token'])).toBeGreaterThan(Number(aRun!.attributes['runledger.fencing_token']));
    expect(bRun!.attributes['runledger.outcome']).toBe('succeeded');
    // B links to the execution it recovered from.
    expect(bRun!.links).toEqual([{ traceId: started.traceId, spanId: aRun!.spanId }]);

    // Each execution's steps are children of its own span: A finished first and second (then
    // died before second's checkpoint); B ran second again and the operation.
    const stepsOf = (spans: SpanLine[], run: SpanLine) =>
      spans.filter((s) => s.phase === 'end' && s.parentSpanId === run.spanId).map((s) => [s.name, s.traceId]);
    expect(stepsOf(aSpans, aRun!)).toEqual([
      ['runledger.step first', started.traceId],
      ['runledger.step second', started.traceId],
    ]);
    expect(stepsOf(bSpans, bRun!)).toEqual([
      ['runledger.step second', started.traceId],
      ['runledger.operation charge', started.traceId],
    ]);
    expect((await runRow(runId)).execution_traceparent).toBe(`00-${started.traceId}-${bRun!.spanId}-01`);
  });
});
