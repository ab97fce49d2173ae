import type { Execution } from '../engine/run/execution.js';
import type { BudgetAmounts, BudgetRemaining } from '../engine/core/budget.js';

export function chargeNow(_exec: Execution, _amount: BudgetAmounts): Promise<void> {
  throw new Error('chargeNow: not built yet');
}

export function remainingBudget(_exec: Execution): BudgetRemaining {
  throw new Error('budget: not built yet');
}
