import { ConfigError } from '../engine/core/errors.js';
import { ModelError } from './errors.js';
import { defineModel, type ChatMessage, type Model, type ModelCallArgs, type ModelReply, type Usage } from './model.js';

/**
 * One scripted reply: the assistant's text, or a message with tool calls (arguments as a
 * value, or as JSON text the way providers send it), with its usage (default: about one
 * token per four characters, in and out) and finish reason; or an error the call throws.
 */
export type ScriptedReply =
  | string
  | {
      content?: string | null;
      toolCalls?: Array<{ id?: string; name: string; arguments?: unknown }>;
      usage?: Partial<Usage>;
      finishReason?: string;
    }
  | { error: { message: string; status?: number; retryable?: boolean } };

/** The script: a list of replies, one per turn, or a function of the conversation and the turn. */
export type Script = ScriptedReply[] | ((messages: ChatMessage[], turn: number) => ScriptedReply | Promise<ScriptedReply>);

export interface ScriptedModelOptions {
  /** Writes each reply's text to the stream in chunks of this many characters before returning; default: no streaming. */
  streamChunkSize?: number;
  /** Waits this long between streamed chunks (demos). */
  chunkDelayMs?: number;
}

export interface ScriptedModel extends Model {
  /** The calls this process made to the model, oldest first (a replayed generate makes none). */
  readonly calls: ReadonlyArray<Pick<ModelCallArgs, 'messages' | 'tools' | 'maxOutputTokens'>>;
}

/**
 * A model that replays a script, for tests and examples. The turn is the number of
 * assistant messages in the conversation it is given, not a counter of its own, so a
 * worker that recovers a run after a crash gets the reply the crashed one would have got.
 */
export function scriptedModel(name: string, script: Script, options: ScriptedModelOptions = {}): ScriptedModel {
  if (!Array.isArray(script) && typeof script !== 'function') {
    throw new ConfigError(`scriptedModel(${name}): the script must be a list of replies or a function (messages, turn) => reply`);
  }
  const chunk = options.streamChunkSize;
  if (chunk !== undefined && (!Number.isInteger(chunk) || chunk < 1)) {
    throw new ConfigError(`scriptedModel(${name}): streamChunkSize must be a whole number >= 1`);
  }
  const calls: Array<Pick<ModelCallArgs, 'messages' | 'tools' | 'maxOutputTokens'>> = [];
  const model = defineModel({
    name,
    call: async ({ messages, tools, signal, stream, maxOutputTokens }): Promise<ModelReply> => {
      calls.push({ messages, tools, maxOutputTokens });
      const turn = messages.filter((m) => m.role === 'assistant').length;
      const scripted = Array.isArray(script) ? script[turn] : await script(messages, turn);
      if (scripted === undefined) {
        throw new ModelError(`scripted model ${name} has no reply for turn ${turn}`, { retryable: false });
      }
      if (typeof scripted === 'object' && scripted !== null && 'error' in scripted) {
        const { message, status, retryable } = scripted.error;
        throw new ModelError(`scripted model ${name}: ${message}`, { status: status ?? null, retryable: retryable ?? false });
      }
      const reply = typeof scripted === 'string' ? { content: scripted } : scripted;
      const content = reply.content ?? null;
      if (chunk !== undefined && content) {
        for (let at = 0; at < content.length; at += chunk) {
          if (signal.aborted) throw new ModelError(`scripted model ${name}: aborted`, { retryable: false });
          stream.write(content.slice(at, at + chunk));
          if (options.chunkDelayMs) await new Promise((resolve) => setTimeout(resolve, options.chunkDelayMs));
        }
      }
      const toolCalls = (reply.toolCalls ?? []).map((call, i) => ({
        id: call.id ?? `call_${turn}_${i}`,
        name: call.name,
        arguments: call.arguments ?? {},
      }));
      const written = (content ?? '').length + toolCalls.reduce((n, c) => n + JSON.stringify(c.arguments).length, 0);
      const read = messages.reduce((n, m) => n + (m.content ?? '').length, 0);
      const usage: Usage = {
        inputTokens: reply.usage?.inputTokens ?? Math.ceil(read / 4),
        outputTokens: reply.usage?.outputTokens ?? Math.ceil(written / 4),
        ...(reply.usage?.costUsd !== undefined ? { costUsd: reply.usage.costUsd } : {}),
      };
      return {
        message: { role: 'assistant', content, ...(toolCalls.length ? { toolCalls } : {}) },
        usage,
        finishReason: reply.finishReason ?? (toolCalls.length ? 'tool_calls' : 'stop'),
      };
    },
  });
  return Object.freeze({ name: model.name, call: model.call, calls });
}
