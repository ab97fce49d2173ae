import type {
  LanguageModelV4,
  LanguageModelV4CallOptions,
  LanguageModelV4Content,
  LanguageModelV4Message,
  LanguageModelV4StreamPart,
  LanguageModelV4Usage,
} from '@ai-sdk/provider';
import { APICallError } from 'ai';
import {
  defineModel,
  ModelError,
  type ChatMessage,
  type Model,
  type ModelCallArgs,
  type ModelReply,
  type ToolCall,
} from '../agents/index.js';

export interface FromAiSdkOptions {
  /** The runledger model name (step `generate:<name>`); default the model's id. */
  name?: string;
  /** The cost of a call in USD from its usage, charged to the run's `costUsd` budget. */
  costUsd?: (usage: LanguageModelV4Usage) => number;
  /** Stream the call (doStream; partial text goes to the run's stream as it comes); default true. */
  stream?: boolean;
}

/**
 * `fromAiSdk(model)`: any AI SDK language model (OpenAI, Anthropic, Google, Ollama,
 * OpenAI-compatible servers ... each from its own provider package) as a runledger model
 * for `ctx.generate` and `runAgent`. Messages and tool specs are mapped to the AI SDK's
 * prompt, the reply's text and tool calls back; the output cap is what generate passes
 * (the caller's, lowered by the token budget); the run's abort signal aborts the call. A
 * provider's APICallError becomes a ModelError, retryable as the provider says.
 */
export function fromAiSdk(model: LanguageModelV4, options: FromAiSdkOptions = {}): Model {
  const streaming = options.stream ?? true;
  return defineModel({
    name: options.name ?? model.modelId,
    call: async (args) => {
      const call: LanguageModelV4CallOptions = {
        prompt: promptOf(args.messages),
        abortSignal: args.signal,
        ...(args.tools.length
          ? {
              tools: args.tools.map((tool) => ({
                type: 'function' as const,
                name: tool.name,
                description: tool.description,
                inputSchema: tool.parameters as any,
              })),
            }
          : {}),
        ...(args.maxOutputTokens !== undefined ? { maxOutputTokens: args.maxOutputTokens } : {}),
      };
      try {
        return streaming ? await streamed(model, call, args, options) : await generated(model, call, options);
      } catch (error) {
        throw modelErrorOf(error, model);
      }
    },
  });
}

async function generated(model: LanguageModelV4, call: LanguageModelV4CallOptions, options: FromAiSdkOptions): Promise<ModelReply> {
  const result = await model.doGenerate(call);
  return replyOf(result.content, result.usage, result.finishReason.unified, options);
}

async function streamed(
  model: LanguageModelV4,
  call: LanguageModelV4CallOptions,
  args: ModelCallArgs,
  options: FromAiSdkOptions,
): Promise<ModelReply> {
  const { stream } = await model.doStream(call);
  const content: LanguageModelV4Content[] = [];
  const texts = new Map<string, string>();
  let usage: LanguageModelV4Usage | undefined;
  let finish = 'other';
  for await (const part of stream as unknown as AsyncIterable<LanguageModelV4StreamPart>) {
    if (part.type === 'error') throw part.error;
    if (part.type === 'text-delta') {
      texts.set(part.id, (texts.get(part.id) ?? '') + part.delta);
      args.stream.write(part.delta);
    } else if (part.type === 'text-end') {
      content.push({ type: 'text', text: texts.get(part.id) ?? '' });
      texts.delete(part.id);
    } else if (part.type === 'tool-call') {
      content.push(part);
    } else if (part.type === 'finish') {
      usage = part.usage;
      finish = part.finishReason.unified;
    }
  }
  for (const text of texts.values()) content.push({ type: 'text', text });
  return replyOf(content, usage, finish, options);
}

function replyOf(
  content: LanguageModelV4Content[],
  usage: LanguageModelV4Usage | undefined,
  finishReason: string,
  options: FromAiSdkOptions,
): ModelReply {
  const text = content
    .filter((part) => part.type === 'text')
    .map((part) => part.text)
    .join('');
  const toolCalls: ToolCall[] = content
    .filter((part) => part.type === 'tool-call' && !part.providerExecuted)
    .map((part) => {
      const call = part as Extract<LanguageModelV4Content, { type: 'tool-call' }>;
      return { id: call.toolCallId, name: call.toolName, arguments: call.input };
    });
  const costUsd = usage && options.costUsd ? options.costUsd(usage) : undefined;
  return {
    message: { role: 'assistant', content: text === '' ? null : text, ...(toolCalls.length ? { toolCalls } : {}) },
    usage: {
      inputTokens: usage?.inputTokens.total ?? 0,
      outputTokens: usage?.outputTokens.total ?? 0,
      ...(costUsd !== undefined ? { costUsd } : {}),
    },
    finishReason,
  };
}

/** runledger's chat messages as the AI SDK's prompt; a tool result names its tool, found on the call it answers. */
export function promptOf(messages: ChatMessage[]): LanguageModelV4Message[] {
  const toolNames = new Map<string, string>();
  return messages.map((message): LanguageModelV4Message => {
    switch (message.role) {
      case 'system':
        return { role: 'system', content: message.content ?? '' };
      case 'user':
        return { role: 'user', content: [{ type: 'text', text: message.content ?? '' }] };
      case 'assistant': {
        for (const call of message.toolCalls ?? []) toolNames.set(call.id, call.name);
        return {
          role: 'assistant',
          content: [
            ...(message.content ? [{ type: 'text' as const, text: message.content }] : []),
            ...(message.toolCalls ?? []).map((call) => ({
              type: 'tool-call' as const,
              toolCallId: call.id,
              toolName: call.name,
              input: call.arguments,
            })),
          ],
        };
      }
      case 'tool':
        return {
          role: 'tool',
          content: [
            {
              type: 'tool-result',
              toolCallId: message.toolCallId ?? '',
              toolName: toolNames.get(message.toolCallId ?? '') ?? 'unknown',
              output: { type: 'text', value: message.content ?? '' },
            },
          ],
        };
    }
  });
}

function modelErrorOf(error: unknown, model: LanguageModelV4): unknown {
  if (error instanceof ModelError) return error;
  if (APICallError.isInstance(error)) {
    return new ModelError(`${model.provider} ${model.modelId}: ${error.message}`, {
      status: error.statusCode ?? null,
      retryable: error.isRetryable,
      cause: error,
    });
  }
  if ((error as Error)?.name === 'AbortError')
    return new ModelError(`${model.provider} ${model.modelId}: aborted`, { retryable: false, cause: error });
  return error;
}
