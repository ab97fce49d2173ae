import type { Execution } from '../engine/run/execution.js';
import {
  addAmounts,
  BUDGET_DIMENSIONS,
  fromSqlAmounts,
  toSqlAmounts,
  type BudgetAmounts,
  type BudgetRemaining,
} from '../engine/core/budget.js';
import { observeRunStatus, haltOnDbError } from '../engine/run/halts.js';

interface BudgetRow {
  run_status: string;
  budget: string | null;
  budget_spent: string;
  budget_limits: Record<string, unknown> | null;
  budget_used: Record<string, unknown> | null;
}

const CHARGE_NOW_SQL =
  'select run_status, budget, budget_spent, budget_limits, budget_used from runledger._charge_now($1, $2, $3::jsonb, $4, $5)';

/**
 * ctx.chargeNow: the charge commits at once, in its own fenced write, with the step
 * position it was made at. Past a limit the run ends TERMINATED (BUDGET) right there and
 * the execution halts (the call never returns), so nothing after it runs.
 */
export async function chargeNow(exec: Execution, amount: BudgetAmounts): Promise<void> {
  const sql = toSqlAmounts(amount);
  if (sql === undefined && exec.budgetState) return;
  const step = exec.activeSteps.at(-1) ?? exec.stepsTaken;
  const row = await query(exec, sql === undefined ? null : JSON.stringify(sql), step);
  if (!row) return exec.suspend();
  exec.budgetState = stateOf(row);
  observeRunStatus(exec, row.run_status);
  if (exec.haltReason) return exec.suspend();
}

/** ctx.budget.remaining(): what is left per dimension, pending charges counted; loads the run's budgets once per execution. */
export async function remainingBudget(exec: Execution): Promise<BudgetRemaining> {
  if (!exec.budgetState) {
    const row = await query(exec, null, exec.stepsTaken);
    if (!row) return exec.suspend();
    exec.budgetState = stateOf(row);
  }
  const { limits, spent } = exec.budgetState;
  const used = addAmounts(spent, exec.pendingCharge);
  const out = {} as BudgetRemaining;
  for (const dim of BUDGET_DIMENSIONS) {
    const limit = limits[dim];
    out[dim] = limit === undefined ? null : Math.max(0, limit - (used[dim] ?? 0));
  }
  return out;
}

async function query(exec: Execution, chargeJson: string | null, seq: number): Promise<BudgetRow | undefined> {
  try {
    const result = await exec.deps.pool.query<BudgetRow>({
      name: 'runledger_charge_now',
      text: CHARGE_NOW_SQL,
      values: [exec.runId, exec.fencingToken.toString(), chargeJson, 'chargeNow', seq],
    });
    return result.rows[0];
  } catch (error) {
    haltOnDbError(exec, error, 'chargeNow');
    return undefined;
  }
}

function stateOf(row: BudgetRow): { limits: BudgetAmounts; spent: BudgetAmounts } {
  const limits = fromSqlAmounts(row.budget_limits);
  if (row.budget !== null) limits.units = Number(row.budget);
  const spent = fromSqlAmounts(row.budget_used);
  spent.units = Number(row.budget_spent);
  return { limits, spent };
}
