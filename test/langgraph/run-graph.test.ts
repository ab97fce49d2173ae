import { Annotation, END, interrupt, START, StateGraph } from '@langchain/langgraph';
import { describe, expect, it } from 'vitest';
import { graphResumeTopic, RunledgerSaver, runGraph } from '../../src/langgraph/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';

/**
 * runGraph: a LangGraph thread as a runledger run. An interrupt() is a durable wait answered
 * by a signal (or an approval); the graph resumes with the answer; each node runs once; the
 * thread's checkpoints are in runledger's tables, with the run that wrote them.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'graphs');

const ran: string[] = [];
const State = Annotation.Root({
  order: Annotation<string>(),
  amount: Annotation<number>(),
  decision: Annotation<unknown>(),
  shipped: Annotation<boolean>(),
});
function refundGraph(saver: RunledgerSaver) {
  return new StateGraph(State)
    .addNode('price', (s) => (ran.push(`price:${s.order}`), { amount: 42 }))
    .addNode('ask', (s) => {
      const decision = interrupt({ question: `refund ${s.amount} on ${s.order}?` });
      ran.push(`ask:${s.order}`);
      return { decision };
    })
    .addNode('ship', (s) => (ran.push(`ship:${s.order}`), { shipped: true }))
    .addEdge(START, 'price')
    .addEdge('price', 'ask')
    .addEdge('ask', 'ship')
    .addEdge('ship', END)
    .compile({ checkpointer: saver });
}

describe('runGraph', () => {
  it('an interrupt waits durably for a signal; the answer resumes the graph; each node runs once', async () => {
    const saver = new RunledgerSaver(t.engine.pool);
    const graph = refundGraph(saver);
    const wf = t.engine.workflow({ name: 'graph-signal', queue: 'graphs' }, async (ctx, input: { order: string }) =>
      runGraph(ctx, graph, { order: input.order }, { thread_id: `refund-${input.order}` }),
    );
    await worker();
    const handle = await t.engine.start(wf, { order: 'g-1' });
    await waitFor('the run to wait', async () => (await t.engine.getRun(handle.runId))?.status === 'WAITING');
    expect(ran.filter((r) => r.endsWith('g-1'))).toEqual(['price:g-1']);
    expect(await t.engine.signal(handle.runId, graphResumeTopic('refund-g-1'), 'approved by ops')).toBe(true);
    const result = await handle.result();
    expect(result.output).toEqual({ order: 'g-1', amount: 42, decision: 'approved by ops', shipped: true });
    expect(result.interrupts).toMatchObject([{ value: { question: 'refund 42 on g-1?' }, resume: 'approved by ops' }]);
    // price ran once: the replay after the wait did not run it again; ask ran its rest once, with the answer.
    expect(ran.filter((r) => r.endsWith('g-1'))).toEqual(['price:g-1', 'ask:g-1', 'ship:g-1']);
    const thread = (
      await db.pool.query(`select checkpoints, latest_run_id, pending_writes from runledger.graph_threads where thread_id = 'refund-g-1'`)
    ).rows[0];
    expect(thread).toMatchObject({ latest_run_id: handle.runId, pending_writes: 0 });
    expect(thread.checkpoints).toBeGreaterThanOrEqual(4);
  });

  it("interrupts: 'approval' makes the interrupt an approval; the decision is the resume value", async () => {
    const saver = new RunledgerSaver(t.engine.pool);
    const graph = refundGraph(saver);
    const wf = t.engine.workflow({ name: 'graph-approval', queue: 'graphs' }, async (ctx, input: { order: string }) =>
      runGraph(ctx, graph, { order: input.order }, { thread_id: `refund-${input.order}`, interrupts: 'approval', approvers: ['ops'] }),
    );
    await worker();
    const handle = await t.engine.start(wf, { order: 'g-2' });
    const request = await waitFor(
      'the approval',
      async () => (await db.pool.query('select request_id, evidence from runledger.approvals where run_id = $1', [handle.runId])).rows[0],
    );
    expect(request.evidence).toMatchObject({ thread_id: 'refund-g-2', interrupts: [{ value: { question: 'refund 42 on g-2?' } }] });
    await t.engine.decideApproval(request.request_id, { approved: true, decidedBy: 'ops', note: 'fine' });
    const result = await handle.result();
    expect(result.output).toMatchObject({ decision: { approved: true, decidedBy: 'ops', note: 'fine' }, shipped: true });
  });

  it('one runner per thread: a second run on the thread waits until the first ends', async () => {
    const saver = new RunledgerSaver(t.engine.pool);
    const graph = refundGraph(saver);
    const wf = t.engine.workflow({ name: 'graph-exclusive', queue: 'graphs' }, async (ctx, input: { order: string }) =>
      runGraph(ctx, graph, { order: input.order }, { thread_id: 'shared-thread' }),
    );
    await worker();
    const first = await t.engine.start(wf, { order: 'g-3' });
    await waitFor('the first run to wait on its interrupt', async () => (await t.engine.getRun(first.runId))?.status === 'WAITING');
    const second = await t.engine.start(wf, { order: 'g-4' });
    await waitFor('the second run to wait for the thread', async () => (await t.engine.getRun(second.runId))?.status === 'WAITING');
    expect(ran).not.toContain('price:g-4');
    await t.engine.signal(first.runId, graphResumeTopic('shared-thread'), 'yes');
    await expect(first.result()).resolves.toMatchObject({ output: { order: 'g-3', shipped: true } });
    await waitFor(
      'the second run to reach its interrupt',
      async () => ran.includes('price:g-4') && (await t.engine.getRun(second.runId))?.status === 'WAITING',
    );
    await t.engine.signal(second.runId, graphResumeTopic('shared-thread'), 'yes again');
    await expect(second.result()).resolves.toMatchObject({ output: { order: 'g-4', decision: 'yes again' } });
  });

  it("an execution that lost the run writes nothing more to the thread: the saver's writes are fenced; the run goes on elsewhere", async () => {
    const saver = new RunledgerSaver(t.engine.pool);
    const refused: string[] = [];
    let saving = 0;
    const put = saver.put.bind(saver);
    saver.put = async (...args: Parameters<typeof put>) => {
      saving++;
      try {
        return await put(...args);
      } catch (error) {
        refused.push((error as { code?: string }).code ?? String(error));
        throw error;
      } finally {
        saving--;
      }
    };
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let slowRuns = 0;
    const Counter = Annotation.Root({ n: Annotation<number>() });
    const graph = new StateGraph(Counter)
      .addNode('first', () => ({ n: 1 }))
      .addNode('slow', async (s) => {
        slowRuns++;
        await gate;
        return { n: s.n + 1 };
      })
      .addEdge(START, 'first')
      .addEdge('first', 'slow')
      .addEdge('slow', END)
      .compile({ checkpointer: saver });
    const wf = t.engine.workflow({ name: 'graph-fenced', queue: 'graphs-fenced' }, async (ctx) =>
      runGraph(ctx, graph, { n: 0 }, { thread_id: 'fenced-thread' }),
    );
    const w = await t.engine.runWorker({ queues: ['graphs-fenced'], leaseMs: 1_000, pollIntervalMs: 50, sweepIntervalMs: 200 });
    try {
      const handle = await t.engine.start(wf, undefined);
      const checkpoints = async () =>
        Number((await db.pool.query(`select count(*) from runledger.graph_checkpoints where thread_id = 'fenced-thread'`)).rows[0].count);
      // The slow node running, and the checkpoints before it saved (LangGraph saves them while the next node runs).
      await waitFor('the slow node running', async () => slowRuns === 1 && saving === 0 && (await checkpoints()) > 0);
      const before = await checkpoints();
      // Another worker took the run meanwhile (as after a stall past the lease): a new token, a
      // lease of its own, already expired so that recovery hands the run back.
      await db.pool.query(
        `update runledger.runs set fencing_token = fencing_token + 1, lease_owner = 'another-worker', lease_expires_at = now() where run_id = $1`,
        [handle.runId],
      );
      release();
      await waitFor('the stale checkpoint refused', async () => refused.length > 0);
      expect(refused[0]).toBe('RL001');
      expect(await checkpoints()).toBe(before);
      // Recovered, the run finds the thread where it was and runs the slow node again: its first result never landed.
      await expect(handle.result()).resolves.toMatchObject({ output: { n: 2 } });
      expect(slowRuns).toBe(2);
      const writers = await db.pool.query(`select distinct run_id from runledger.graph_checkpoints where thread_id = 'fenced-thread'`);
      expect(writers.rows).toEqual([{ run_id: handle.runId }]);
    } finally {
      await w.stop();
    }
  });

  it('refuses a graph compiled without a RunledgerSaver, and a thread id that is not a plain name', async () => {
    const plain = new StateGraph(State)
      .addNode('x', () => ({}))
      .addEdge(START, 'x')
      .compile();
    const wf = t.engine.workflow({ name: 'graph-refused', queue: 'graphs' }, async (ctx, input: { thread: string; plain: boolean }) =>
      runGraph(ctx, input.plain ? plain : refundGraph(new RunledgerSaver(t.engine.pool)), {}, { thread_id: input.thread }),
    );
    await worker();
    const plainRun = await t.engine.start(wf, { thread: 'ok', plain: true });
    await expect(plainRun.result()).rejects.toThrow(/compile the graph with a RunledgerSaver/);
    const badThread = await t.engine.start(wf, { thread: 'not ok!', plain: false });
    await expect(badThread.result()).rejects.toThrow(/thread_id/);
    // Coded, as every refusal of runledger's: CONFIG for the graph, INVALID_INPUT for the id.
    const codes = await db.pool.query(`select run_id, error->>'code' as code from runledger.runs where run_id = any($1)`, [
      [plainRun.runId, badThread.runId],
    ]);
    expect(Object.fromEntries(codes.rows.map((r) => [r.run_id, r.code]))).toEqual({
      [plainRun.runId]: 'CONFIG',
      [badThread.runId]: 'INVALID_INPUT',
    });
  });
});

describe('RunledgerSaver on its own', () => {
  it('fromConnString and setup() as the official saver: a graph invoked without runledger checkpoints into runledger.graph_* and resumes from them', async () => {
    const saver = RunledgerSaver.fromConnString(db.url);
    try {
      await saver.setup();
      await saver.setup(); // again: nothing to do
      const graph = refundGraph(saver);
      const config = { configurable: { thread_id: 'standalone-1' } };
      const first = (await graph.invoke({ order: 's-1' }, config)) as { __interrupt__?: unknown[] };
      expect(first.__interrupt__).toHaveLength(1);
      const { Command } = await import('@langchain/langgraph');
      // A new saver and graph object (another process, in effect) resumes the thread from the tables.
      const again = refundGraph(RunledgerSaver.fromConnString(db.url));
      const done = await again.invoke(new Command({ resume: 'ok' }), config);
      expect(done).toMatchObject({ order: 's-1', amount: 42, decision: 'ok', shipped: true });
      await (again.checkpointer as RunledgerSaver).end();
      const thread = (
        await db.pool.query(`select checkpoints, latest_run_id from runledger.graph_threads where thread_id = 'standalone-1'`)
      ).rows[0];
      expect(thread.latest_run_id).toBeNull();
      expect(thread.checkpoints).toBeGreaterThanOrEqual(4);
      expect(ran.filter((r) => r.endsWith('s-1'))).toEqual(['price:s-1', 'ask:s-1', 'ship:s-1']);
    } finally {
      await saver.end();
    }
  });
});
