import {
  Agent,
  Runner,
  run,
  type FunctionTool,
  type Model,
  type ModelProvider,
  type RunResult,
  type RunToolApprovalItem,
  type Session,
  type Tool,
} from '@openai/agents-core';
import type { Duration, ReconcileAnswer } from '../index.js';
import type { WorkflowContext } from '../agents/index.js';
import { takeTurn } from '../adapters/reply-order.js';
import { durableAgentModel } from './model.js';

/** How runledger runs one of the agent's function tools. */
export interface AgentToolContract {
  /** 'none' (default): a step. 'idempotent' and 'external': through the operation ledger with an idempotency key. */
  sideEffect: 'none' | 'idempotent' | 'external';
  /** The effect's key from the call; default `<lineage id>:<model step>:<call id>`. */
  idempotencyKey?: (call: { callId: string; input: string }) => string;
  /** 'external': asks the provider what became of a call whose outcome a crash lost. */
  reconcile?: (info: { idempotencyKey: string; operationId: string }) => Promise<ReconcileAnswer<unknown>>;
}

export interface RunAgentDurablyOptions {
  /** The conversation across runs: runledgerSession(ctx, id). */
  session?: Session;
  maxTurns?: number;
  /** The SDK's run context value (passed to tools). */
  context?: unknown;
  /** Resolves agents whose model is a name; default the SDK's default provider. */
  modelProvider?: ModelProvider;
  /** Contracts for function tools by name (default: each call a step). */
  tools?: Record<string, AgentToolContract>;
  /** Who may decide the approvals the agent's tools ask for (interruptions); default anyone. */
  approvers?: string[];
  /** How long an approval may wait; past it the call is rejected. */
  approvalTimeout?: Duration;
}

/**
 * `runAgentDurably(ctx, agent, input)`: `run(agent, input)` of the OpenAI Agents SDK as
 * part of a runledger run. Each model call of the agent (and of the agents it hands off
 * to) is a checkpointed step, each function tool call a step or, by its contract, an
 * operation in the ledger, so after a crash the run replays to where it was without
 * calling the model or the tools again. A tool approval the agent asks for (an
 * interruption) becomes a durable approval (`requestApproval`, holding no worker, decided
 * from TypeScript, SQL or the console, days later if need be); the SDK's RunState at each
 * interruption is checkpointed (`agents:state:<k>`) with the agent's name and the state's
 * schema version, and the run goes on with the decision on whichever worker resumes it.
 */
export async function runAgentDurably<A extends Agent<any, any>>(
  ctx: WorkflowContext,
  agent: A,
  input: string | Parameters<typeof run>[1],
  options: RunAgentDurablyOptions = {},
): Promise<RunResult<any, A>> {
  const durable = (await durableAgents(ctx, agent, options)) as A;
  const runOptions = {
    ...(options.session ? { session: options.session } : {}),
    ...(options.maxTurns !== undefined ? { maxTurns: options.maxTurns } : {}),
    ...(options.context !== undefined ? { context: options.context } : {}),
  };
  let result = (await run(durable, input as string, runOptions as object)) as RunResult<any, A>;
  for (let k = 1; result.interruptions?.length; k++) {
    const state = result.state;
    await ctx.step(`agents:state:${k}`, () => {
      const serialized = JSON.parse(state.toString()) as { $schemaVersion?: string };
      return { agent: agent.name, schemaVersion: serialized.$schemaVersion ?? null, state: serialized };
    });
    for (const item of result.interruptions) await decide(ctx, state, item, options);
    result = (await run(durable, state, runOptions as object)) as RunResult<any, A>;
  }
  return result;
}

async function decide(
  ctx: WorkflowContext,
  state: RunResult<any, any>['state'],
  item: RunToolApprovalItem,
  options: RunAgentDurablyOptions,
): Promise<void> {
  const raw = item.rawItem as { callId?: string; name?: string; arguments?: string };
  const tool = item.name ?? raw.name ?? 'tool';
  const decision = await ctx.requestApproval(`approval:${tool}:${raw.callId ?? 'call'}`, {
    action: tool,
    evidence: { tool, arguments: raw.arguments ?? null, callId: raw.callId ?? null, agent: item.agent?.name ?? null },
    ...(options.approvers ? { approvers: options.approvers } : {}),
    ...(options.approvalTimeout !== undefined ? { timeout: options.approvalTimeout } : {}),
  });
  if (decision?.approved) state.approve(item);
  else {
    const why =
      decision === null
        ? 'the approval expired undecided'
        : `${decision.decidedBy} rejected it${decision.note ? `: ${decision.note}` : ''}`;
    state.reject(item, { message: `${tool} was not run: ${why}` });
  }
}

/** The agent and every agent it can hand off to, cloned with durable models and tools (cycles kept). */
async function durableAgents(ctx: WorkflowContext, root: Agent<any, any>, options: RunAgentDurablyOptions): Promise<Agent<any, any>> {
  const clones = new Map<Agent<any, any>, Agent<any, any>>();
  const visit = async (agent: Agent<any, any>): Promise<Agent<any, any>> => {
    const known = clones.get(agent);
    if (known) return known;
    const model = await resolveModel(agent, options);
    const clone = agent.clone({
      model: durableAgentModel(ctx, model, agent.name),
      tools: agent.tools.map((tool) => durableTool(ctx, tool, options)),
    });
    clones.set(agent, clone);
    clone.handoffs = await Promise.all(agent.handoffs.map((next) => (next instanceof Agent ? visit(next) : next)));
    return clone;
  };
  return visit(root);
}

async function resolveModel(agent: Agent<any, any>, options: RunAgentDurablyOptions): Promise<Model> {
  if (typeof agent.model !== 'string') return agent.model;
  // The provider a Runner uses by default: the SDK's (OpenAI's, with @openai/agents), or what setDefaultModelProvider set.
  const provider = options.modelProvider ?? new Runner().config.modelProvider;
  return provider.getModel(agent.model === '' ? undefined : agent.model);
}

function durableTool(ctx: WorkflowContext, tool: Tool<any>, options: RunAgentDurablyOptions): Tool<any> {
  if (tool.type !== 'function') return tool;
  const fn = tool as FunctionTool<any, any, any>;
  const contract = options.tools?.[fn.name] ?? { sideEffect: 'none' as const };
  const invoke: FunctionTool<any, any, any>['invoke'] = async (runContext, input, details) => {
    const callId = details?.toolCall?.callId ?? 'call';
    const modelStep = await takeTurn(ctx, callId);
    // No await from here to the ctx call: it takes its position now, in the reply's order.
    const name = `tool:${fn.name}`;
    if (contract.sideEffect === 'none') return ctx.step(name, ({ signal }) => fn.invoke(runContext, input, { ...details, signal }));
    const idempotencyKey = contract.idempotencyKey?.({ callId, input }) ?? `${ctx.lineageId}:${modelStep ?? 'call'}:${callId}`;
    return ctx.operation(
      name,
      {
        idempotencyKey,
        idempotent: contract.sideEffect === 'idempotent',
        ...(contract.reconcile ? { reconcile: contract.reconcile } : {}),
      },
      ({ signal }) => fn.invoke(runContext, input, { ...details, signal }),
    );
  };
  return { ...fn, invoke } as Tool<any>;
}
