import { ConfigError } from './errors.js';

/**
 * Budget dimensions. `units` is the plain number of `limits.budget: 1000` and
 * `ctx.charge(12)`; the others are what an agent spends. In SQL (runs.budget_limits,
 * runs.budget_used, charges) the names are snake_case: units, tokens, cost_usd,
 * tool_calls, turns.
 */
export const BUDGET_DIMENSIONS = ['units', 'tokens', 'costUsd', 'toolCalls', 'turns'] as const;
export type BudgetDimension = (typeof BUDGET_DIMENSIONS)[number];

/** An amount per dimension: a charge, a limit, what was spent or what remains. */
export type BudgetAmounts = Partial<Record<BudgetDimension, number>>;

/** What is left per dimension that has a limit (null: no limit in that dimension). */
export type BudgetRemaining = Record<BudgetDimension, number | null>;

export const SQL_DIMENSION: Record<BudgetDimension, string> = {
  units: 'units',
  tokens: 'tokens',
  costUsd: 'cost_usd',
  toolCalls: 'tool_calls',
  turns: 'turns',
};
export const TS_DIMENSION: Record<string, BudgetDimension> = Object.fromEntries(
  Object.entries(SQL_DIMENSION).map(([ts, sql]) => [sql, ts as BudgetDimension]),
) as Record<string, BudgetDimension>;

/**
 * Validates an amount per dimension (a charge or a limit): each a finite number >= 0 of a
 * known dimension. A bare number is `{ units: n }`. ConfigError (code CONFIG) otherwise.
 */
export function toBudgetAmounts(value: unknown, what: string): BudgetAmounts {
  if (typeof value === 'number') value = { units: value };
  if (value === null || typeof value !== 'object' || Array.isArray(value)) {
    throw new ConfigError(`${what}: ${JSON.stringify(value)} is neither a number nor an object of budget dimensions`);
  }
  const out: BudgetAmounts = {};
  for (const [key, amount] of Object.entries(value as Record<string, unknown>)) {
    if (!(BUDGET_DIMENSIONS as readonly string[]).includes(key)) {
      throw new ConfigError(`${what}: unknown budget dimension ${JSON.stringify(key)} (known: ${BUDGET_DIMENSIONS.join(', ')})`);
    }
    if (amount === undefined) continue;
    if (typeof amount !== 'number' || !Number.isFinite(amount) || amount < 0) {
      throw new ConfigError(`${what}: ${key} must be a number >= 0, not ${JSON.stringify(amount)}`);
    }
    out[key as BudgetDimension] = amount;
  }
  return out;
}

/** The SQL (snake_case) form of an amount, without zero entries; undefined when nothing is left. */
export function toSqlAmounts(amounts: BudgetAmounts): Record<string, number> | undefined {
  let out: Record<string, number> | undefined;
  for (const dim of BUDGET_DIMENSIONS) {
    const amount = amounts[dim];
    if (amount) (out ??= {})[SQL_DIMENSION[dim]] = amount;
  }
  return out;
}

/** The SQL form of limits: like toSqlAmounts, but a limit of 0 is kept (nothing may be spent). */
export function toSqlLimits(amounts: BudgetAmounts): Record<string, number> {
  const out: Record<string, number> = {};
  for (const dim of BUDGET_DIMENSIONS) if (amounts[dim] !== undefined) out[SQL_DIMENSION[dim]] = amounts[dim]!;
  return out;
}

/** The TypeScript form of an SQL amount object. */
export function fromSqlAmounts(amounts: Record<string, unknown> | null | undefined): BudgetAmounts {
  const out: BudgetAmounts = {};
  for (const [key, amount] of Object.entries(amounts ?? {})) {
    const dim = TS_DIMENSION[key];
    if (dim !== undefined) out[dim] = Number(amount);
  }
  return out;
}

/** a - b per dimension, never below 0; what rounds to 0 is dropped (a costUsd residue of float arithmetic). */
export function subtractAmounts(a: BudgetAmounts, b: BudgetAmounts): BudgetAmounts {
  const out: BudgetAmounts = {};
  for (const dim of BUDGET_DIMENSIONS) {
    const left = (a[dim] ?? 0) - (b[dim] ?? 0);
    if (left > 1e-12) out[dim] = left;
  }
  return out;
}

export function addAmounts(a: BudgetAmounts, b: BudgetAmounts): BudgetAmounts {
  const out: BudgetAmounts = { ...a };
  for (const dim of BUDGET_DIMENSIONS) if (b[dim]) out[dim] = (out[dim] ?? 0) + b[dim]!;
  return out;
}
