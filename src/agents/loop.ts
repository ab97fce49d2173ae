import { z } from 'zod';
import { RunledgerError } from '../engine/core/errors.js';
import type { Verdict, Workflow } from '../engine/core/workflow.js';
import type { WorkflowContext } from './context.js';
import type { ChatMessage, Model, ToolCall } from './model.js';
import type { Session, SessionEntry, StoredSessionEntry } from './session.js';
import { defineTool, type Tool, type ToolResult } from './tool.js';
import { isAgentTool } from './agent-tool.js';

export interface RunAgentOptions {
  model: Model;
  tools: Array<Tool<any, any>>;
  /** The system prompt. */
  instructions: string;
  /** The task, as the first user message (on a new session or without one). */
  task?: string;
  /** Where the conversation is kept across runs; without one it lives in this run's checkpoints only. */
  session?: Session;
  /** At most this many turns in this call (default 50); the run's `turns` budget, if any, stops it too. */
  limits?: { turns?: number };
  /**
   * A reply in plain text (no tool call) is the answer, as `{ summary: text }`, checked by
   * `verify` like a `complete` call: what most models do when they are done, AI SDK
   * providers included. Default false: the model is asked to call a tool or `complete`.
   */
  endOnText?: boolean;
  /** The most output tokens a model call may produce; the run's token budget lowers it, never raises it. */
  maxOutputTokens?: number;
  /**
   * Checks the model's `complete` call before the loop ends: a refusal goes back to the
   * model as the tool's result, and the loop goes on (within the limits).
   */
  verify?: (answer: CompleteArgs, ctx: WorkflowContext) => Promise<Verdict> | Verdict;
  /** Called after each tool call with its result, before the result is appended (record an artifact, say). Workflow code. */
  afterTool?: (call: ToolCall, result: ToolResult<unknown>) => Promise<void> | void;
}

export interface CompleteArgs {
  summary: string;
}

export interface AgentOutcome {
  answer: CompleteArgs;
  turns: number;
  /** What verify accepted the answer with (undefined without verify). */
  evidence: unknown;
}

/** The loop ran out of turns before the model completed (AGENT_INCOMPLETE). */
export class AgentIncompleteError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('AGENT_INCOMPLETE', message, { details });
  }
}

/** The tool the model ends the loop with; runAgent handles it itself. */
export const completeTool = defineTool({
  name: 'complete',
  description: 'Call when the task is done, with a summary of what was done and how it was checked.',
  input: z.object({ summary: z.string().min(1) }),
  sideEffect: 'none',
  run: async (args: CompleteArgs) => args,
});

/**
 * An agent loop on the step API, short on purpose: turns of generate → tool calls →
 * results appended to the session → progress, until the model calls `complete` and
 * `verify` accepts it. Each turn charges `{ turns: 1 }` before the model is called, so a
 * `turns` budget stops the run between turns; the model's usage and each
 * tool call are charged by ctx.generate and ctx.callTool. A user can write the same loop
 * with the same guarantees: every piece is a ctx call.
 */
export async function runAgent(ctx: WorkflowContext, options: RunAgentOptions): Promise<AgentOutcome> {
  const maxTurns = options.limits?.turns ?? 50;
  const tools = [...options.tools, completeTool];
  const messages: ChatMessage[] = [];
  const remember = async (entries: SessionEntry[]) => {
    messages.push(...entries.map(toMessage));
    if (options.session) await options.session.append(entries);
  };
  const earlier = options.session ? await options.session.history() : [];
  messages.push(...earlier.map(toMessage));
  if (earlier.length === 0) {
    await remember([
      { role: 'system', content: { text: options.instructions } },
      ...(options.task === undefined ? [] : [{ role: 'user' as const, content: { text: options.task } }]),
    ]);
  } else if (options.task !== undefined) {
    await remember([{ role: 'user', content: { text: options.task } }]);
  }

  for (let turn = 1; turn <= maxTurns; turn++) {
    // The turn that would pass a turns budget ends the run (a write of its own, with the
    // evidence); any other turn is charged with the model call's checkpoint.
    if ((ctx.budget.remaining().turns ?? 1) < 1) await ctx.chargeNow({ turns: 1 });
    else ctx.charge({ turns: 1 });
    const reply = await ctx.generate(options.model, {
      messages: [...messages],
      tools,
      ...(options.maxOutputTokens !== undefined ? { maxOutputTokens: options.maxOutputTokens } : {}),
    });
    await remember([{ role: 'assistant', content: { text: reply.message.content, toolCalls: reply.message.toolCalls ?? [] } }]);
    const calls = reply.message.toolCalls ?? [];
    if (calls.length === 0) {
      const text = reply.message.content?.trim() ?? '';
      if (options.endOnText && text !== '') {
        const verdict = options.verify ? await options.verify({ summary: text }, ctx) : { ok: true as const };
        if (verdict.ok) return { answer: { summary: text }, turns: turn, evidence: verdict.evidence };
        await remember([{ role: 'user', content: { text: `That answer was not accepted: ${verdict.reason}` } }]);
        continue;
      }
      await remember([{ role: 'user', content: { text: 'Call one of the tools, or `complete` when the task is done.' } }]);
      continue;
    }
    const results: unknown[] = [];
    for (const call of calls) {
      const result = await answer(ctx, call, tools, options);
      if (result.done) return { answer: result.done, turns: turn, evidence: result.evidence };
      results.push(result.observation);
      await remember([{ role: 'tool', content: { toolCallId: call.id, name: call.name, result: result.observation } }]);
    }
    await ctx.progress({ observation: results });
  }
  throw new AgentIncompleteError(`runAgent: the model did not complete within ${maxTurns} turns`, { turns: maxTurns });
}

type Answer = { done: CompleteArgs; evidence: unknown; observation?: undefined } | { done?: undefined; observation: unknown };

/** One tool call of the model: `complete` checked by verify, an unknown tool as an observation, the rest through ctx.callTool. */
async function answer(ctx: WorkflowContext, call: ToolCall, tools: Array<Tool<any, any>>, options: RunAgentOptions): Promise<Answer> {
  if (call.name === completeTool.name) {
    const parsed = completeTool.input.safeParse(call.arguments);
    if (!parsed.success) return { observation: { ok: false, error: { code: 'INVALID_TOOL_ARGUMENTS', message: parsed.error.message } } };
    const verdict = options.verify ? await options.verify(parsed.data, ctx) : { ok: true as const };
    if (verdict.ok) return { done: parsed.data, evidence: verdict.evidence };
    return { observation: { ok: false, error: { code: 'UNVERIFIED', message: verdict.reason } } };
  }
  const tool = tools.find((t) => t.name === call.name);
  if (!tool) {
    const known = tools.map((t) => t.name).join(', ');
    return {
      observation: { ok: false, error: { code: 'UNKNOWN_TOOL', message: `no tool ${JSON.stringify(call.name)}; the tools are ${known}` } },
    };
  }
  const result = isAgentTool(tool)
    ? await runChildAgent(ctx, tool, call)
    : await ctx.callTool(tool, call.arguments, { name: `tool:${tool.name}` });
  await options.afterTool?.(call, result);
  return { observation: result };
}

/** An agent tool: its arguments checked, then the agent as a child run, waited for durably; its failure is the observation. */
async function runChildAgent(
  ctx: WorkflowContext,
  tool: Tool<any, any> & { agent: Workflow<any, any, any> },
  call: ToolCall,
): Promise<ToolResult<unknown>> {
  const parsed = tool.input.safeParse(call.arguments);
  if (!parsed.success) {
    return {
      ok: false,
      error: { code: 'INVALID_TOOL_ARGUMENTS', message: `the arguments of ${tool.name} do not match its schema: ${parsed.error.message}` },
    };
  }
  ctx.charge({ toolCalls: 1 });
  try {
    const output = await ctx.runChild(tool.agent, parsed.data, { name: `agent:${tool.name}` });
    return { ok: true, result: output as never };
  } catch (error) {
    if ((error as { code?: string })?.code !== 'CHILD_FAILED') throw error;
    return { ok: false, error: { code: 'TOOL_FAILED', message: `${tool.name} failed: ${(error as Error).message}` } };
  }
}

/** A session entry as the model's message. */
function toMessage(entry: SessionEntry | StoredSessionEntry): ChatMessage {
  const content = (entry.content ?? {}) as { text?: string | null; toolCalls?: ToolCall[]; toolCallId?: string; result?: unknown };
  if (entry.role === 'tool') return { role: 'tool', content: JSON.stringify(content.result ?? null), toolCallId: content.toolCallId ?? '' };
  if (entry.role === 'assistant') {
    return { role: 'assistant', content: content.text ?? null, ...(content.toolCalls?.length ? { toolCalls: content.toolCalls } : {}) };
  }
  return { role: entry.role, content: content.text ?? (typeof entry.content === 'string' ? entry.content : JSON.stringify(entry.content)) };
}
