import type {
  LanguageModelV4,
  LanguageModelV4CallOptions,
  LanguageModelV4GenerateResult,
  LanguageModelV4Middleware,
  LanguageModelV4StreamPart,
  LanguageModelV4StreamResult,
  LanguageModelV4Usage,
} from '@ai-sdk/provider';
import { APICallError, wrapLanguageModel } from 'ai';
import type { WorkflowContext } from '../agents/index.js';
import type { RetryPolicy } from '../index.js';
import { nextModelStep } from '../adapters/run-state.js';
import { fromStored, toStored } from './stored.js';
import { recordReplyToolCalls } from '../adapters/reply-order.js';
import { uiChunkOfPart, UI_STREAM_TOPIC } from './ui-chunks.js';
import { cappedOutputTokens, chargeOf, chargeUsage } from './usage.js';

export interface DurableModelOptions {
  /** Names the model's steps, `model:<name>:<n>`; default the model's id. */
  name?: string;
  /** The cost of a call in USD, from its usage, charged to the run's `costUsd` budget. */
  costUsd?: (usage: LanguageModelV4Usage) => number;
  /**
   * Retries of a call inside its step; default 3 attempts in all for an APICallError the
   * provider marks retryable (429, 5xx, a dropped connection). Leave the AI SDK's own
   * `maxRetries` as it is: a call's failure reaches it as STEP_FAILED, which it does not retry.
   */
  retry?: RetryPolicy;
  /**
   * A shared rate limit key (engine.setRateLimit, e.g. the provider's): each call waits for a
   * permit on it across every run and worker, and a 429/503 with Retry-After pauses it for all.
   */
  rateLimit?: string;
  /**
   * The durable stream a streamed call's output goes to as AI SDK UI message chunks, live,
   * while the call runs (read it with uiMessageStreamResponse); default 'ui'. `false`: none.
   */
  uiStream?: string | false;
}

/** The default retry of a model call: the provider's own verdict on whether trying again may help. */
export const AI_MODEL_RETRY_DEFAULT: RetryPolicy = Object.freeze({
  maxAttempts: 3,
  initialDelayMs: 1_000,
  retryable: (error: unknown) => APICallError.isInstance(error) && error.isRetryable,
});

/** A streamed call as its checkpoint holds it. */
interface RecordedStream {
  parts: unknown[];
  response?: unknown;
}

/**
 * `durableModel(ctx, model)`: the AI SDK model under a middleware that makes each
 * `doGenerate`/`doStream` of the user's own `generateText`, `streamText` or
 * `ToolLoopAgent` loop a checkpointed step, `model:<name>:<n>` for the n-th call in the
 * run. On replay the recorded result comes back (a stream re-emits its recorded parts)
 * and the provider is not called. The usage is charged to the run's budgets inside the
 * step, before its checkpoint; `maxOutputTokens` is the caller's, lowered to what the
 * token budget leaves. A streamed call's output also goes live to the run's durable
 * stream as UI message chunks.
 */
export function durableModel(ctx: WorkflowContext, model: LanguageModelV4, options: DurableModelOptions = {}): LanguageModelV4 {
  const name = options.name ?? model.modelId;
  const retry = options.retry ?? AI_MODEL_RETRY_DEFAULT;
  const stepOptions = { retry, ...(options.rateLimit !== undefined ? { rateLimit: options.rateLimit } : {}) };
  const uiTopic = options.uiStream === undefined ? UI_STREAM_TOPIC : options.uiStream;

  const middleware: LanguageModelV4Middleware = {
    specificationVersion: 'v4',
    wrapGenerate: async ({ doGenerate, params }) => {
      // No await before ctx.step: the call takes its position when the AI SDK makes it.
      const step = nextModelStep(ctx, name);
      const stored = await ctx.step(
        step,
        async ({ signal }) => {
          withCall(params, ctx, signal);
          const result = await doGenerate();
          await chargeUsage(ctx, chargeOf(result.usage, options.costUsd));
          return toStored(recordable(result)) as object;
        },
        stepOptions,
      );
      const result = fromStored(stored) as LanguageModelV4GenerateResult;
      recordReplyToolCalls(ctx, step, toolCallIdsOf(result.content));
      return result;
    },
    wrapStream: async ({ doStream, params }) => {
      const step = nextModelStep(ctx, name);
      const stored = await ctx.step(
        step,
        async ({ signal }) => {
          withCall(params, ctx, signal);
          const { stream, response } = await doStream();
          const live = uiTopic ? ctx.stream(uiTopic) : undefined;
          const parts: LanguageModelV4StreamPart[] = [];
          let usage: LanguageModelV4Usage | undefined;
          if (live) void live.write({ type: 'start-step' });
          for await (const part of stream as unknown as AsyncIterable<LanguageModelV4StreamPart>) {
            // An error part fails the attempt, as a thrown error would: nothing half-streamed is checkpointed.
            if (part.type === 'error') throw part.error;
            if (part.type === 'raw' && !params.includeRawChunks) continue;
            if (part.type === 'finish') usage = part.usage;
            parts.push(part);
            const chunk = live ? uiChunkOfPart(part) : undefined;
            if (chunk) void live!.write(chunk);
          }
          if (live) void live.write({ type: 'finish-step' });
          await chargeUsage(ctx, chargeOf(usage, options.costUsd));
          const recorded: RecordedStream = { parts, ...(response?.headers ? { response: { headers: response.headers } } : {}) };
          return toStored(recorded) as object;
        },
        stepOptions,
      );
      const recorded = fromStored(stored) as RecordedStream;
      const parts = recorded.parts as LanguageModelV4StreamPart[];
      recordReplyToolCalls(ctx, step, toolCallIdsOf(parts), uiTopic !== false);
      return { stream: streamOf(parts), ...(recorded.response ? { response: recorded.response } : {}) } as LanguageModelV4StreamResult;
    },
  };
  return wrapLanguageModel({ model, middleware }) as LanguageModelV4;
}

/** The call as sent: the output cap lowered by the token budget, and aborted when the run is cancelled or its lease lost. */
function withCall(params: LanguageModelV4CallOptions, ctx: WorkflowContext, signal: AbortSignal): void {
  const cap = cappedOutputTokens(ctx, params.maxOutputTokens);
  if (cap !== undefined) params.maxOutputTokens = cap;
  params.abortSignal = params.abortSignal ? AbortSignal.any([params.abortSignal, signal]) : signal;
}

/** What of a result is kept: the request and response bodies are telemetry, often large, and not part of the answer. */
function recordable(result: LanguageModelV4GenerateResult): LanguageModelV4GenerateResult {
  const { request: _request, response, ...kept } = result;
  if (!response) return kept;
  const { body: _body, ...meta } = response;
  return { ...kept, response: meta };
}

function toolCallIdsOf(parts: ReadonlyArray<{ type: string }>): string[] {
  return parts
    .filter((part): part is { type: 'tool-call'; toolCallId: string; providerExecuted?: boolean } => part.type === 'tool-call')
    .filter((part) => !part.providerExecuted)
    .map((part) => part.toolCallId);
}

function streamOf<T>(parts: T[]): ReadableStream<T> {
  return new ReadableStream<T>({
    start(controller) {
      for (const part of parts) controller.enqueue(part);
      controller.close();
    },
  });
}
