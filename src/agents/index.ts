/** runledger/agents: durable agents on the step API (docs/agents.md). */
export { WorkflowContext } from './context.js';
export { defineModel, MODEL_RETRY_DEFAULT } from './model.js';
export type {
  ChatMessage,
  GenerateRequest,
  GenerateResult,
  Model,
  ModelCallArgs,
  ModelReply,
  ModelStream,
  ToolCall,
  ToolSpec,
  Usage,
} from './model.js';
export { ModelError } from './errors.js';
export { openAiChatModel } from './openai.js';
export type { OpenAiChatModelOptions } from './openai.js';
export { scriptedModel } from './scripted-model.js';
export type { Script, ScriptedModel, ScriptedModelOptions, ScriptedReply } from './scripted-model.js';
export { defineTool } from './tool.js';
export type { CallToolOptions, SideEffect, Tool, ToolDefinition, ToolError, ToolErrorCode, ToolResult, ToolRunInfo } from './tool.js';
export { SESSION_ID_MAX_LENGTH, SESSION_ID_PATTERN, SESSION_ROLES } from './session.js';
export type { Session, SessionEntry, SessionOptions, SessionRole, StoredSessionEntry } from './session.js';
export { isLargeValueRef, LARGE_VALUE_THRESHOLD_BYTES, loadLarge, MAX_ARTIFACT_BYTES, storeLarge } from './artifact.js';
export type { ArtifactContent, ArtifactContentRead, ArtifactRecord, LargeValueRef } from './artifact.js';
export { SessionNotHeldError, SessionTimeoutError } from '../engine/core/errors.js';
export { runAgent, completeTool, AgentIncompleteError } from './loop.js';
export { agentTool } from './agent-tool.js';
export type { AgentTool, AgentToolOptions } from './agent-tool.js';
export type { AgentOutcome, CompleteArgs, RunAgentOptions } from './loop.js';
