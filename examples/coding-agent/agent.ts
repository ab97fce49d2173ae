/**
 * The coding agent of the source document's running case, offline: a scripted model
 * fixes a bug in a per-run workspace (the diff is recorded as an artifact), runs the
 * tests, asks a senior engineer to approve the merge (a durable wait: the run holds no
 * worker), then merges the pull request through an external operation with the
 * idempotency key `pr-<n>-merge` against a fake git provider. Its history is a session
 * (`pr-<n>`), so a later run (a follow-up fix, a review) continues the same conversation.
 *
 * In an application, import from 'runledger' (and 'runledger/agents') instead of '../../src/index.js'.
 */
import type pg from 'pg';
import { z } from 'zod';
import { defineTool, runAgent, scriptedModel, type Engine, type ScriptedReply } from '../../src/index.js';
import { ensureWorkspace, readWorkspaceFile, removeWorkspaces, renderDiff, runTests, writeFile, type FileChange } from './repo.js';

export const SENIOR = 'senior.sam';

/** The changes this run recorded (its `diff` artifacts), oldest first: what a new worker rebuilds the workspace from. */
export async function recordedChanges(pool: pg.Pool, runId: string): Promise<FileChange[]> {
  const { rows } = await pool.query(
    `select convert_from(b.content, 'utf8') as text
       from runledger.artifacts a join runledger.artifact_blobs b using (sha256)
      where a.run_id = $1 and a.name = 'diff' order by a.created_at, a.artifact_id`,
    [runId],
  );
  return rows.flatMap((r) => (JSON.parse(r.text) as { changes: FileChange[] }).changes);
}

/** What the scripted model answers, turn by turn (a real model would decide this from the messages). */
function script(pr: number): ScriptedReply[] {
  const call = (id: string, name: string, args: unknown, text: string): ScriptedReply => ({
    content: text,
    toolCalls: [{ id, name, arguments: args }],
    usage: { inputTokens: 800, outputTokens: 60, costUsd: 0.002 },
  });
  const fixed = `export function price(cents, vatPercent) {\n  return Math.round(cents * (1 + vatPercent / 100));\n}\n`;
  return [
    call('c1', 'read_file', { path: 'src/price.js' }, 'Let me look at price().'),
    call('c2', 'edit_file', { path: 'src/price.js', content: fixed }, 'It truncates; it should round. Fixing it.'),
    call('c3', 'run_tests', {}, 'Running the tests.'),
    call('c4', 'merge_pr', { pr }, `Tests pass. Merging pull request ${pr}.`),
    call('c5', 'complete', { summary: `price() rounds instead of truncating; tests pass; PR ${pr} merged` }, 'Done.'),
  ];
}

export function defineCodingAgent(engine: Engine, options: { providerUrl: string }) {
  const { providerUrl } = options;
  const workspace = async (runId: string) => ensureWorkspace(runId, await recordedChanges(engine.pool, runId));

  const readFile = defineTool({
    name: 'read_file',
    description: 'Reads a file of the workspace.',
    input: z.object({ path: z.string() }),
    sideEffect: 'none',
    run: async ({ path }, { runId }) => ({ path, text: readWorkspaceFile((await workspace(runId)).dir, path) }),
  });
  const editFile = defineTool({
    name: 'edit_file',
    description: 'Replaces the content of a file of the workspace.',
    input: z.object({ path: z.string(), content: z.string() }),
    sideEffect: 'none',
    run: async ({ path, content }, { runId }) => {
      const { dir } = await workspace(runId);
      const change: FileChange = { path, before: readWorkspaceFile(dir, path), after: content };
      writeFile(dir, path, content);
      return change;
    },
  });
  const runTestsTool = defineTool({
    name: 'run_tests',
    description: 'Runs the project tests in the workspace.',
    input: z.object({}),
    sideEffect: 'none',
    run: async (_args, { runId, signal }) => runTests((await workspace(runId)).dir, signal),
  });
  const mergePr = defineTool({
    name: 'merge_pr',
    description: 'Merges the pull request (needs a senior engineer to approve).',
    input: z.object({ pr: z.number().int().positive() }),
    sideEffect: 'external',
    needsApproval: true,
    approvers: [SENIOR],
    idempotencyKey: ({ pr }) => `pr-${pr}-merge`,
    run: async ({ pr }, { idempotencyKey, signal }) => {
      const res = await fetch(`${providerUrl}/pulls/${pr}/merge`, {
        method: 'POST',
        headers: { 'idempotency-key': idempotencyKey },
        signal,
      });
      if (!res.ok) throw new Error(`merge of PR ${pr} refused: HTTP ${res.status} ${await res.text()}`);
      return (await res.json()) as { pr: number; sha: string; key: string };
    },
    // After a crash between the merge and its checkpoint: ask the provider what happened to this key.
    reconcile: async ({ idempotencyKey, args }) => {
      const res = await fetch(`${providerUrl}/pulls/${args.pr}/merge?key=${encodeURIComponent(idempotencyKey)}`);
      if (res.status === 404) return { status: 'failed' };
      if (!res.ok) return { status: 'unknown' };
      return { status: 'succeeded', result: (await res.json()) as { pr: number; sha: string; key: string } };
    },
  });

  const checkMerged = async (runId: string, pr: number, signal: AbortSignal) => {
    const { dir, rebuilt } = await workspace(runId);
    const tests = await runTests(dir, signal);
    const merge = await fetch(`${providerUrl}/pulls/${pr}/merge?key=pr-${pr}-merge`);
    return { tests, merged: merge.ok, rebuiltWorkspace: rebuilt || rebuiltHere.has(runId), pid: process.pid };
  };
  // The runs whose workspace this process rebuilt from the run's history (the environment's rehydrate).
  const rebuiltHere = new Set<string>();

  return engine.workflow(
    {
      name: 'coding-agent',
      input: z.object({ pr: z.number().int().positive(), task: z.string() }),
      // The workspace is the run's environment: made at the start, rebuilt from the recorded
      // diff on a worker that lacks it (after a crash), removed when the run has ended.
      environment: {
        create: (ctx) => ({ base: 'price@v1', dir: ensureWorkspace(ctx.runId, []).dir }),
        rehydrate: async (ctx) => {
          if (ensureWorkspace(ctx.runId, await recordedChanges(engine.pool, ctx.runId)).rebuilt) rebuiltHere.add(ctx.runId);
        },
        reclaim: (_manifest, { runId }) => void removeWorkspaces(runId),
      },
      limits: { deadline: '7d', budget: { tokens: 50_000, costUsd: 1, toolCalls: 20, turns: 12 }, noProgress: 4 },
      // SUCCEEDED only with the evidence: the tests pass on the merged code and the provider has the merge.
      verify: async (output, ctx, input) => {
        const check = await ctx.step('final-check', ({ signal }) => checkMerged(ctx.runId, input.pr, signal));
        return check.tests.passed && check.merged
          ? { ok: true, evidence: { tests: check.tests.output, merged: true, output } }
          : { ok: false, reason: check.tests.passed ? 'the provider has no merge' : `tests fail: ${check.tests.output}` };
      },
    },
    async (ctx, input) => {
      const session = await ctx.session(`pr-${input.pr}`);
      const outcome = await runAgent(ctx, {
        model: scriptedModel('scripted-coder', script(input.pr), { streamChunkSize: 12 }),
        tools: [readFile, editFile, runTestsTool, mergePr],
        session,
        instructions: 'You are a careful engineer. Fix the bug, run the tests, get the merge approved, merge.',
        task: input.task,
        // Record each edit as the run's diff artifact, at its place in the history.
        afterTool: async (call, result) => {
          if (call.name === 'edit_file' && result.ok) {
            const change = result.result as FileChange;
            await ctx.artifact('diff', JSON.stringify({ changes: [change], diff: renderDiff([change]) }));
          }
        },
        verify: async () => {
          const check = await ctx.step('check-complete', ({ signal }) => checkMerged(ctx.runId, input.pr, signal));
          return check.tests.passed && check.merged ? { ok: true, evidence: check } : { ok: false, reason: 'not merged or tests fail' };
        },
      });
      await session.release();
      return { summary: outcome.answer.summary, turns: outcome.turns };
    },
  );
}
