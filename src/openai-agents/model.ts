import { Usage, type Model, type ModelRequest, type ModelResponse, type StreamEvent } from '@openai/agents-core';
import type { WorkflowContext } from '../agents/index.js';
import { recordReplyToolCalls } from '../adapters/reply-order.js';
import { nextModelStep } from '../adapters/run-state.js';

/**
 * An Agents SDK model whose every call is a checkpointed step, `model:<name>:<n>` for the
 * n-th call of the run: on replay the recorded response comes back and the provider is
 * not called. The usage is charged to the run's budgets (tokens) inside the step, before
 * its checkpoint; the run's abort signal aborts the call. A streamed call records its
 * events and replays them.
 */
export function durableAgentModel(ctx: WorkflowContext, model: Model, name: string): Model {
  return {
    async getResponse(request: ModelRequest): Promise<ModelResponse> {
      const step = nextModelStep(ctx, name);
      const stored = (await ctx.step(step, async ({ signal }) => {
        const response = await model.getResponse({
          ...request,
          signal: request.signal ? AbortSignal.any([request.signal, signal]) : signal,
        });
        await charge(ctx, response.usage);
        const { usage, output, responseId, requestId } = response;
        return JSON.parse(
          JSON.stringify({ usage: plainUsage(usage), output, ...(responseId ? { responseId } : {}), ...(requestId ? { requestId } : {}) }),
        );
      })) as { usage: Record<string, unknown>; output: ModelResponse['output']; responseId?: string; requestId?: string };
      recordReplyToolCalls(ctx, step, callIdsOf(stored.output));
      return { ...stored, usage: new Usage(stored.usage as ConstructorParameters<typeof Usage>[0]) };
    },
    async *getStreamedResponse(request: ModelRequest): AsyncIterable<StreamEvent> {
      const step = nextModelStep(ctx, name);
      const events = (await ctx.step(step, async ({ signal }) => {
        const recorded: unknown[] = [];
        for await (const event of model.getStreamedResponse({
          ...request,
          signal: request.signal ? AbortSignal.any([request.signal, signal]) : signal,
        })) {
          recorded.push(JSON.parse(JSON.stringify(event)));
          if (event.type === 'response_done') await charge(ctx, event.response.usage);
        }
        return recorded;
      })) as StreamEvent[];
      const done = events.find((event) => event.type === 'response_done') as Extract<StreamEvent, { type: 'response_done' }> | undefined;
      recordReplyToolCalls(ctx, step, callIdsOf(done?.response.output ?? []));
      yield* events;
    },
  };
}

async function charge(ctx: WorkflowContext, usage: { inputTokens?: number; outputTokens?: number } | undefined): Promise<void> {
  const tokens = (usage?.inputTokens ?? 0) + (usage?.outputTokens ?? 0);
  if (tokens > 0) await ctx.chargeNow({ tokens });
}

function plainUsage(usage: Usage): Record<string, unknown> {
  return {
    requests: usage.requests,
    inputTokens: usage.inputTokens,
    outputTokens: usage.outputTokens,
    totalTokens: usage.totalTokens,
    inputTokensDetails: usage.inputTokensDetails,
    outputTokensDetails: usage.outputTokensDetails,
  };
}

function callIdsOf(output: ReadonlyArray<unknown>): string[] {
  return (output as Array<{ type?: string; callId?: string }>)
    .filter((item) => item.type === 'function_call' && typeof item.callId === 'string')
    .map((item) => item.callId!);
}
