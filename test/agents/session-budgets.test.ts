import { beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import type { BudgetRemaining } from '../../src/index.js';
import { runCli } from '../helpers/cli.js';

/**
 * Session budgets (openSession(..., { budget }), sql/0021_session_budgets.sql): one budget
 * across every run that holds the session, each charge counted once; a run past the
 * session's remainder ends TERMINATED (BUDGET) naming the session; a release gives the run
 * its own limits back; the operator changes the budget from SQL. With real processes and a
 * SIGKILL: test/agents/session-crash.slow.test.ts.
 */
const t = useTestEngine();
const { db } = t;
const { workers } = stoppedAfterEach();

interface SpendInput {
  sessionId: string;
  /** Tokens to spend while holding the session, 10 per step. */
  tokens: number;
  budget?: unknown;
  /** Releases the session, then spends this many more tokens, 10 per step. */
  after?: number;
  /** Waits for this signal after the first step. */
  pause?: string;
}

let flows: ReturnType<typeof defineFlows>;
function defineFlows() {
  const spend = t.engine.workflow(
    { name: 'budget-spend', queue: 'session-budgets', limits: { budget: { tokens: 1_000 } } },
    async (ctx, input: SpendInput) => {
      const session = await ctx.session(input.sessionId, input.budget === undefined ? {} : { budget: input.budget as never });
      const remaining: BudgetRemaining[] = [ctx.budget.remaining()];
      for (let i = 0; i * 10 < input.tokens; i++) {
        await ctx.step(`spend-${i}`, () => ctx.charge({ tokens: 10 }));
        if (i === 0 && input.pause) await ctx.waitForSignal(input.pause);
      }
      if (input.after !== undefined) {
        await session.release();
        remaining.push(ctx.budget.remaining());
        for (let i = 0; i * 10 < input.after; i++) await ctx.step(`after-${i}`, () => ctx.charge({ tokens: 10 }));
      }
      return remaining.map((r) => r.tokens);
    },
  );
  return { spend };
}

beforeAll(() => {
  flows = defineFlows();
});

const worker = async () => {
  const w = await t.engine.runWorker({ queues: ['session-budgets'], concurrency: 2, pollIntervalMs: 50 });
  workers.push(w);
  return w;
};
const budgetRow = async (sessionId: string) =>
  (
    await db.pool.query('select budget, spent, remaining, exhausted, holder_run_id from runledger.session_budgets where session_id = $1', [
      sessionId,
    ])
  ).rows[0];
const runRow = async (runId: string) =>
  (
    await db.pool.query(
      'select status, termination_reason, termination_evidence, budget_limits, budget_used from runledger.runs where run_id = $1',
      [runId],
    )
  ).rows[0];

describe('session budgets', () => {
  it('spans the runs that hold the session: the second run stops when the session, not its own budget, is spent', async () => {
    await worker();
    const first = await t.engine.start(flows.spend, { sessionId: 'budget-a', tokens: 30, budget: { tokens: 50 } });
    // It sees the session's remainder as its own budget: 50 of the session, not its 1,000.
    await expect(first.result()).resolves.toEqual([50]);
    expect(await budgetRow('budget-a')).toEqual({
      budget: { tokens: 50 },
      spent: { tokens: 30 },
      remaining: { tokens: 20 },
      exhausted: false,
      holder_run_id: null,
    });
    // Opened without a budget: the session's still holds it.
    const second = await t.engine.start(flows.spend, { sessionId: 'budget-a', tokens: 30 });
    await waitFor('the second run stopped', async () => (await runRow(second.runId)).status === 'TERMINATED');
    const stopped = await runRow(second.runId);
    expect(stopped.termination_reason).toBe('BUDGET');
    // Its third step of 10 passed the 20 left: that charge is recorded and counted, as for a run's own budget.
    expect(stopped.termination_evidence).toMatchObject({
      dimension: 'tokens',
      limit: 20,
      spent: 30,
      charge: 10,
      step: 'spend-2',
      session: { session_id: 'budget-a', budget: 50, spent_before: 30 },
    });
    // Its end let go of the session: its own limit is back (what a retry_run would go on under).
    expect(stopped.budget_limits).toEqual({ tokens: 1000 });
    expect(await budgetRow('budget-a')).toMatchObject({
      spent: { tokens: 60 },
      remaining: { tokens: 0 },
      exhausted: true,
      holder_run_id: null,
    });
    // runledger session shows it, as text and as JSON.
    const text = await runCli(db.url, ['session', 'budget-a']);
    expect(text.stdout).toContain('budget      tokens 60 of 50 (0 left), used up');
    const json = JSON.parse((await runCli(db.url, ['session', 'budget-a', '--json'])).stdout);
    expect(json.budget).toEqual({ limits: { tokens: 50 }, spent: { tokens: 60 }, remaining: { tokens: 0 }, exhausted: true });
    // A third run can take the session but spend nothing.
    const third = await t.engine.start(flows.spend, { sessionId: 'budget-a', tokens: 10 });
    await waitFor('the third run stopped', async () => (await runRow(third.runId)).status === 'TERMINATED');
    expect((await runRow(third.runId)).termination_evidence).toMatchObject({ limit: 0, step: 'spend-0', session: { spent_before: 60 } });
  });

  it('a run that releases the session gets its own limits back; the session counts only what it charged while holding it', async () => {
    await worker();
    const run = await t.engine.start(flows.spend, { sessionId: 'budget-b', tokens: 10, budget: { tokens: 20 }, after: 50 });
    // ctx.budget.remaining(): 20 while holding (the session's), 990 after the release (its own 1,000 less 10).
    await expect(run.result()).resolves.toEqual([20, 990]);
    expect((await runRow(run.runId)).budget_limits).toEqual({ tokens: 1000 });
    expect((await runRow(run.runId)).budget_used).toEqual({ tokens: 60 });
    expect(await budgetRow('budget-b')).toMatchObject({ spent: { tokens: 10 }, remaining: { tokens: 10 }, holder_run_id: null });
  });

  it('set_session_budget changes the budget while a run holds the session: the run is held to the new remainder at once', async () => {
    await worker();
    const run = await t.engine.start(flows.spend, { sessionId: 'budget-c', tokens: 60, budget: { tokens: 20 }, pause: 'go' });
    await waitFor('the run waiting with the session', async () => (await runRow(run.runId)).status === 'WAITING');
    expect((await runRow(run.runId)).budget_limits).toEqual({ tokens: 20 });
    expect(await budgetRow('budget-c')).toMatchObject({ spent: { tokens: 10 }, holder_run_id: run.runId });
    const set = await db.pool.query(`select budget_limits, budget_used from runledger.set_session_budget('budget-c', '{"tokens": 100}')`);
    expect(set.rows[0]).toEqual({ budget_limits: { tokens: 100 }, budget_used: { tokens: 10 } });
    // Its cap: the 10 it has spent plus the 90 the session has left.
    expect((await runRow(run.runId)).budget_limits).toEqual({ tokens: 100 });
    expect(await budgetRow('budget-c')).toMatchObject({ spent: { tokens: 10 }, remaining: { tokens: 90 } });
    const audit = await db.pool.query(
      `select run_id, target, arguments, result from runledger.audit_log where action = 'set_session_budget'`,
    );
    expect(audit.rows).toEqual([
      {
        run_id: run.runId,
        target: 'budget-c',
        arguments: { budget: { tokens: 100 } },
        result: { budget_limits: { tokens: 100 }, budget_used: { tokens: 10 } },
      },
    ]);
    await t.engine.signal(run.runId, 'go');
    // Resumed after its wait, the run is claimed with its new cap: 100 less the 10 it spent.
    await expect(run.result()).resolves.toEqual([90]);
    expect(await budgetRow('budget-c')).toMatchObject({ spent: { tokens: 60 }, remaining: { tokens: 40 }, holder_run_id: null });
    // null removes the budget; what was spent stays on record.
    await db.pool.query(`select runledger.set_session_budget('budget-c', null)`);
    expect(await budgetRow('budget-c')).toMatchObject({ budget: null, spent: { tokens: 60 }, exhausted: false });
  });

  it("a session's budget is its tenant's: another tenant's session of the same id is not bound by it", async () => {
    await worker();
    const acme = await t.engine.start(flows.spend, { sessionId: 'budget-t', tokens: 20, budget: { tokens: 10 } }, { tenantId: 'acme' });
    const beta = await t.engine.start(flows.spend, { sessionId: 'budget-t', tokens: 20 }, { tenantId: 'beta' });
    // Its own 1,000, not acme's 10.
    await expect(beta.result()).resolves.toEqual([1000]);
    await waitFor('acme stopped', async () => (await runRow(acme.runId)).status === 'TERMINATED');
    const rows = await db.pool.query(`select tenant_id, budget, spent from runledger.session_budgets where session_id = 'budget-t'`);
    expect(rows.rows).toEqual([{ tenant_id: 'acme', budget: { tokens: 10 }, spent: { tokens: 20 } }]);
  });

  it('a bad budget is refused with a code and changes nothing', async () => {
    await worker();
    const bad = await t.engine.start(flows.spend, { sessionId: 'budget-d', tokens: 10, budget: { tokens: -1 } });
    await expect(bad.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect((await db.pool.query(`select error->>'code' as code from runledger.runs where run_id = $1`, [bad.runId])).rows[0].code).toBe(
      'CONFIG',
    );
    expect(await db.pool.query(`select 1 from runledger.sessions where session_id = 'budget-d'`)).toMatchObject({ rowCount: 0 });
    for (const budget of ['{"tokens": -1}', '{"dollars": 5}', '[1]', '{"tokens": "5"}']) {
      await expect(db.pool.query(`select runledger.set_session_budget('budget-d', $1::jsonb)`, [budget])).rejects.toMatchObject({
        code: 'RL003',
      });
    }
    expect(await db.pool.query(`select 1 from runledger.sessions where session_id = 'budget-d'`)).toMatchObject({ rowCount: 0 });
  });
});
