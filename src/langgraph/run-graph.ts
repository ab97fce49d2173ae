import { Command } from '@langchain/langgraph';
import type { WorkflowContext } from '../agents/index.js';
import { ConfigError, InvalidInputError } from '../index.js';
import { FENCING_TOKEN_KEY, RUN_ID_KEY, RunledgerSaver } from './saver.js';

/** What runGraph needs of a compiled LangGraph graph. */
export interface GraphLike {
  checkpointer?: unknown;
  invoke(input: unknown, config?: Record<string, unknown>): Promise<unknown>;
}

export interface RunGraphOptions {
  thread_id: string;
  /**
   * How an `interrupt()` waits, holding no worker: 'signal' (default), a signal on topic
   * `graph:<thread_id>` whose payload is the resume value (engine.signal, runledger signal,
   * select runledger.send_signal(...)); 'approval', an approval whose decision
   * `{ approved, decidedBy, note }` is the resume value (runledger approve, the console).
   */
  interrupts?: 'signal' | 'approval';
  /** Who may decide an interrupt's approval; default anyone. */
  approvers?: string[];
  /** More of LangGraph's config for each invoke (recursionLimit ...); thread_id and signal are set here. */
  config?: Record<string, unknown>;
}

export interface GraphInterrupt {
  id: string;
  value: unknown;
}

export interface RunGraphResult {
  /** The graph's final state, as JSON (what a step stores). */
  output: unknown;
  /** The interrupts answered on the way, in order, with their resume values. */
  interrupts: Array<GraphInterrupt & { resume: unknown }>;
}

/** The signal topic an interrupt of thread `threadId` waits on. */
export function graphResumeTopic(threadId: string): string {
  return `graph:${threadId}`;
}

const THREAD_ID = /^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,79}$/;

/**
 * `runGraph(ctx, graph, input, { thread_id })`: a LangGraph thread as part of a runledger
 * run. The graph is compiled with a RunledgerSaver; LangGraph checkpoints each superstep
 * in runledger's schema, and runledger makes the thread's run durable around it:
 *
 * - one runner per thread: the run holds the session `graph:<thread_id>`, another run on
 *   the thread waits durably until this one ends;
 * - each stretch of the graph up to an interrupt (a leg) is a step: a worker that dies
 *   mid-leg is replaced and the leg goes on from the thread's last checkpoint
 *   (`invoke(null)`), so a node whose writes were recorded does not run again;
 * - an `interrupt()` ends the leg and becomes a durable wait (a signal or an approval),
 *   days long if need be, holding no worker; its answer resumes the graph with
 *   `Command({ resume })` on whichever worker takes the run;
 * - the run's cancel and lost lease abort the graph (its signal), its deadline and budgets
 *   stop the run at the next step.
 */
export async function runGraph(ctx: WorkflowContext, graph: GraphLike, input: unknown, options: RunGraphOptions): Promise<RunGraphResult> {
  const threadId = options.thread_id;
  if (typeof threadId !== 'string' || !THREAD_ID.test(threadId)) {
    throw new InvalidInputError(
      `runGraph: thread_id ${JSON.stringify(threadId)} must be 1-80 letters, digits and _ . : / -, starting with a letter or digit`,
    );
  }
  const saver = graph.checkpointer;
  if (!(saver instanceof RunledgerSaver)) {
    throw new ConfigError('runGraph: compile the graph with a RunledgerSaver (builder.compile({ checkpointer: saver }))');
  }
  const session = await ctx.session(`graph:${threadId}`);
  const answered: RunGraphResult['interrupts'] = [];
  let resume: unknown;
  for (let leg = 0; ; leg++) {
    // Where the thread stood before this leg: a leg run again after a crash that finds the
    // thread moved on goes on from its last checkpoint instead of starting over.
    const from = await ctx.step(`graph:leg:${leg}:from`, () => latestCheckpoint(saver, threadId));
    const outcome = (await ctx.step(`graph:leg:${leg}`, async ({ signal }) => {
      const moved = (await latestCheckpoint(saver, threadId)) !== from;
      const argument = moved ? null : leg === 0 ? input : new Command({ resume });
      // Every write of this leg is fenced: an execution that lost the run writes nothing more to the thread.
      const configurable = {
        ...(options.config?.configurable as Record<string, unknown> | undefined),
        thread_id: threadId,
        [RUN_ID_KEY]: ctx.runId,
        [FENCING_TOKEN_KEY]: ctx.fencingToken,
      };
      const state = (await graph.invoke(argument, { ...options.config, configurable, signal })) as Record<string, unknown> | null;
      const pending = ((state?.__interrupt__ ?? []) as Array<{ id?: string; value?: unknown }>).map((i) => ({
        id: i.id ?? '',
        value: i.value ?? null,
      }));
      const { __interrupt__: _, ...output } = state ?? {};
      return { output, interrupts: pending };
    })) as { output: unknown; interrupts: GraphInterrupt[] };
    if (outcome.interrupts.length === 0) {
      await session.release();
      return { output: outcome.output, interrupts: answered };
    }
    resume = await answer(ctx, threadId, leg, outcome.interrupts, options);
    const byId = outcome.interrupts.length > 1 ? (resume as Record<string, unknown> | null) : undefined;
    for (const pending of outcome.interrupts) answered.push({ ...pending, resume: byId ? (byId?.[pending.id] ?? null) : resume });
  }
}

/** The resume value of a leg's interrupts: several at once are answered with a map from interrupt id to value. */
async function answer(
  ctx: WorkflowContext,
  threadId: string,
  leg: number,
  interrupts: GraphInterrupt[],
  options: RunGraphOptions,
): Promise<unknown> {
  if (options.interrupts === 'approval') {
    const decision = await ctx.requestApproval(`graph:interrupt:${leg}`, {
      action: `resume graph thread ${threadId}`,
      evidence: { thread_id: threadId, interrupts },
      ...(options.approvers ? { approvers: options.approvers } : {}),
    });
    return decision ? { approved: decision.approved, decidedBy: decision.decidedBy, note: decision.note ?? null } : null;
  }
  return ctx.waitForSignal(graphResumeTopic(threadId), { name: `graph:interrupt:${leg}` });
}

async function latestCheckpoint(saver: RunledgerSaver, threadId: string): Promise<string | null> {
  const { rows } = await saver.pool.query<{ id: string }>(
    `select max(checkpoint_id) as id from runledger.graph_checkpoints where thread_id = $1 and checkpoint_ns = ''`,
    [threadId],
  );
  return rows[0]?.id ?? null;
}
