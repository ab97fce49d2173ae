import { afterEach, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { TicketService } from '../helpers/ticket-service.js';
import { defineFrameworkWorkflows, MODEL_CALLS_TABLE } from '../fixtures/framework-workflows.js';

/**
 * The framework adapters under SIGKILL, with real worker processes: the AI SDK's
 * generateText loop (runledger/ai) and the Agents SDK's run (runledger/openai-agents), each
 * killed after the refund service accepted the external call and before its outcome was
 * recorded, and after a model call's checkpoint. The next worker finishes the run: the
 * refund happened once, no checkpointed model call was made again, the session holds each
 * item once, and the answer is the one a run without the crash gives (the scripted model's,
 * asserted in full: each test checks the whole output).
 */
let service: TicketService;
const t = useTestEngine({
  prepare: async (db) => {
    service = await TicketService.start();
    await db.pool.query(MODEL_CALLS_TABLE);
    return () => service.stop();
  },
});
const { db } = t;
let flows: ReturnType<typeof defineFrameworkWorkflows>;
beforeAll(() => {
  flows = defineFrameworkWorkflows(t.engine, service.url, db.pool);
});
const { processes: spawned } = stoppedAfterEach();
afterEach(() => {
  service.calls.clear();
  service.tickets.clear();
});

const SCRIPT = new URL('../fixtures/framework-worker.ts', import.meta.url).pathname;
async function worker(failpoint?: string): Promise<WorkerProcess> {
  const w = await spawnWorker(
    { DATABASE_URL: db.url, SERVICE_URL: service.url, LEASE_MS: '1000', ...(failpoint ? { RUNLEDGER_FAILPOINTS: failpoint } : {}) },
    SCRIPT,
  );
  spawned.push(w);
  onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
  return w;
}

const modelCalls = async (runId: string) =>
  (
    await db.pool.query<{ n: number; calls: number; pids: number }>(
      'select n, count(*)::int as calls, count(distinct pid)::int as pids from model_calls where run_id = $1 group by n order by n',
      [runId],
    )
  ).rows;
const runRow = async (runId: string) =>
  (await db.pool.query('select status, output, recovery_attempts from runledger.runs where run_id = $1', [runId])).rows[0];
const finished = (runId: string) => waitFor(`run ${runId} finished`, async () => (await runRow(runId)).status === 'SUCCEEDED', 60_000);

/** Runs the workflow with the first worker killed at `failpoint`, then a second worker; returns the run id once it succeeded. */
async function crashAndRecover(start: () => Promise<{ runId: string }>, failpoint: string): Promise<string> {
  const first = await worker(failpoint);
  const { runId } = await start();
  const exit = await first.exited;
  expect(exit.signal).toBe('SIGKILL');
  await worker();
  await finished(runId);
  return runId;
}

describe('runledger/ai: generateText with durableModel and durableTools, SIGKILLed', () => {
  it('killed after the refund service accepted the call: refunded once (found by reconcile), no model call made again, the same answer', async () => {
    const runId = await crashAndRecover(() => t.engine.start(flows.aiRefund, { orderId: 'o-1' }), 'after-call:tool:refund');
    expect((await runRow(runId)).output).toEqual({ text: 'Refunded 30 on o-1.', refund: { id: 'T-1' } });
    expect([...service.calls.values()]).toEqual([1]);
    // Calls 1 and 2 were checkpointed before the kill and not made again; call 3 was made once, by the second worker.
    expect(await modelCalls(runId)).toEqual([
      { n: 1, calls: 1, pids: 1 },
      { n: 2, calls: 1, pids: 1 },
      { n: 3, calls: 1, pids: 1 },
    ]);
    const op = (await db.pool.query('select status from runledger.operations where run_id = $1', [runId])).rows;
    expect(op).toEqual([{ status: 'SUCCEEDED' }]);
  });

  it('killed after a model call’s checkpoint: that call is not made again', async () => {
    // The kill comes as the lookup's result is about to be recorded: model call 1 is checkpointed by then.
    const runId = await crashAndRecover(() => t.engine.start(flows.aiRefund, { orderId: 'o-2' }), 'before-checkpoint:tool:lookup');
    expect((await runRow(runId)).output).toEqual({ text: 'Refunded 30 on o-2.', refund: { id: 'T-1' } });
    expect((await modelCalls(runId)).map((r) => r.calls)).toEqual([1, 1, 1]);
    expect([...service.calls.values()]).toEqual([1]);
  });
});

describe('runledger/openai-agents: runAgentDurably with runledgerSession, SIGKILLed', () => {
  const items = async (sessionId: string) =>
    (await db.pool.query(`select content from runledger.session_history($1)`, [sessionId])).rows
      .map((r) => r.content)
      .filter((c) => 'item' in c)
      .map((c) => c.item);

  it('killed after the refund service accepted the call: refunded once, no model call made again, each session item once, the same answer', async () => {
    const runId = await crashAndRecover(
      () => t.engine.start(flows.agentsRefund, { orderId: 'o-3', sessionId: 'crash-3' }),
      'after-call:tool:refund',
    );
    expect((await runRow(runId)).output).toEqual({ text: 'Refunded on o-3.' });
    expect([...service.calls.values()]).toEqual([1]);
    expect((await modelCalls(runId)).map((r) => r.calls)).toEqual([1, 1, 1]);
    const history = await items('crash-3');
    const calls = history.filter((i) => i.type === 'function_call').map((i) => i.callId);
    const results = history.filter((i) => i.type === 'function_call_result').map((i) => i.callId);
    expect(calls).toEqual(['c1', 'c2']);
    expect(results).toEqual(['c1', 'c2']);
    expect(history.filter((i) => i.role === 'user')).toHaveLength(1);
  });

  it('killed after a model call’s checkpoint: that call is not made again', async () => {
    const runId = await crashAndRecover(
      () => t.engine.start(flows.agentsRefund, { orderId: 'o-4', sessionId: 'crash-4' }),
      'before-checkpoint:tool:lookup',
    );
    expect((await runRow(runId)).output).toEqual({ text: 'Refunded on o-4.' });
    expect((await modelCalls(runId)).map((r) => r.calls)).toEqual([1, 1, 1]);
    expect([...service.calls.values()]).toEqual([1]);
  });
});
