import { describe, expect, it } from 'vitest';
import type { BudgetRemaining } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';

/** Budgets in several dimensions: each stops the run with evidence naming it; chargeNow commits at once. */
const t = useTestEngine({
  prepare: async (db) => {
    await db.pool.query('create table calls (run_id text, step text)');
  },
});
const { db } = t;
const worker = queueWorkers(() => t.engine, 'budgets');
const runRow = async (runId: string) => (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
const calls = async (runId: string) =>
  (await db.pool.query('select step from calls where run_id = $1', [runId])).rows.map((r) => r.step as string);

describe('budgets in several dimensions', () => {
  const cases = [
    { dim: 'tokens', sql: 'tokens', limit: 250, each: 100 },
    { dim: 'costUsd', sql: 'cost_usd', limit: 0.05, each: 0.02 },
    { dim: 'toolCalls', sql: 'tool_calls', limit: 2, each: 1 },
    { dim: 'turns', sql: 'turns', limit: 3, each: 1 },
  ] as const;
  for (const c of cases) {
    it(`${c.dim}: the write that passes the limit ends the run TERMINATED (BUDGET) naming the dimension; nothing after it runs`, async () => {
      const wf = t.engine.workflow({ name: `spend-${c.dim}`, queue: 'budgets', limits: { budget: { [c.dim]: c.limit } } }, async (ctx) => {
        for (let i = 0; i < 10; i++) {
          await ctx.chargeNow({ [c.dim]: c.each });
          await ctx.step(`work-${i}`, async () => {
            await db.pool.query('insert into calls values ($1, $2)', [ctx.runId, `work-${i}`]);
          });
        }
        return 'never';
      });
      await worker();
      const handle = await t.engine.start(wf, undefined);
      await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'BUDGET' } });
      const run = await runRow(handle.runId);
      const within = Math.floor(c.limit / c.each + 1e-9);
      expect(run.status).toBe('TERMINATED');
      expect(run.termination_evidence).toMatchObject({ dimension: c.sql, limit: c.limit, step: 'chargeNow' });
      expect(Number(run.termination_evidence.spent)).toBeCloseTo(c.each * (within + 1));
      expect(Number(run.budget_used[c.sql])).toBeCloseTo(c.each * (within + 1));
      // The charge that passed the limit stopped the run before the step after it.
      expect(await calls(handle.runId)).toHaveLength(within);
    });
  }

  it('ctx.charge with dimensions commits with the next checkpoint and counts in remaining()', async () => {
    const seen: BudgetRemaining[] = [];
    const wf = t.engine.workflow(
      { name: 'pending-dims', queue: 'budgets', limits: { budget: { units: 10, tokens: 1000, costUsd: 1 } } },
      async (ctx) => {
        seen.push(ctx.budget.remaining());
        await ctx.step('model', () => {
          ctx.charge({ tokens: 300, costUsd: 0.25, units: 2 });
          return 'ok';
        });
        seen.push(ctx.budget.remaining());
        ctx.charge({ tokens: 100 });
        seen.push(ctx.budget.remaining());
        await ctx.step('after', () => 'ok');
        return 'done';
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('done');
    expect(seen[0]).toEqual({ units: 10, tokens: 1000, costUsd: 1, toolCalls: null, turns: null });
    expect(seen[1]).toEqual({ units: 8, tokens: 700, costUsd: 0.75, toolCalls: null, turns: null });
    expect(seen[2]).toMatchObject({ tokens: 600 });
    const run = await runRow(handle.runId);
    expect(Number(run.budget_spent)).toBe(2);
    expect(run.budget_used).toEqual({ tokens: 400, cost_usd: 0.25 });
    expect(run.termination_evidence).toMatchObject({ budget_spent: 2, budget_used: { tokens: 400, cost_usd: 0.25 } });
    const record = await t.engine.getRun(handle.runId);
    expect(record?.budgetLimits).toEqual({ tokens: 1000, costUsd: 1 });
    expect(record?.budgetUsed).toEqual({ tokens: 400, costUsd: 0.25 });
  });

  it('a per-run budget object overrides the workflow budget, and start_run takes one from SQL', async () => {
    const wf = t.engine.workflow({ name: 'override-dims', queue: 'budgets', limits: { budget: { tokens: 10 } } }, async (ctx) => {
      await ctx.chargeNow({ tokens: 50 });
      return 'spent';
    });
    await worker();
    await expect((await t.engine.start(wf, undefined, { budget: { tokens: 100 } })).result()).resolves.toBe('spent');
    const { rows } = await db.pool.query(
      `select runledger.start_run('override-dims', 'null', '{"budget": {"tokens": 20, "turns": 1}}') as run_id`,
    );
    const row = await runRow(rows[0].run_id);
    expect(row.budget_limits).toEqual({ tokens: 20, turns: 1 });
    await expect(t.engine.handle(rows[0].run_id).result()).rejects.toMatchObject({ details: { terminationReason: 'BUDGET' } });
  });

  it('bad budgets and charges are refused with a coded error, nothing stored', async () => {
    await expect(db.pool.query(`select runledger.start_run('override-dims', 'null', '{"budget": {"tokenz": 20}}')`)).rejects.toMatchObject({
      code: 'RL003',
      message: expect.stringContaining('unknown dimension'),
    });
    await expect(db.pool.query(`select runledger.start_run('override-dims', 'null', '{"budget": {"tokens": -1}}')`)).rejects.toMatchObject({
      code: 'RL003',
    });
    expect(() => t.engine.workflow({ name: 'bad-dims', limits: { budget: { tokenz: 1 } as never } }, async () => 1)).toThrow(
      expect.objectContaining({ code: 'CONFIG' }),
    );
    const errors: unknown[] = [];
    const wf = t.engine.workflow({ name: 'bad-charge', queue: 'budgets' }, async (ctx) => {
      try {
        ctx.charge({ dollars: 1 } as never);
      } catch (error) {
        errors.push(error);
      }
      try {
        await ctx.chargeNow({ tokens: -5 });
      } catch (error) {
        errors.push(error);
      }
      return 'ok';
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('ok');
    expect(errors).toEqual([
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('unknown budget dimension "dollars"') }),
      expect.objectContaining({ code: 'CONFIG', message: expect.stringContaining('tokens must be a number >= 0') }),
    ]);
    expect((await runRow(handle.runId)).budget_used).toBeNull();
  });
});

describe('chargeNow in the workflow body across replays', () => {
  it('a charge before a recorded position is not charged again when the run replays after a durable wait', async () => {
    const wf = t.engine.workflow({ name: 'turns-replay', queue: 'budgets', limits: { budget: { turns: 5 } } }, async (ctx) => {
      for (let turn = 0; turn < 3; turn++) {
        await ctx.chargeNow({ turns: 1 });
        await ctx.step(`turn-${turn}`, () => turn);
        // Each wait parks the run; the next execution replays the turns before it.
        await ctx.sleep(`pause-${turn}`, 1);
      }
      return 'done';
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toBe('done');
    const run = await runRow(handle.runId);
    expect(run.budget_used).toEqual({ turns: 3 });
    const claims = await db.pool.query(`select count(*)::int as n from runledger.events where run_id = $1 and kind = 'claimed'`, [
      handle.runId,
    ]);
    expect(claims.rows[0].n).toBeGreaterThanOrEqual(3); // it really replayed
  });
});

describe('charges of concurrent steps', () => {
  it('each commits once: none lost to another step whose checkpoint was on its way, none sent twice', async () => {
    const wf = t.engine.workflow({ name: 'concurrent-charges', queue: 'budgets', limits: { budget: { toolCalls: 100 } } }, async (ctx) => {
      // Staggered bodies: each charges while the checkpoints of the ones before are in flight.
      await Promise.all(
        Array.from({ length: 8 }, (_, i) =>
          ctx.step(`call-${i}`, async () => {
            await new Promise((resolve) => setTimeout(resolve, 5 * i));
            ctx.charge({ toolCalls: 1, tokens: 10 });
            await new Promise((resolve) => setTimeout(resolve, 5));
            return i;
          }),
        ),
      );
      return ctx.budget.remaining();
    });
    await worker();
    const handle = await t.engine.start(wf, undefined);
    const remaining = await handle.result();
    const run = await runRow(handle.runId);
    expect(run.budget_used).toEqual({ tool_calls: 8, tokens: 80 });
    expect(remaining).toMatchObject({ toolCalls: 92 });
  });
});
