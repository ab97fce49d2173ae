import { StepContext } from '../steps/context.js';
import type * as core from '../engine/core/workflow-context.js';
import { openSession, type Session, type SessionOptions } from './session.js';
import { generate, type GenerateRequest, type GenerateResult, type Model } from './model.js';
import { callTool, type CallToolOptions, type Tool, type ToolResult } from './tool.js';
import { recordArtifact, type ArtifactContent, type ArtifactRecord } from './artifact.js';

/**
 * What a workflow function receives: the step API (StepContext: steps, transactions,
 * operations, waits, charges, streams, progress) and, on top of it, what a durable
 * agent needs: sessions, model and tool calls, artifacts. The agent API uses only the
 * step API underneath; the engine core does not know about models.
 */
export class WorkflowContext<DB = any> extends StepContext<DB> implements core.WorkflowContext<DB> {
  /** Holds session `sessionId` for this run (another run on it waits durably until this one ends or releases it). */
  session(sessionId: string, options?: SessionOptions): Promise<Session> {
    return openSession(this, this.execution, sessionId, options);
  }

  /** A model call as a checkpointed step: its usage is charged to the run's budgets, its partial output goes to the run's stream. */
  generate(model: Model, request: GenerateRequest): Promise<GenerateResult> {
    return generate(this, model, request);
  }

  /** Calls a tool under its contract: arguments validated, side effects through the operation ledger, approval when it needs one. */
  callTool<A, R>(tool: Tool<A, R>, args: unknown, options?: CallToolOptions): Promise<ToolResult<R>> {
    return callTool(this, this.execution, tool, args, options);
  }

  /** Records an artifact of this run (content stored once by sha256, or an external reference). */
  artifact(name: string, content: ArtifactContent): Promise<ArtifactRecord> {
    return recordArtifact(this, this.execution, name, content);
  }
}

/** The class above, by another name: inside the declaration below, `WorkflowContext` is core's interface. */
type Implementation<DB> = WorkflowContext<DB>;

/**
 * Core names the context a workflow function receives (core/workflow-context.ts); its
 * members are those of the class above, whose types live in steps/ and agents/. Merged
 * here, so core imports nothing above it and the class is the one implementation.
 */
declare module '../engine/core/workflow-context.js' {
  // eslint-disable-next-line @typescript-eslint/no-empty-object-type
  interface WorkflowContext<DB> extends Implementation<DB> {}
}
