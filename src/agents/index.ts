/** runledger/agents: durable agents on the step API (docs/agents.md). */
export { WorkflowContext } from './context.js';
export { defineModel } from './model.js';
export type { ChatMessage, GenerateRequest, GenerateResult, Model, ModelCallArgs, ModelReply, ToolCall, ToolSpec, Usage } from './model.js';
export { defineTool } from './tool.js';
export type { CallToolOptions, SideEffect, Tool, ToolResult, ToolRunInfo } from './tool.js';
export { SESSION_ID_MAX_LENGTH, SESSION_ID_PATTERN, SESSION_ROLES } from './session.js';
export type { Session, SessionEntry, SessionOptions, SessionRole, StoredSessionEntry } from './session.js';
export { isLargeValueRef, LARGE_VALUE_THRESHOLD_BYTES, loadLarge, MAX_ARTIFACT_BYTES, storeLarge } from './artifact.js';
export type { ArtifactContent, ArtifactContentRead, ArtifactRecord, LargeValueRef } from './artifact.js';
export { SessionNotHeldError, SessionTimeoutError } from '../engine/core/errors.js';
