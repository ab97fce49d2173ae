import { afterEach, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { TicketService } from '../helpers/ticket-service.js';
import { defineSessionWorkflows } from '../fixtures/session-workflows.js';

/**
 * Fault scenario 9 of the agent runtime document, with real processes: a tool succeeded
 * (an external call through the operation ledger), the append of its result to the
 * session did not happen or was not heard, the worker process was SIGKILLed. The next
 * worker finishes the run: the external service was called once and the session holds
 * the result once. A second run on the same session waits all along.
 */
let service: TicketService;
const t = useTestEngine({
  prepare: async () => {
    service = await TicketService.start();
    return () => service.stop();
  },
});
const { db } = t;
let flows: ReturnType<typeof defineSessionWorkflows>;

beforeAll(() => {
  flows = defineSessionWorkflows(t.engine, service.url);
});

const { processes: spawned } = stoppedAfterEach();
afterEach(() => {
  service.calls.clear();
  service.tickets.clear();
});

const SCRIPT = new URL('../fixtures/session-worker.ts', import.meta.url).pathname;

async function worker(failpoint?: string, leaseMs = 1000): Promise<WorkerProcess> {
  const w = await spawnWorker(
    {
      DATABASE_URL: db.url,
      SERVICE_URL: service.url,
      LEASE_MS: String(leaseMs),
      ...(failpoint ? { RUNLEDGER_FAILPOINTS: failpoint } : {}),
    },
    SCRIPT,
  );
  spawned.push(w);
  onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
  return w;
}

const entries = async (sessionId: string) =>
  (
    await db.pool.query<{ seq: number; role: string; content: any; run_id: string }>(
      'select seq, role, content, run_id from runledger.session_history($1)',
      [sessionId],
    )
  ).rows;
const holder = async (sessionId: string) =>
  (await db.pool.query('select holder_run_id, waiting_run_ids from runledger.session_list where session_id = $1', [sessionId])).rows[0];
const runRow = async (runId: string) =>
  (await db.pool.query('select status, recovery_attempts from runledger.runs where run_id = $1', [runId])).rows[0];
const steps = async (runId: string) =>
  (
    await db.pool.query<{ name: string; kind: string; status: string }>(
      'select name, kind, status from runledger.steps where run_id = $1 order by seq',
      [runId],
    )
  ).rows;

/** Both runs finished: the one that crashed and the follower that waited for the session. */
async function finishBoth(first: string, second: string) {
  await worker();
  for (const runId of [first, second]) {
    await waitFor(`run ${runId} finished`, async () => (await runRow(runId)).status === 'SUCCEEDED');
  }
}

describe('fault scenario 9: SIGKILL between a tool call and the append of its result', () => {
  it('after the call returned, before its checkpoint: reconciled, not called again; one entry', async () => {
    const sessionId = 'crash-call';
    const key = 'ticket-crash-call';
    const run = await t.engine.start(flows.ticketAgent, { sessionId, key });
    // A lease long enough that the next worker claims the follower (which finds the session held
    // and waits) before its sweep can recover the crashed run, however slow the machine.
    const doomed = await worker('after-call:open-ticket', 8000);
    expect((await doomed.exited).signal).toBe('SIGKILL');
    // The service acted; nothing of it is recorded; the session is still the crashed run's.
    expect(service.calls.get(key)).toBe(1);
    expect(await entries(sessionId)).toEqual([]);
    expect((await steps(run.runId)).map((s) => s.name)).toEqual([`session:${sessionId}:open`]);
    const follower = await t.engine.start(flows.follower, { sessionId });

    await finishBoth(run.runId, follower.runId);
    expect(service.calls.get(key)).toBe(1);
    expect(await run.result()).toEqual({ id: 'T-1' });
    const history = await entries(sessionId);
    expect(history.map((e) => [e.seq, e.role, e.run_id])).toEqual([
      [1, 'tool', run.runId],
      [2, 'user', follower.runId],
    ]);
    expect(history[0]!.content).toEqual({ tool: 'open-ticket', key, result: { id: 'T-1' } });
    expect(history[1]!.content).toEqual({ follower: true, saw: 1 });
    // The follower found the session held by the crashed run and waited for the hand-off.
    expect((await steps(follower.runId)).map((s) => [s.name, s.kind])).toEqual([
      [`session:${sessionId}:open`, 'transaction'],
      [`session:${sessionId}:wait`, 'signal'],
      [`session:${sessionId}:open`, 'transaction'],
      [`session:${sessionId}:append`, 'transaction'],
    ]);
    expect((await runRow(run.runId)).recovery_attempts).toBeGreaterThanOrEqual(1);
    expect(await holder(sessionId)).toEqual({ holder_run_id: null, waiting_run_ids: [] });
  });

  it("after the tool's checkpoint, before the append commits: the append runs again, once", async () => {
    const sessionId = 'crash-append';
    const key = 'ticket-crash-append';
    const run = await t.engine.start(flows.ticketAgent, { sessionId, key });
    const doomed = await worker(`before-checkpoint:session:${sessionId}:append`);
    expect((await doomed.exited).signal).toBe('SIGKILL');
    // The tool's outcome is checkpointed; the append's transaction died with the process.
    expect(await steps(run.runId)).toEqual([
      { name: `session:${sessionId}:open`, kind: 'transaction', status: 'SUCCEEDED' },
      { name: 'open-ticket', kind: 'operation', status: 'SUCCEEDED' },
    ]);
    expect(await entries(sessionId)).toEqual([]);
    const follower = await t.engine.start(flows.follower, { sessionId });

    await finishBoth(run.runId, follower.runId);
    expect(service.calls.get(key)).toBe(1);
    const history = await entries(sessionId);
    expect(history.map((e) => [e.role, e.run_id])).toEqual([
      ['tool', run.runId],
      ['user', follower.runId],
    ]);
    expect(history.filter((e) => e.content?.key === key)).toHaveLength(1);
  });

  it('after the append committed, before the worker heard: replayed from its checkpoint, not appended twice', async () => {
    const sessionId = 'crash-commit';
    const key = 'ticket-crash-commit';
    const run = await t.engine.start(flows.ticketAgent, { sessionId, key });
    const doomed = await worker(`after-commit:session:${sessionId}:append`);
    expect((await doomed.exited).signal).toBe('SIGKILL');
    expect(await entries(sessionId)).toHaveLength(1);
    const follower = await t.engine.start(flows.follower, { sessionId });

    await finishBoth(run.runId, follower.runId);
    expect(service.calls.get(key)).toBe(1);
    expect((await entries(sessionId)).map((e) => [e.role, e.run_id])).toEqual([
      ['tool', run.runId],
      ['user', follower.runId],
    ]);
    const appends = (await steps(run.runId)).filter((s) => s.name === `session:${sessionId}:append`);
    expect(appends).toEqual([{ name: `session:${sessionId}:append`, kind: 'transaction', status: 'SUCCEEDED' }]);
  });
});

describe('a session budget across a SIGKILL', () => {
  it("killed after a charged step's checkpoint committed: the next worker replays it; the session counts each charge once", async () => {
    const sessionId = 'crash-budget';
    const run = await t.engine.start(flows.spender, { sessionId, tokens: 50, budget: 100 });
    // Killed once its first plain step (spend-0, with its charge) has committed, before it heard so.
    const doomed = await worker('after-group-commit:single');
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const budget = async () =>
      (await db.pool.query('select spent, remaining, holder_run_id from runledger.session_budgets where session_id = $1', [sessionId]))
        .rows[0];
    // At the kill: the session held, spend-0's charge committed.
    expect(await budget()).toEqual({ spent: { tokens: 10 }, remaining: { tokens: 90 }, holder_run_id: run.runId });
    await worker();
    await waitFor('the run finished', async () => (await runRow(run.runId)).status === 'SUCCEEDED');
    expect(await runRow(run.runId)).toEqual({ status: 'SUCCEEDED', recovery_attempts: 1 });
    expect(await budget()).toEqual({ spent: { tokens: 50 }, remaining: { tokens: 50 }, holder_run_id: null });
    // The next run has the 50 left: its sixth step of 10 passes it.
    const next = await t.engine.start(flows.spender, { sessionId, tokens: 100 });
    await waitFor('the next run stopped', async () => (await runRow(next.runId)).status === 'TERMINATED');
    const evidence = (await db.pool.query('select termination_evidence from runledger.runs where run_id = $1', [next.runId])).rows[0]
      .termination_evidence;
    expect(evidence).toMatchObject({ dimension: 'tokens', limit: 50, spent: 60, step: 'spend-5', session: { spent_before: 50 } });
    expect(await budget()).toEqual({ spent: { tokens: 110 }, remaining: { tokens: 0 }, holder_run_id: null });
  });
});
