import { ConfigError } from '../engine/core/errors.js';
import type { StepContext } from '../steps/context.js';
import type { RetryPolicy } from '../steps/retry.js';
import type { Duration } from '../engine/core/duration.js';
import { ModelError } from './errors.js';
import { toolSpecOf, type Tool, type ToolError, type ToolSpec } from './tool.js';

export type { ToolSpec } from './tool.js';

/**
 * A tool call a model asked for. `arguments` is the parsed JSON the model wrote; a model's
 * `call` may give the JSON text as providers send it (a string), which generate parses.
 * `error` is set by generate when the call cannot be made as asked: the model named a tool
 * it was not offered (UNKNOWN_TOOL) or wrote arguments that are not JSON
 * (INVALID_TOOL_ARGUMENTS; `arguments` is then the text as written). A loop answers such a
 * call with `{ ok: false, error }` as the tool's observation, so the model can correct itself.
 */
export interface ToolCall {
  id: string;
  name: string;
  arguments: unknown;
  error?: ToolError;
}

export interface ChatMessage {
  role: 'system' | 'user' | 'assistant' | 'tool';
  content: string | null;
  toolCalls?: ToolCall[];
  /** On a 'tool' message: the call it answers. */
  toolCallId?: string;
}

export interface Usage {
  inputTokens: number;
  outputTokens: number;
  costUsd?: number;
}

/** Where a model writes its partial output; each write is forwarded to the run's durable stream. */
export interface ModelStream {
  write(text: string): void;
}

export interface ModelCallArgs {
  messages: ChatMessage[];
  tools: ToolSpec[];
  /** Fires when the run is cancelled or its worker lost the lease: abort the request. */
  signal: AbortSignal;
  /** Partial output: each write goes to the run's durable stream (ctx.stream). */
  stream: ModelStream;
  /**
   * The most output tokens this call may produce: the run's remaining token budget (at
   * least 1), or the request's own maxOutputTokens if smaller; undefined when neither
   * limits it. An adapter sends it as the provider's max_tokens.
   */
  maxOutputTokens?: number;
}

export interface ModelReply {
  message: ChatMessage;
  usage: Usage;
  /** Why the model stopped, as the provider says it ('stop', 'length', 'tool_calls' ...), when it says. */
  finishReason?: string;
}

export interface Model {
  readonly name: string;
  call(args: ModelCallArgs): Promise<ModelReply>;
}

export interface GenerateRequest {
  messages: ChatMessage[];
  tools?: Array<Tool<any, any>>;
  /** Step name; default `generate:<model name>`. */
  name?: string;
  /** Stream topic for partial output; default 'model'. */
  streamTopic?: string;
  /** A cap on output tokens of its own (the run's token budget caps it too). */
  maxOutputTokens?: number;
  /** Retries of the call; default MODEL_RETRY_DEFAULT (retryable ModelErrors only). */
  retry?: RetryPolicy;
  /** How long one attempt of the call may take; past it the call is aborted and fails with STEP_TIMEOUT, into `retry`. */
  timeout?: Duration;
  /** A shared rate limit key (engine.setRateLimit, e.g. the provider's): each attempt waits for a permit; a Retry-After (429/503) pauses it for every run. */
  rateLimit?: string;
}

/** The model's reply as checkpointed: its tool calls checked against the tools offered (see ToolCall.error). */
export type GenerateResult = ModelReply;

/**
 * The default retry of ctx.generate: three attempts in all, for model errors that say a
 * later attempt may succeed (rate limits, server errors, a dropped connection). A reply
 * the provider answered and billed is never asked again by this policy.
 */
export const MODEL_RETRY_DEFAULT: RetryPolicy = Object.freeze({
  maxAttempts: 3,
  initialDelayMs: 1_000,
  retryable: (error: unknown) => error instanceof ModelError && error.retryable,
});

/** Model names: what the step name `generate:<name>` and the stream chunks carry. */
export const MODEL_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/@-]{0,99}$/;

const ROLES = new Set(['system', 'user', 'assistant', 'tool']);

/** A model: a name and a `call` that sends messages (and tool specs) to it and returns its reply and usage. */
export function defineModel(model: { name: string; call: Model['call'] }): Model {
  if (typeof model?.name !== 'string' || !MODEL_NAME_PATTERN.test(model.name)) {
    throw new ConfigError(
      `defineModel: name ${JSON.stringify(model?.name)} is invalid: 1-100 characters of letters, digits, '_', '.', ':', '/', '@', '-'`,
    );
  }
  if (typeof model.call !== 'function') throw new ConfigError(`defineModel(${model.name}): call must be a function`);
  const call = model.call;
  return Object.freeze({ name: model.name, call: (args: ModelCallArgs) => call(args) });
}

/**
 * `ctx.generate(model, request)`: one model call as a checkpointed step. On replay the
 * recorded reply is returned and the model is not called. The usage the model reports is
 * charged to the run's budgets (tokens, costUsd) right after the call returns, before the
 * checkpoint, so a crash in between does not lose what the provider billed. What the model
 * writes to `stream` goes to the run's durable stream `request.streamTopic` ('model').
 */
export async function generate(ctx: StepContext, model: Model, request: GenerateRequest): Promise<GenerateResult> {
  // No await before ctx.step: the step's position is taken when generate is called, as for any ctx call.
  if (typeof model?.name !== 'string' || typeof model.call !== 'function') {
    throw new ConfigError('ctx.generate: the first argument must be a model (defineModel)');
  }
  const messages = checkMessages(request?.messages, model.name);
  const tools = request.tools ?? [];
  if (!Array.isArray(tools)) throw new ConfigError(`ctx.generate(${model.name}): tools must be a list of tools (defineTool)`);
  const specs = tools.map((tool) => toolSpecOf(tool, `ctx.generate(${model.name})`));
  const offered = new Set<string>();
  for (const spec of specs) {
    if (offered.has(spec.name)) throw new ConfigError(`ctx.generate(${model.name}): two tools are named ${JSON.stringify(spec.name)}`);
    offered.add(spec.name);
  }
  const cap = request.maxOutputTokens;
  if (cap !== undefined && (!Number.isInteger(cap) || cap < 1)) {
    throw new ConfigError(`ctx.generate(${model.name}): maxOutputTokens must be a whole number >= 1`);
  }
  const name = request.name ?? `generate:${model.name}`;
  const topic = request.streamTopic ?? 'model';

  return ctx.step<GenerateResult>(
    name,
    async ({ signal }) => {
      const stream = new ForwardingStream(ctx, topic, { model: model.name, step: name });
      let reply: unknown;
      try {
        reply = await model.call({ messages, tools: specs, signal, stream, maxOutputTokens: outputCap(ctx, cap) });
      } catch (error) {
        await stream.settled();
        throw error;
      }
      const usage = checkUsage(reply, model.name);
      const charge = { tokens: usage.inputTokens + usage.outputTokens, ...(usage.costUsd ? { costUsd: usage.costUsd } : {}) };
      if (charge.tokens > 0 || charge.costUsd) await ctx.chargeNow(charge);
      await stream.flush();
      return checkedReply(reply as ModelReply, usage, offered, model.name);
    },
    {
      retry: request.retry ?? MODEL_RETRY_DEFAULT,
      ...(request.timeout !== undefined ? { timeout: request.timeout } : {}),
      ...(request.rateLimit !== undefined ? { rateLimit: request.rateLimit } : {}),
    },
  ) as Promise<GenerateResult>;
}

/** The run's remaining token budget, or the request's cap if smaller; never below 1 (a call with 0 is refused by providers). */
function outputCap(ctx: StepContext, cap: number | undefined): number | undefined {
  const remaining = ctx.budget.remaining().tokens;
  const fromBudget = remaining === null ? undefined : Math.max(1, Math.floor(remaining));
  if (fromBudget === undefined) return cap;
  return cap === undefined ? fromBudget : Math.min(cap, fromBudget);
}

/**
 * The model's `stream`: writes are synchronous for the model and go to the run's durable
 * stream in order, one after the other. The durable stream is opened at the first write
 * only, so a model that never streams never touches ctx.stream. `flush` waits for every
 * write and rethrows the first that failed (the step then fails: a stream that lost a chunk
 * is not a stream of the reply).
 */
class ForwardingStream implements ModelStream {
  #chain: Promise<void> = Promise.resolve();
  #failure: { error: unknown } | undefined;
  #durable: ReturnType<StepContext['stream']> | undefined;

  constructor(
    private readonly ctx: StepContext,
    private readonly topic: string,
    private readonly source: { model: string; step: string },
  ) {}

  write(text: string): void {
    if (typeof text !== 'string' || text === '' || this.#failure) return;
    this.#chain = this.#chain.then(async () => {
      if (this.#failure) return;
      try {
        this.#durable ??= this.ctx.stream(this.topic);
        await this.#durable.write({ delta: text, ...this.source });
      } catch (error) {
        this.#failure = { error };
      }
    });
  }

  /** Every write so far has settled (failed or not). */
  settled(): Promise<void> {
    return this.#chain;
  }

  async flush(): Promise<void> {
    await this.#chain;
    if (this.#failure) throw this.#failure.error;
  }
}

function checkMessages(messages: unknown, model: string): ChatMessage[] {
  if (!Array.isArray(messages)) throw new ConfigError(`ctx.generate(${model}): messages must be a list of chat messages`);
  messages.forEach((message: Partial<ChatMessage> | null, i) => {
    if (message === null || typeof message !== 'object' || !ROLES.has(message.role as string)) {
      throw new ConfigError(`ctx.generate(${model}): messages[${i}] needs a role of system, user, assistant or tool`);
    }
    if (message.content !== null && typeof message.content !== 'string') {
      throw new ConfigError(`ctx.generate(${model}): messages[${i}].content must be a string or null`);
    }
  });
  return messages as ChatMessage[];
}

function isCount(value: unknown): value is number {
  return typeof value === 'number' && Number.isFinite(value) && value >= 0;
}

/** The usage a reply reports, checked: a reply without it cannot be charged, so it is an error, not a free call. */
function checkUsage(reply: unknown, model: string): Usage {
  const usage = (reply as { usage?: Partial<Usage> } | null)?.usage;
  if (!usage || !isCount(usage.inputTokens) || !isCount(usage.outputTokens) || (usage.costUsd !== undefined && !isCount(usage.costUsd))) {
    throw new ModelError(
      `model ${model} returned no valid usage (${JSON.stringify(usage)}): a reply needs { inputTokens, outputTokens, costUsd? }, numbers >= 0`,
      { retryable: false },
    );
  }
  return {
    inputTokens: usage.inputTokens,
    outputTokens: usage.outputTokens,
    ...(usage.costUsd !== undefined ? { costUsd: usage.costUsd } : {}),
  };
}

/** The reply as checkpointed: an assistant message whose tool calls are checked against the tools offered. */
function checkedReply(reply: ModelReply, usage: Usage, offered: Set<string>, model: string): GenerateResult {
  const message = reply.message as Partial<ChatMessage> | undefined;
  if (
    !message ||
    typeof message !== 'object' ||
    (message.content !== null && message.content !== undefined && typeof message.content !== 'string')
  ) {
    throw new ModelError(`model ${model} returned no message (content a string or null, toolCalls optional)`, { retryable: false });
  }
  if (message.toolCalls !== undefined && !Array.isArray(message.toolCalls)) {
    throw new ModelError(`model ${model} returned toolCalls that are not a list`, { retryable: false });
  }
  const toolCalls = (message.toolCalls ?? []).map((call, i) => checkToolCall(call, i, offered));
  return {
    message: { role: 'assistant', content: message.content ?? null, ...(toolCalls.length ? { toolCalls } : {}) },
    usage,
    ...(typeof reply.finishReason === 'string' ? { finishReason: reply.finishReason } : {}),
  };
}

function checkToolCall(call: Partial<ToolCall> | null, index: number, offered: Set<string>): ToolCall {
  const id = typeof call?.id === 'string' && call.id !== '' ? call.id : `call_${index}`;
  const name = typeof call?.name === 'string' ? call.name : '';
  let args = call?.arguments;
  let error: ToolError | undefined;
  if (typeof args === 'string') {
    try {
      args = args.trim() === '' ? {} : JSON.parse(args);
    } catch (parseError) {
      error = {
        code: 'INVALID_TOOL_ARGUMENTS',
        message: `the arguments of ${name || 'the tool call'} are not valid JSON (${(parseError as Error).message}); write them as a JSON object`,
      };
    }
  }
  if (!offered.has(name)) {
    const known = [...offered].join(', ') || 'none';
    error = { code: 'UNKNOWN_TOOL', message: `there is no tool named ${JSON.stringify(name)}; the tools are: ${known}` };
  }
  return { id, name, arguments: args ?? {}, ...(error ? { error } : {}) };
}
