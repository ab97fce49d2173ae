import type { LanguageModelV4Usage } from '@ai-sdk/provider';
import type { WorkflowContext } from '../agents/index.js';
import type { BudgetAmounts } from '../index.js';

/** What a call's usage charges to the run's budgets: its tokens, and its cost when the caller prices it. */
export function chargeOf(usage: LanguageModelV4Usage | undefined, costUsd?: (usage: LanguageModelV4Usage) => number): BudgetAmounts {
  const tokens = (usage?.inputTokens?.total ?? 0) + (usage?.outputTokens?.total ?? 0);
  const cost = usage && costUsd ? costUsd(usage) : 0;
  return { ...(tokens > 0 ? { tokens } : {}), ...(cost > 0 ? { costUsd: cost } : {}) };
}

export async function chargeUsage(ctx: WorkflowContext, amounts: BudgetAmounts): Promise<void> {
  if ((amounts.tokens ?? 0) > 0 || (amounts.costUsd ?? 0) > 0) await ctx.chargeNow(amounts);
}

/**
 * The output cap a call is sent with: the caller's own `maxOutputTokens`, lowered to what
 * the run's token budget leaves (at least 1: providers refuse 0), never raised.
 */
export function cappedOutputTokens(ctx: WorkflowContext, own: number | undefined): number | undefined {
  const remaining = ctx.budget.remaining().tokens;
  if (remaining === null || remaining === undefined) return own;
  const fromBudget = Math.max(1, Math.floor(remaining));
  return own === undefined ? fromBudget : Math.min(own, fromBudget);
}
