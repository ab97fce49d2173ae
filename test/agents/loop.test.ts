import { describe, expect, it } from 'vitest';
import { z } from 'zod';
import { defineTool, runAgent, scriptedModel, type ScriptedReply } from '../../src/index.js';
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
});
