/**
 * runledger/ai: agents written with the Vercel AI SDK (v7) made durable without a rewrite
 * (docs/ai-sdk.md). `ai` is an optional peer dependency; the main entry never imports this one.
 */
export { durableModel, AI_MODEL_RETRY_DEFAULT } from './durable-model.js';
export type { DurableModelOptions } from './durable-model.js';
export { durableTools, DurableToolError } from './durable-tools.js';
export type { ToolContract } from './durable-tools.js';
export { fromAiSdk } from './from-ai-sdk.js';
export type { FromAiSdkOptions } from './from-ai-sdk.js';
export { uiMessageStreamResponse, runledgerChatTransport, RUN_ID_HEADER } from './ui-stream.js';
export type { RunledgerChatTransportOptions, UiStreamOptions } from './ui-stream.js';
export { UI_STREAM_TOPIC } from './ui-chunks.js';
