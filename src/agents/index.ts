/** runledger/agents: durable agents on the step API (docs/agents.md). */
export { WorkflowContext } from './context.js';
export { defineModel } from './model.js';
export type { ChatMessage, GenerateRequest, GenerateResult, Model, ModelCallArgs, ModelReply, ToolCall, ToolSpec, Usage } from './model.js';
export { defineTool } from './tool.js';
export type { CallToolOptions, SideEffect, Tool, ToolResult, ToolRunInfo } from './tool.js';
export type { Session, SessionEntry, SessionOptions, SessionRole, StoredSessionEntry } from './session.js';
export type { ArtifactContent, ArtifactRecord } from './artifact.js';
