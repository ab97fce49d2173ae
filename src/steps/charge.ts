import type { Execution } from '../engine/run/execution.js';
import { addAmounts, BUDGET_DIMENSIONS, toSqlAmounts, type BudgetAmounts, type BudgetRemaining } from '../engine/core/budget.js';
import { budgetStateOf, type BudgetColumns } from '../engine/run/budget-state.js';
import { observeRunStatus, haltOnDbError } from '../engine/run/halts.js';

const CHARGE_NOW_SQL =
  'select run_status, budget, budget_spent, budget_limits, budget_used from runledger._charge_now(p_run_id => $1, p_token => $2, p_charge => $3::jsonb, p_step => $4, p_seq => $5)';

/**
 * ctx.chargeNow: the charge commits at once, in its own fenced write, with the step
 * position it was made at. Past a limit the run ends TERMINATED (BUDGET) right there and
 * the execution halts (the call never returns), so nothing after it runs. It works inside
 * a step's body too; a replayed step does not run its body, so it charges nothing again.
 * Known limit: a body charge made after the last recorded step by an execution that then
 * crashed before its next step started is charged again by the replay (charged twice, never lost).
 */
export async function chargeNow(exec: Execution, amount: BudgetAmounts): Promise<void> {
  const sql = toSqlAmounts(amount);
  if (sql === undefined) return;
  // In the workflow's body (not inside a step), a charge made before a position that is
  // already recorded was committed by the execution that recorded it (chargeNow commits
  // before the next step starts): a replay passing it charges nothing again.
  if (exec.activeSteps.length === 0 && exec.checkpoints[exec.stepsTaken] !== undefined) return;
  const seq = exec.activeSteps.at(-1) ?? exec.stepsTaken;
  let row: (BudgetColumns & { run_status: string }) | undefined;
  try {
    const result = await exec.deps.pool.query({
      name: 'runledger_charge_now',
      text: CHARGE_NOW_SQL,
      values: [exec.runId, exec.fencingToken.toString(), JSON.stringify(sql), 'chargeNow', seq],
    });
    row = result.rows[0];
  } catch (error) {
    haltOnDbError(exec, error, 'chargeNow');
    return exec.suspend();
  }
  if (!row) return exec.suspend();
  exec.budgetState = budgetStateOf(row);
  observeRunStatus(exec, row.run_status);
  if (exec.haltReason) return exec.suspend();
}

/** ctx.budget.remaining(): what is left per dimension, pending charges counted (null: no limit in that dimension). */
export function remainingBudget(exec: Execution): BudgetRemaining {
  const { limits, spent } = exec.budgetState;
  const used = addAmounts(spent, exec.pendingCharge);
  const out = {} as BudgetRemaining;
  for (const dim of BUDGET_DIMENSIONS) {
    const limit = limits[dim];
    out[dim] = limit === undefined ? null : Math.max(0, limit - (used[dim] ?? 0));
  }
  return out;
}
