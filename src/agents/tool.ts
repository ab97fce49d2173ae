import type { ZodType } from 'zod';
import type { StepContext } from '../steps/context.js';

export type SideEffect = 'none' | 'idempotent' | 'external';

export interface ToolRunInfo {
  idempotencyKey: string;
  signal: AbortSignal;
  runId: string;
}

export interface Tool<A = unknown, R = unknown> {
  readonly name: string;
  readonly description: string;
  readonly input: ZodType<A>;
  readonly sideEffect: SideEffect;
  readonly needsApproval?: boolean;
  readonly approvers?: string[];
  run(args: A, info: ToolRunInfo): Promise<R>;
  reconcile?: (info: {
    idempotencyKey: string;
    args: A;
  }) => Promise<{ status: 'succeeded'; result: R } | { status: 'failed' } | { status: 'unknown' }>;
  compensate?: (info: { result: R; idempotencyKey: string; args: A }) => Promise<unknown>;
}

/** What the model sees of a tool call: its result, or why it did not run (a bad argument, a rejection, a failure). */
export type ToolResult<R> = { ok: true; result: R } | { ok: false; error: { code: string; message: string } };

export interface CallToolOptions {
  /** The operation's idempotency key; default derived from the run and the call's position. */
  idempotencyKey?: string;
  /** Step name; default `tool:<tool name>`. */
  name?: string;
}

export function defineTool<A, R>(_tool: Tool<A, R>): Tool<A, R> {
  throw new Error('tools: not built yet');
}

export function callTool<A, R>(_ctx: StepContext, _tool: Tool<A, R>, _args: unknown, _options?: CallToolOptions): Promise<ToolResult<R>> {
  throw new Error('tools: not built yet');
}
