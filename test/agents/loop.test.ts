import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { agentTool, defineTool, runAgent, scriptedModel, type ScriptedReply } from '../../src/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { queueWorkers } from '../helpers/cleanup.js';

/** runAgent: the loop over generate, tools, session and progress, ending by a verified `complete`. */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'loop');
const call = (name: string, args: unknown, id = name): ScriptedReply => ({
  content: `calling ${name}`,
  toolCalls: [{ id, name, arguments: args }],
});

let lookups = 0;
const lookup = defineTool({
  name: 'lookup',
  description: 'Looks a word up.',
  input: z.object({ word: z.string() }),
  sideEffect: 'none',
  run: async ({ word }) => {
    lookups++;
    return { word, meaning: `meaning of ${word}` };
  },
});
const dump = defineTool({
  name: 'dump',
  description: 'Returns a large output.',
  input: z.object({ kib: z.number() }),
  sideEffect: 'none',
  run: async ({ kib }) => ({ text: 'x'.repeat(kib * 1024) }),
});

describe('runAgent', () => {
  it('runs turns until complete, appends each message and tool result once to the session, and charges turns and tool calls', async () => {
    lookups = 0;
    const model = scriptedModel('loop-model', [call('lookup', { word: 'durable' }), call('complete', { summary: 'looked it up' })]);
    const wf = t.engine.workflow(
      { name: 'loop-basic', queue: 'loop', limits: { budget: { turns: 10, toolCalls: 10, tokens: 100_000 } } },
      async (ctx) => {
        const session = await ctx.session('loop-basic-1');
        const outcome = await runAgent(ctx, { model, tools: [lookup], session, instructions: 'Be brief.', task: 'What is durable?' });
        await session.release();
        return outcome;
      },
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toMatchObject({ answer: { summary: 'looked it up' }, turns: 2 });
    expect(lookups).toBe(1);
    const entries = await db.pool.query(`select role, content from runledger.session_history('loop-basic-1')`);
    expect(entries.rows.map((r) => r.role)).toEqual(['system', 'user', 'assistant', 'tool', 'assistant']);
    expect(entries.rows[3].content).toMatchObject({ toolCallId: 'lookup', result: { ok: true, result: { word: 'durable' } } });
    const run = (await db.pool.query('select budget_used from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.budget_used).toMatchObject({ turns: 2, tool_calls: 1 });
    expect(run.budget_used.tokens).toBeGreaterThan(0);
  });

  it('a complete that verify refuses goes back to the model as an observation, within the limits', async () => {
    let checks = 0;
    const model = scriptedModel('verify-model', [
      call('complete', { summary: 'done (not really)' }, 'c1'),
      call('lookup', { word: 'tests' }, 'c2'),
      call('complete', { summary: 'done' }, 'c3'),
    ]);
    const wf = t.engine.workflow({ name: 'loop-verify', queue: 'loop' }, async (ctx) =>
      runAgent(ctx, {
        model,
        tools: [lookup],
        instructions: 'x',
        task: 'y',
        verify: async (answer) => (++checks === 1 ? { ok: false, reason: 'the tests were not run' } : { ok: true, evidence: answer }),
      }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toMatchObject({ answer: { summary: 'done' }, turns: 3, evidence: { summary: 'done' } });
    const second = model.calls[1]!.messages.at(-1)!;
    expect(second).toMatchObject({ role: 'tool', toolCallId: 'c1' });
    expect(JSON.parse(second.content!)).toMatchObject({ ok: false, error: { code: 'UNVERIFIED', message: 'the tests were not run' } });
  });

  it('an unknown tool is an observation; a turns budget stops the loop with BUDGET', async () => {
    const model = scriptedModel('stuck-model', () => call('teleport', { to: 'mars' }));
    const wf = t.engine.workflow({ name: 'loop-turns', queue: 'loop', limits: { budget: { turns: 3 } } }, async (ctx) =>
      runAgent(ctx, { model, tools: [lookup], instructions: 'x', task: 'y' }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'BUDGET' } });
    const run = (await db.pool.query('select termination_evidence from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.termination_evidence).toMatchObject({ dimension: 'turns', limit: 3, spent: 4 });
    expect(model.calls).toHaveLength(3);
    expect(JSON.parse(model.calls[1]!.messages.at(-1)!.content!)).toMatchObject({ ok: false, error: { code: 'UNKNOWN_TOOL' } });
  });

  it('without complete within its turns it fails with AGENT_INCOMPLETE', async () => {
    const model = scriptedModel('chatty-model', () => 'just talking');
    const wf = t.engine.workflow({ name: 'loop-incomplete', queue: 'loop' }, async (ctx) =>
      runAgent(ctx, { model, tools: [lookup], instructions: 'x', task: 'y', limits: { turns: 2 } }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).rejects.toMatchObject({ details: { terminationReason: 'FAILED' } });
    const run = (await db.pool.query('select error from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.error).toMatchObject({ code: 'AGENT_INCOMPLETE' });
  });

  it('a large tool output is stored once by reference; the model still sees all of it', async () => {
    const model = scriptedModel('dump-model', [call('dump', { kib: 512 }), call('complete', { summary: 'dumped' })]);
    const wf = t.engine.workflow({ name: 'loop-large', queue: 'loop' }, async (ctx) =>
      runAgent(ctx, { model, tools: [dump], instructions: 'x', task: 'y' }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toMatchObject({ answer: { summary: 'dumped' } });
    const step = await db.pool.query(
      `select pg_column_size(output) as bytes, output from runledger.steps where run_id = $1 and name = 'tool:dump'`,
      [handle.runId],
    );
    expect(step.rows[0].bytes).toBeLessThan(300);
    expect(step.rows[0].output).toMatchObject({ $artifact: expect.stringMatching(/^[0-9a-f]{64}$/) });
    const blobs = await db.pool.query(`select size from runledger.artifact_blobs where sha256 = $1`, [step.rows[0].output.$artifact]);
    expect(blobs.rows).toHaveLength(1);
    const seen = model.calls[1]!.messages.at(-1)!;
    expect(JSON.parse(seen.content!).result.text).toHaveLength(512 * 1024);
  });

  it('endOnText: a plain-text reply is the answer, checked by verify; a refusal goes back to the model', async () => {
    const model = scriptedModel('text-model', [{ content: 'draft' }, { content: 'The answer is 42.' }]);
    const wf = t.engine.workflow({ name: 'loop-text', queue: 'loop' }, async (ctx) =>
      runAgent(ctx, {
        model,
        tools: [lookup],
        instructions: 'x',
        task: 'y',
        endOnText: true,
        verify: ({ summary }) =>
          summary.includes('42') ? { ok: true, evidence: { checked: summary } } : { ok: false, reason: 'no number in it' },
      }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toEqual({
      answer: { summary: 'The answer is 42.' },
      turns: 2,
      evidence: { checked: 'The answer is 42.' },
    });
    expect(model.calls[1]!.messages.at(-1)).toMatchObject({ role: 'user', content: 'That answer was not accepted: no number in it' });
  });

  it('without endOnText a plain-text reply does not end the loop', async () => {
    const model = scriptedModel('text-nag-model', [{ content: 'done?' }, call('complete', { summary: 'done' })]);
    const wf = t.engine.workflow({ name: 'loop-text-nag', queue: 'loop' }, async (ctx) =>
      runAgent(ctx, { model, tools: [], instructions: 'x', task: 'y' }),
    );
    await worker();
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toMatchObject({ answer: { summary: 'done' }, turns: 2 });
  });

  it('maxOutputTokens is the caller’s cap, lowered by the token budget, never raised', async () => {
    const model = scriptedModel('cap-model', [{ content: 'a' }]);
    const small = scriptedModel('cap-model-small', [{ content: 'b' }]);
    const wf = t.engine.workflow({ name: 'loop-cap', queue: 'loop', limits: { budget: { tokens: 500 } } }, async (ctx) => {
      await runAgent(ctx, { model, tools: [], instructions: 'x', task: 'y', endOnText: true, maxOutputTokens: 4_000 });
      await runAgent(ctx, { model: small, tools: [], instructions: 'x', task: 'y', endOnText: true, maxOutputTokens: 16 });
      return 'ok';
    });
    await worker();
    await expect((await t.engine.start(wf, undefined)).result()).resolves.toBe('ok');
    expect(model.calls[0]!.maxOutputTokens).toBe(500);
    expect(small.calls[0]!.maxOutputTokens).toBe(16);
  });

  it('an agent as a tool runs as a child run of its own; its answer is the tool result', async () => {
    const researcher = t.engine.workflow({ name: 'loop-researcher', queue: 'loop' }, async (ctx, input: { topic: string }) => {
      const inner = scriptedModel('researcher-model', [call('complete', { summary: `notes on ${input.topic}` })]);
      return (await runAgent(ctx, { model: inner, tools: [], instructions: 'Research.', task: input.topic })).answer.summary;
    });
    const research = agentTool(researcher, { description: 'Researches a topic', input: z.object({ topic: z.string() }) });
    const model = scriptedModel('lead-model', [
      call('loop-researcher', { topic: 'queues' }, 'r1'),
      call('complete', { summary: 'wrote it' }),
    ]);
    const wf = t.engine.workflow({ name: 'loop-lead', queue: 'loop', limits: { budget: { toolCalls: 5 } } }, async (ctx) =>
      runAgent(ctx, { model, tools: [research], instructions: 'Lead.', task: 'write about queues' }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    await expect(handle.result()).resolves.toMatchObject({ answer: { summary: 'wrote it' } });
    const seen = JSON.parse(model.calls[1]!.messages.at(-1)!.content!);
    expect(seen).toEqual({ ok: true, result: 'notes on queues' });
    const child = (await db.pool.query("select status, parent_run_id from runledger.runs where workflow_name = 'loop-researcher'")).rows;
    expect(child).toEqual([{ status: 'SUCCEEDED', parent_run_id: handle.runId }]);
    const run = (await db.pool.query('select budget_used from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(run.budget_used).toMatchObject({ tool_calls: 1 });
  });
});
