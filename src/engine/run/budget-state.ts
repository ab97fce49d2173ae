import { fromSqlAmounts } from '../core/budget.js';
import type { BudgetState } from './execution.js';

/** The budget columns a claim returns (runledger._claim_batch, _start_claimed, _charge_now). */
export interface BudgetColumns {
  budget: string | number | null;
  budget_spent: string | number;
  budget_limits: Record<string, unknown> | null;
  budget_used: Record<string, unknown> | null;
}

/** Limits and spending per dimension from a run's budget columns (units from budget / budget_spent). */
export function budgetStateOf(row: BudgetColumns): BudgetState {
  const limits = fromSqlAmounts(row.budget_limits);
  if (row.budget !== null) limits.units = Number(row.budget);
  const spent = fromSqlAmounts(row.budget_used);
  spent.units = Number(row.budget_spent);
  return { limits, spent };
}
