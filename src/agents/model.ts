import type { StepContext } from '../steps/context.js';
import type { Tool } from './tool.js';

/** A tool call a model asked for: `arguments` as the model gave them (parsed JSON where it was JSON). */
export interface ToolCall {
  id: string;
  name: string;
  arguments: unknown;
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

/** A tool as a model sees it: name, description and the JSON schema of its arguments. */
export interface ToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

export interface ModelCallArgs {
  messages: ChatMessage[];
  tools: ToolSpec[];
  signal: AbortSignal;
  /** Partial output: each write goes to the run's durable stream. */
  stream: { write(text: string): void };
  /** The most output tokens the run's token budget leaves (undefined: no token budget). */
  maxOutputTokens?: number;
}

export interface ModelReply {
  message: ChatMessage;
  usage: Usage;
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
}

export type GenerateResult = ModelReply;

export function defineModel(_model: { name: string; call: Model['call'] }): Model {
  throw new Error('models: not built yet');
}

export function generate(_ctx: StepContext, _model: Model, _request: GenerateRequest): Promise<GenerateResult> {
  throw new Error('models: not built yet');
}
