import type { ZodType } from 'zod';
import { ConfigError } from '../engine/core/errors.js';
import type { Workflow } from '../engine/core/workflow.js';
import { defineTool, type Tool } from './tool.js';

/** A tool that is another agent: runAgent runs it as a child run of its own (ctx.runChild). */
export interface AgentTool<A = unknown> extends Tool<A, unknown> {
  readonly agent: Workflow<any, any, A>;
}

export interface AgentToolOptions<A> {
  /** What the model calls it; default the workflow's name with characters a tool name cannot hold replaced by '_'. */
  name?: string;
  description: string;
  /** The child's input, as the model writes it (zod); it is what the child workflow receives. */
  input: ZodType<A, any>;
}

/**
 * `agentTool(workflow, { description, input })`: an agent (a workflow, typically one that
 * calls runAgent) offered to another agent as a tool, the source document's nested
 * agent-as-tool. When the model calls it, runAgent starts the workflow as a child run with
 * the arguments as its input and waits for it durably, holding no worker: the child has
 * its own steps, budgets and session, is resumable on its own after a crash, and shows in
 * `runledger.runs` with its parent. Its output is the tool's result; its failure is the
 * observation TOOL_FAILED. Called with ctx.callTool outside runAgent, it is refused.
 */
export function agentTool<A>(workflow: Workflow<any, any, A>, options: AgentToolOptions<A>): AgentTool<A> {
  if (typeof workflow?.name !== 'string') throw new ConfigError('agentTool: the first argument must be a workflow (engine.workflow)');
  const name = options.name ?? workflow.name.replace(/[^A-Za-z0-9_-]/g, '_').slice(0, 64);
  const tool = defineTool<A, unknown>({
    name,
    description: options.description,
    input: options.input,
    sideEffect: 'none',
    run: () => {
      throw new ConfigError(`agent tool ${name} runs as a child run: offer it to runAgent, or call ctx.runChild(${workflow.name}, input)`);
    },
  });
  return Object.freeze({ ...tool, agent: workflow });
}

export function isAgentTool(tool: Tool<any, any>): tool is AgentTool<any> {
  return typeof (tool as Partial<AgentTool>).agent?.name === 'string';
}
