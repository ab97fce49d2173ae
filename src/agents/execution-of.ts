import { StepContext } from '../steps/context.js';
import type { Execution } from '../engine/run/execution.js';

/**
 * The execution behind a ctx, for the agent layer's helpers that take a ctx (storeLarge,
 * loadLarge): StepContext keeps it protected so that workflow code does not reach it;
 * a subclass may read it, and this one exists only to do so.
 */
class ExecutionAccess extends StepContext {
  static of(ctx: StepContext): Execution {
    return (ctx as ExecutionAccess).execution;
  }
}

export function executionOf(ctxOrExec: StepContext | Execution): Execution {
  return ctxOrExec instanceof StepContext ? ExecutionAccess.of(ctxOrExec) : ctxOrExec;
}
