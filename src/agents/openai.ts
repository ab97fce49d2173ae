import { ConfigError } from '../engine/core/errors.js';
import { isRetryableStatus, ModelError } from './errors.js';
import { defineModel, type ChatMessage, type Model, type ModelCallArgs, type ModelReply, type ToolCall, type Usage } from './model.js';

export interface OpenAiChatModelOptions {
  /** The API's base URL, up to and without `/chat/completions`, e.g. `https://api.openai.com/v1`. */
  baseUrl: string;
  /** Sent as `Authorization: Bearer <apiKey>` when given. */
  apiKey?: string;
  /** The provider's model id, e.g. `gpt-4o-mini`. */
  model: string;
  /** The runledger model name (step `generate:<name>`); default the model id. */
  name?: string;
  headers?: Record<string, string>;
  /** USD per token, one price or input and output prices: the call's costUsd, charged to the run's budget. */
  costPerToken?: number | { input: number; output: number };
  /** Server-sent events (default true): partial output goes to the run's stream as it arrives. */
  stream?: boolean;
  /** The request field the output cap goes in; default 'max_tokens' (most compatible servers). */
  maxTokensField?: 'max_tokens' | 'max_completion_tokens';
  /** More request fields (temperature, seed ...), sent as they are. */
  body?: Record<string, unknown>;
  /** Gives up on a request after this long (a retryable MODEL_ERROR). */
  timeoutMs?: number;
}

/**
 * A model behind an OpenAI-compatible chat-completions API (OpenAI, vLLM, llama.cpp,
 * Ollama, LiteLLM ...), with plain fetch. Streams by SSE with `stream_options.include_usage`
 * (the usage arrives in the last event); maps tools to function calling and the run's
 * remaining token budget to max_tokens; aborts with the run's signal. HTTP errors are
 * ModelErrors with the status, retryable for 408, 409, 429 and 5xx.
 */
export function openAiChatModel(options: OpenAiChatModelOptions): Model {
  let url: URL;
  try {
    url = new URL(`${String(options?.baseUrl).replace(/\/+$/, '')}/chat/completions`);
  } catch {
    throw new ConfigError(`openAiChatModel: baseUrl ${JSON.stringify(options?.baseUrl)} is not a URL`);
  }
  if (typeof options.model !== 'string' || options.model === '') throw new ConfigError('openAiChatModel: model is required');
  const price = prices(options.costPerToken);
  if (options.timeoutMs !== undefined && (!Number.isFinite(options.timeoutMs) || options.timeoutMs <= 0)) {
    throw new ConfigError('openAiChatModel: timeoutMs must be a number > 0');
  }
  const name = options.name ?? options.model;
  const streaming = options.stream ?? true;
  const headers: Record<string, string> = {
    'content-type': 'application/json',
    accept: streaming ? 'text/event-stream' : 'application/json',
    ...(options.apiKey ? { authorization: `Bearer ${options.apiKey}` } : {}),
    ...options.headers,
  };

  return defineModel({
    name,
    call: async (args) => {
      const body = {
        ...options.body,
        model: options.model,
        messages: args.messages.map(toWireMessage),
        ...(args.tools.length
          ? {
              tools: args.tools.map((t) => ({
                type: 'function',
                function: { name: t.name, description: t.description, parameters: t.parameters },
              })),
            }
          : {}),
        ...(args.maxOutputTokens !== undefined ? { [options.maxTokensField ?? 'max_tokens']: args.maxOutputTokens } : {}),
        ...(streaming ? { stream: true, stream_options: { include_usage: true } } : {}),
      };
      const signal = options.timeoutMs ? AbortSignal.any([args.signal, AbortSignal.timeout(options.timeoutMs)]) : args.signal;
      const failed = (error: unknown): ModelError => requestError(name, error, args.signal, signal);
      let response: Response;
      try {
        response = await fetch(url, { method: 'POST', headers, body: JSON.stringify(body), signal });
      } catch (error) {
        throw failed(error);
      }
      if (!response.ok) throw await httpError(name, response);
      let wire: WireReply;
      try {
        wire = streaming && isEventStream(response) ? await readEvents(name, response, args) : fromCompletion(await response.json());
      } catch (error) {
        throw error instanceof ModelError ? error : failed(error);
      }
      return toReply(name, wire, price);
    },
  });
}

/** What a completion amounts to, streamed or not, in the provider's terms. */
interface WireReply {
  content: string | null;
  toolCalls: Array<{ id: string; name: string; arguments: string }>;
  finishReason: string | undefined;
  usage: { prompt_tokens?: unknown; completion_tokens?: unknown } | undefined;
}

function prices(cost: OpenAiChatModelOptions['costPerToken']): { input: number; output: number } | undefined {
  if (cost === undefined) return undefined;
  const p = typeof cost === 'number' ? { input: cost, output: cost } : cost;
  if (![p?.input, p?.output].every((n) => typeof n === 'number' && Number.isFinite(n) && n >= 0)) {
    throw new ConfigError('openAiChatModel: costPerToken must be a number >= 0 or { input, output } numbers >= 0');
  }
  return p;
}

function toWireMessage(message: ChatMessage): Record<string, unknown> {
  if (message.role === 'tool') return { role: 'tool', content: message.content ?? '', tool_call_id: message.toolCallId };
  if (message.role === 'assistant' && message.toolCalls?.length) {
    return {
      role: 'assistant',
      content: message.content,
      tool_calls: message.toolCalls.map((call) => ({
        id: call.id,
        type: 'function',
        // Arguments that were not JSON go back as the model wrote them (it is told so by the tool's observation).
        function: { name: call.name, arguments: rawArguments(call) },
      })),
    };
  }
  return { role: message.role, content: message.content ?? '' };
}

function rawArguments(call: ToolCall): string {
  if (call.error?.code === 'INVALID_TOOL_ARGUMENTS' && typeof call.arguments === 'string') return call.arguments;
  return JSON.stringify(call.arguments ?? {});
}

function isEventStream(response: Response): boolean {
  return (response.headers.get('content-type') ?? '').includes('text/event-stream');
}

function fromCompletion(json: any): WireReply {
  const choice = json?.choices?.[0];
  const message = choice?.message ?? {};
  return {
    content: typeof message.content === 'string' ? message.content : null,
    toolCalls: (Array.isArray(message.tool_calls) ? message.tool_calls : []).map((call: any, i: number) => ({
      id: typeof call?.id === 'string' ? call.id : `call_${i}`,
      name: String(call?.function?.name ?? ''),
      arguments: typeof call?.function?.arguments === 'string' ? call.function.arguments : JSON.stringify(call?.function?.arguments ?? {}),
    })),
    finishReason: typeof choice?.finish_reason === 'string' ? choice.finish_reason : undefined,
    usage: json?.usage ?? undefined,
  };
}

/**
 * Reads the SSE body: each `data:` event is a chunk whose delta carries text (written to
 * the run's stream as it comes) or pieces of tool calls (assembled by their index); the last
 * chunk carries the usage; `data: [DONE]` ends it.
 */
async function readEvents(name: string, response: Response, args: ModelCallArgs): Promise<WireReply> {
  let content: string | null = null;
  const calls: Array<{ id: string; name: string; arguments: string }> = [];
  let finishReason: string | undefined;
  let usage: WireReply['usage'];
  for await (const data of serverSentData(response.body!)) {
    if (data === '[DONE]') break;
    let chunk: any;
    try {
      chunk = JSON.parse(data);
    } catch {
      throw new ModelError(`model ${name}: the stream sent an event that is not JSON: ${data.slice(0, 200)}`, { retryable: true });
    }
    if (chunk?.error) {
      throw new ModelError(`model ${name}: ${chunk.error.message ?? JSON.stringify(chunk.error)}`, { retryable: true });
    }
    if (chunk?.usage) usage = chunk.usage;
    const choice = chunk?.choices?.[0];
    if (!choice) continue;
    if (typeof choice.finish_reason === 'string') finishReason = choice.finish_reason;
    const delta = choice.delta ?? {};
    if (typeof delta.content === 'string' && delta.content !== '') {
      content = (content ?? '') + delta.content;
      args.stream.write(delta.content);
    }
    for (const piece of Array.isArray(delta.tool_calls) ? delta.tool_calls : []) {
      const index = Number.isInteger(piece?.index) ? piece.index : calls.length;
      const call = (calls[index] ??= { id: '', name: '', arguments: '' });
      if (typeof piece.id === 'string' && piece.id) call.id = piece.id;
      const fn = piece.function ?? {};
      // The name comes whole in the first piece; a server that repeats it is not appended to itself.
      if (typeof fn.name === 'string' && fn.name !== call.name) call.name += fn.name;
      if (typeof fn.arguments === 'string') call.arguments += fn.arguments;
    }
  }
  return {
    content,
    toolCalls: calls.filter(Boolean).map((call, i) => ({ ...call, id: call.id || `call_${i}` })),
    finishReason,
    usage,
  };
}

/** The data of each server-sent event (multi-line data joined by newlines), in order. */
async function* serverSentData(body: ReadableStream<Uint8Array>): AsyncGenerator<string> {
  const decoder = new TextDecoder();
  let buffer = '';
  const boundary = /\r?\n\r?\n/;
  const dataOf = (block: string): string =>
    block
      .split(/\r?\n/)
      .filter((line) => line.startsWith('data:'))
      .map((line) => line.slice(5).replace(/^ /, ''))
      .join('\n');
  for await (const bytes of body as unknown as AsyncIterable<Uint8Array>) {
    buffer += decoder.decode(bytes, { stream: true });
    for (let match = boundary.exec(buffer); match; match = boundary.exec(buffer)) {
      const data = dataOf(buffer.slice(0, match.index));
      buffer = buffer.slice(match.index + match[0].length);
      if (data) yield data;
    }
  }
  const rest = dataOf(buffer + decoder.decode());
  if (rest) yield rest;
}

function toReply(name: string, wire: WireReply, price: { input: number; output: number } | undefined): ModelReply {
  const input = wire.usage?.prompt_tokens;
  const output = wire.usage?.completion_tokens;
  if (typeof input !== 'number' || typeof output !== 'number') {
    // Unmetered calls would slip past the token budget: refused (non-retryable, the call was made).
    throw new ModelError(
      `model ${name}: the reply has no usage (prompt_tokens, completion_tokens); a streaming server must honour stream_options.include_usage`,
      { retryable: false },
    );
  }
  const usage: Usage = {
    inputTokens: input,
    outputTokens: output,
    ...(price ? { costUsd: input * price.input + output * price.output } : {}),
  };
  return {
    message: {
      role: 'assistant',
      content: wire.content,
      ...(wire.toolCalls.length
        ? { toolCalls: wire.toolCalls.map((call) => ({ id: call.id, name: call.name, arguments: call.arguments })) }
        : {}),
    },
    usage,
    ...(wire.finishReason ? { finishReason: wire.finishReason } : {}),
  };
}

async function httpError(name: string, response: Response): Promise<ModelError> {
  let text = '';
  try {
    text = await response.text();
  } catch {
    // the status says enough
  }
  let detail = text.slice(0, 500);
  try {
    const json = JSON.parse(text);
    detail = json?.error?.message ?? json?.message ?? detail;
  } catch {
    // not JSON: the text as it is
  }
  const retryAfter = Number(response.headers.get('retry-after'));
  return new ModelError(
    `model ${name}: HTTP ${response.status}${response.statusText ? ` ${response.statusText}` : ''}${detail ? `: ${detail}` : ''}`,
    {
      status: response.status,
      retryable: isRetryableStatus(response.status),
      details: Number.isFinite(retryAfter) && retryAfter > 0 ? { retryAfterMs: retryAfter * 1000 } : {},
    },
  );
}

/** A request that got no (complete) answer: aborted by the run, timed out, or the connection failed. */
function requestError(name: string, error: unknown, runSignal: AbortSignal, signal: AbortSignal): ModelError {
  if (runSignal.aborted) {
    return new ModelError(`model ${name}: the request was aborted (${String(runSignal.reason)})`, {
      retryable: false,
      cause: error,
      details: { aborted: true },
    });
  }
  if (signal.aborted)
    return new ModelError(`model ${name}: the request timed out`, { retryable: true, cause: error, details: { timedOut: true } });
  const cause = (error as { cause?: { code?: string; message?: string } })?.cause;
  return new ModelError(
    `model ${name}: the request failed: ${cause?.code ?? cause?.message ?? (error as Error)?.message ?? String(error)}`,
    {
      retryable: true,
      cause: error,
    },
  );
}
