import { beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { defineGraphWorkflows, NODE_RUNS_TABLE } from '../fixtures/graph-workflows.js';
import { graphResumeTopic } from '../../src/langgraph/index.js';

/**
 * runGraph under SIGKILL, with real worker processes: killed mid-graph (inside a node, after
 * the nodes before it had their writes recorded) and while the thread waits on an interrupt.
 * The thread resumes on another worker without being asked; no node whose writes were
 * recorded runs again; the interrupt is answered once.
 */
const t = useTestEngine({ prepare: async (db) => void (await db.pool.query(NODE_RUNS_TABLE)) });
const { db } = t;
let flows: ReturnType<typeof defineGraphWorkflows>;
beforeAll(() => {
  flows = defineGraphWorkflows(t.engine, db.pool);
});
const { processes: spawned } = stoppedAfterEach();

const SCRIPT = new URL('../fixtures/graph-worker.ts', import.meta.url).pathname;
async function worker(killIn?: string): Promise<WorkerProcess> {
  const w = await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '1000', ...(killIn ? { KILL_IN_NODE: killIn } : {}) }, SCRIPT);
  spawned.push(w);
  onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
  return w;
}
const nodeRuns = async (thread: string) =>
  (await db.pool.query<{ node: string; pid: number }>('select node, pid from node_runs where thread_id = $1 order by at', [thread])).rows;
const status = async (runId: string) => (await t.engine.getRun(runId))?.status;

describe('runGraph, SIGKILLed', () => {
  it('killed inside a node: the next worker resumes the thread from its last checkpoint; the nodes before it do not run again', async () => {
    const first = await worker('work');
    const { runId } = await t.engine.start(flows.graphRun, { thread: 'crash-mid' });
    expect((await first.exited).signal).toBe('SIGKILL');
    const second = await worker();
    await waitFor('the thread to reach its interrupt on the second worker', async () => (await status(runId)) === 'WAITING', 60_000);
    await t.engine.signal(runId, graphResumeTopic('crash-mid'), 'yes');
    await waitFor('the run to finish', async () => (await status(runId)) === 'SUCCEEDED', 60_000);
    const runs = await nodeRuns('crash-mid');
    // plan ran once (its writes were recorded before the kill); work ran on both workers (it died inside it).
    expect(runs.filter((r) => r.node === 'plan')).toEqual([{ node: 'plan', pid: first.pid }]);
    expect(runs.filter((r) => r.node === 'work').map((r) => r.pid)).toEqual([first.pid, second.pid]);
    expect(runs.filter((r) => r.node === 'finish')).toEqual([{ node: 'finish', pid: second.pid }]);
    const run = await t.engine.getRun(runId);
    expect(run?.output).toMatchObject({ output: { steps: ['plan', 'work', 'ask', 'finish'], answer: 'yes' } });
    expect(run?.recoveryAttempts).toBe(1);
  });

  it('killed while the thread waits on its interrupt: another worker takes the answer; the interrupt is answered once', async () => {
    const first = await worker();
    const { runId } = await t.engine.start(flows.graphRun, { thread: 'crash-waiting' });
    await waitFor('the interrupt', async () => (await status(runId)) === 'WAITING', 60_000);
    first.kill('SIGKILL');
    await first.exited;
    const second = await worker();
    expect(await t.engine.signal(runId, graphResumeTopic('crash-waiting'), 'answer-1')).toBe(true);
    await waitFor('the run to finish', async () => (await status(runId)) === 'SUCCEEDED', 60_000);
    const runs = await nodeRuns('crash-waiting');
    expect(runs.map((r) => r.node)).toEqual(['plan', 'work', 'ask', 'finish']);
    expect(runs.filter((r) => r.node === 'finish')).toEqual([{ node: 'finish', pid: second.pid }]);
    const run = await t.engine.getRun(runId);
    expect(run?.output).toMatchObject({ output: { answer: 'answer-1' }, interrupts: [{ resume: 'answer-1' }] });
    // A second answer finds no one waiting: the signal is stored, never applied.
    const consumed = (
      await db.pool.query(`select count(*)::int as n from runledger.steps where run_id = $1 and name like 'graph:interrupt:%'`, [runId])
    ).rows[0];
    expect(consumed.n).toBe(1);
  });
});
