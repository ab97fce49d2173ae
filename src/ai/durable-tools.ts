import type { ToolExecutionOptions, ToolSet } from 'ai';
import { z } from 'zod';
import { defineTool, type SideEffect, type WorkflowContext } from '../agents/index.js';
import { ConfigError, type Duration, type ReconcileAnswer, type RetryPolicy } from '../index.js';
import { replyStreamed, takeTurn } from '../adapters/reply-order.js';
import { UI_STREAM_TOPIC } from './ui-chunks.js';

/** How runledger runs one AI SDK tool: its side effect, its key, how a lost outcome is found, who approves it. */
export interface ToolContract<Input = any, Output = unknown> {
  /** 'none' (default): a step. 'idempotent' and 'external': through the operation ledger, with an idempotency key. */
  sideEffect: SideEffect;
  /** The effect's key (e.g. `refund-${input.orderId}`); default `<lineage id>:<model step>:<tool call id>`. */
  idempotencyKey?: (call: { toolCallId: string; input: Input }) => string;
  /** 'external': asks the provider what became of a call whose outcome a crash lost (UNKNOWN in the ledger). */
  reconcile?: (info: { idempotencyKey: string; operationId: string; input: Input }) => Promise<ReconcileAnswer<Output>>;
  /** Undoes a succeeded call if the run later fails or is cancelled (saga), once. */
  compensate?: (info: { result: unknown; idempotencyKey: string; input: Input; signal: AbortSignal }) => Promise<unknown> | unknown;
  /** A durable approval before each call (or those `when` picks): the run waits holding no worker; a refusal is the tool's error. */
  needsApproval?: boolean | { approvers?: string[]; timeout?: Duration; when?: (input: Input) => boolean };
  /** Retries of the call inside its step or operation; default none. */
  retry?: RetryPolicy;
  /** A shared rate limit key (engine.setRateLimit): each call waits for a permit on it; a Retry-After pauses it for every run. */
  rateLimit?: string;
}

/** A tool's failure as the AI SDK shows it to the model (a tool-error), with runledger's code. */
export class DurableToolError extends Error {
  constructor(
    message: string,
    readonly code: string,
    readonly details?: Record<string, unknown>,
  ) {
    super(message);
    this.name = 'DurableToolError';
  }
}

/**
 * `durableTools(ctx, tools, contracts)`: the user's AI SDK tools with each `execute` run
 * under runledger's tool contract (ctx.callTool): a tool with no contract, or
 * `sideEffect: 'none'`, is a checkpointed step; 'idempotent' and 'external' go through the
 * operation ledger with an idempotency key derived from the run's lineage and the tool
 * call id (or the contract's `idempotencyKey`), `reconcile` settling an outcome a crash
 * lost; `needsApproval` is a durable approval. Each call is charged `{ toolCalls: 1 }`. A
 * refusal or a failure reaches the model as the tool's error, as the AI SDK shows errors.
 * Under a streamed model call (streamText) the result also goes to the run's UI stream as
 * `tool-output-available`.
 */
export function durableTools<T extends ToolSet>(
  ctx: WorkflowContext,
  tools: T,
  contracts: { [K in keyof T]?: ToolContract } = {},
  options: { uiStream?: string | false } = {},
): T {
  for (const name of Object.keys(contracts)) {
    if (!(name in tools)) throw new ConfigError(`durableTools: a contract names ${JSON.stringify(name)}, which is not one of the tools`);
  }
  const uiTopic = options.uiStream === undefined ? UI_STREAM_TOPIC : options.uiStream;
  const wrapped: Record<string, unknown> = {};
  for (const [name, tool] of Object.entries(tools)) {
    const execute = tool.execute as ((input: unknown, options: ToolExecutionOptions<any>) => unknown) | undefined;
    if (!execute) {
      wrapped[name] = tool;
      continue;
    }
    const contract: ToolContract = contracts[name as keyof T] ?? { sideEffect: 'none' };
    const durableExecute = async (input: unknown, callOptions: ToolExecutionOptions<any>) => {
      const modelStep = await takeTurn(ctx, callOptions.toolCallId);
      // No await from here to ctx.callTool: the call takes its position now, in the reply's order.
      const runTool = defineTool({
        name,
        description: typeof tool.description === 'string' && tool.description !== '' ? tool.description : name,
        input: z.any(),
        sideEffect: contract.sideEffect,
        ...approvalOf(contract),
        ...(contract.reconcile
          ? { reconcile: ({ idempotencyKey, operationId, args }) => contract.reconcile!({ idempotencyKey, operationId, input: args }) }
          : {}),
        ...(contract.compensate
          ? {
              compensate: ({ result, idempotencyKey, args, signal }) =>
                contract.compensate!({ result, idempotencyKey, input: args, signal }),
            }
          : {}),
        ...(contract.retry ? { retry: contract.retry } : {}),
        ...(contract.rateLimit !== undefined ? { rateLimit: contract.rateLimit } : {}),
        run: async (args, info) => {
          // A UI follows the run's stream when the model streams (streamText): the result goes there beside the model's parts.
          const live = uiTopic && replyStreamed(ctx) ? ctx.stream(uiTopic) : undefined;
          try {
            const output = await lastValue(execute(args, { ...callOptions, abortSignal: info.signal }));
            if (live) void live.write({ type: 'tool-output-available', toolCallId: callOptions.toolCallId, output: output ?? null });
            return output;
          } catch (error) {
            if (live)
              void live.write({
                type: 'tool-output-error',
                toolCallId: callOptions.toolCallId,
                errorText: String((error as Error)?.message ?? error),
              });
            throw error;
          }
        },
      });
      const key =
        contract.sideEffect === 'none'
          ? undefined
          : (contract.idempotencyKey?.({ toolCallId: callOptions.toolCallId, input }) ??
            `${ctx.lineageId}:${modelStep ?? 'call'}:${callOptions.toolCallId}`);
      const result = await ctx.callTool(runTool, input, key === undefined ? {} : { idempotencyKey: key });
      if (result.ok) return result.result;
      throw new DurableToolError(result.error.message, result.error.code, result.error.details);
    };
    const { needsApproval: ownApproval, ...rest } = tool as typeof tool & { needsApproval?: unknown };
    // A contract's approval is runledger's (durable); without one, the AI SDK's own stays as the user set it.
    wrapped[name] = {
      ...rest,
      ...(contract.needsApproval === undefined && ownApproval !== undefined ? { needsApproval: ownApproval } : {}),
      execute: durableExecute,
    };
  }
  return wrapped as T;
}

function approvalOf(contract: ToolContract): {
  needsApproval?: boolean | ((input: any) => boolean);
  approvers?: string[];
  approvalTimeout?: Duration;
} {
  const approval = contract.needsApproval;
  if (approval === undefined || approval === false) return {};
  if (approval === true) return { needsApproval: true };
  return {
    needsApproval: approval.when ?? true,
    ...(approval.approvers ? { approvers: approval.approvers } : {}),
    ...(approval.timeout !== undefined ? { approvalTimeout: approval.timeout } : {}),
  };
}

/** A tool's output: its value, or the last value of a tool that streams preliminary results (an async iterable). */
async function lastValue(output: unknown): Promise<unknown> {
  const value = await output;
  if (value !== null && typeof value === 'object' && Symbol.asyncIterator in value && typeof value !== 'string') {
    let last: unknown;
    for await (const item of value as AsyncIterable<unknown>) last = item;
    return last;
  }
  return value;
}
