/**
 * ctx.generate: a model call as a checkpointed step (docs/models-and-tools.md). A
 * scripted model, manual workers and a test clock: replays are made by a durable sleep
 * after the call, so the run is claimed again and replays the recorded reply.
 */
import { afterAll, describe, expect, it } from 'vitest';
import { z } from 'zod';
import {
  defineModel,
  defineTool,
  MODEL_RETRY_DEFAULT,
  scriptedModel,
  type Engine,
  type GenerateResult,
  type ModelCallArgs,
} from '../../src/index.js';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';
import { useTestEngine } from '../helpers/test-engine.js';

const t = useTestEngine({ engine: false });
const engines: Engine[] = [];
afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
});

function testEngine() {
  const clock = createTestClock('2030-01-01T00:00:00Z');
  const engine = createTestEngine({ connectionString: t.db.url, clock });
  engines.push(engine);
  return { engine, clock };
}

let names = 0;
const unique = (prefix: string) => `${prefix}-${++names}`;

const mergePr = defineTool({
  name: 'merge_pr',
  description: 'Merges a pull request',
  input: z.object({ pr: z.number().int().describe('the pull request number'), squash: z.boolean().default(false) }),
  sideEffect: 'none',
  run: async ({ pr }) => ({ merged: pr }),
});
const readFile = defineTool({
  name: 'read_file',
  description: 'Reads a file of the workspace',
  input: z.object({ path: z.string() }),
  sideEffect: 'none',
  run: async ({ path }) => `contents of ${path}`,
});

const steps = async (runId: string) =>
  (await t.db.pool.query('select seq, name, kind, status, attempts, output from runledger.steps where run_id = $1 order by seq', [runId]))
    .rows;

describe('ctx.generate', () => {
  it('is a checkpointed step: a replay returns the recorded reply and does not call the model again', async () => {
    const { engine, clock } = testEngine();
    const model = scriptedModel('scripted', ['Hello from the model']);
    const wf = engine.workflow({ name: unique('gen-replay') }, async (ctx) => {
      const reply = await ctx.generate(model, { messages: [{ role: 'user', content: 'hi' }] });
      await ctx.sleep('later', '1h');
      return reply;
    });
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    expect(await worker.drain()).toBe(1);
    expect((await engine.getRun(handle.runId))?.status).toBe('WAITING');
    clock.advance('1h');
    expect(await worker.drain()).toBe(1);

    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect(model.calls).toHaveLength(1);
    const reply = run?.output as GenerateResult;
    expect(reply.message).toEqual({ role: 'assistant', content: 'Hello from the model' });
    expect(reply.finishReason).toBe('stop');
    const rows = await steps(handle.runId);
    expect(rows[0]).toMatchObject({ seq: 0, name: 'generate:scripted', kind: 'step', status: 'SUCCEEDED', output: reply });
  });

  it('passes the tools as specs with the JSON schema of their input; returns the usage the model reported', async () => {
    const { engine } = testEngine();
    const model = scriptedModel('usage-model', [{ content: 'ok', usage: { inputTokens: 12, outputTokens: 5, costUsd: 0.0004 } }]);
    const wf = engine.workflow({ name: unique('gen-specs') }, async (ctx) =>
      ctx.generate(model, { messages: [{ role: 'system', content: 'be brief' }], tools: [mergePr, readFile] }),
    );
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect((run?.output as GenerateResult).usage).toEqual({ inputTokens: 12, outputTokens: 5, costUsd: 0.0004 });
    expect(model.calls[0]!.tools).toEqual([
      {
        name: 'merge_pr',
        description: 'Merges a pull request',
        parameters: {
          type: 'object',
          properties: {
            pr: { type: 'integer', description: 'the pull request number', minimum: expect.any(Number), maximum: expect.any(Number) },
            squash: { type: 'boolean', default: false },
          },
          required: ['pr'],
        },
      },
      {
        name: 'read_file',
        description: 'Reads a file of the workspace',
        parameters: { type: 'object', properties: { path: { type: 'string' } }, required: ['path'] },
      },
    ]);
    // Without a token budget the model is not capped (budgets: see the describe below).
    expect(model.calls[0]!.maxOutputTokens).toBeUndefined();
  });

  it('a reply naming an unknown tool, or with arguments that are not JSON, is returned with those calls marked, not a crash', async () => {
    const { engine } = testEngine();
    const model = scriptedModel('sloppy', [
      {
        content: null,
        toolCalls: [
          { id: 'a', name: 'merge_pr', arguments: '{"pr": 7}' },
          { id: 'b', name: 'delete_repo', arguments: {} },
          { id: 'c', name: 'read_file', arguments: '{"path": "src/a.ts"' },
          { name: 'read_file', arguments: { path: 'README.md' } },
        ],
      },
    ]);
    const wf = engine.workflow({ name: unique('gen-marks') }, async (ctx) =>
      ctx.generate(model, { messages: [{ role: 'user', content: 'merge it' }], tools: [mergePr, readFile] }),
    );
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    const calls = (run?.output as GenerateResult).message.toolCalls!;
    expect(calls[0]).toEqual({ id: 'a', name: 'merge_pr', arguments: { pr: 7 } });
    expect(calls[1]).toMatchObject({ id: 'b', name: 'delete_repo', error: { code: 'UNKNOWN_TOOL' } });
    expect(calls[1]!.error!.message).toContain('merge_pr, read_file');
    expect(calls[2]).toMatchObject({
      id: 'c',
      name: 'read_file',
      arguments: '{"path": "src/a.ts"',
      error: { code: 'INVALID_TOOL_ARGUMENTS' },
    });
    expect(calls[3]).toEqual({ id: 'call_0_3', name: 'read_file', arguments: { path: 'README.md' } });
  });

  it('a marked call fed to ctx.callTool as it is: the schema check makes it an observation too', async () => {
    const { engine } = testEngine();
    const model = scriptedModel('typo', [{ toolCalls: [{ name: 'merge_pr', arguments: '{"pr": "seven"}' }] }]);
    const wf = engine.workflow({ name: unique('gen-feed') }, async (ctx) => {
      const reply = await ctx.generate(model, { messages: [{ role: 'user', content: 'merge' }], tools: [mergePr] });
      const call = reply.message.toolCalls![0]!;
      return ctx.callTool(mergePr, call.arguments);
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.output).toMatchObject({ ok: false, error: { code: 'INVALID_TOOL_ARGUMENTS' } });
    expect((run?.output as { error: { message: string } }).error.message).toContain('pr: Invalid input: expected number');
  });

  it('model errors: a retryable one is retried by the default policy, a non-retryable one fails the step at once', async () => {
    const { engine } = testEngine();
    let calls = 0;
    const flaky = defineModel({
      name: 'flaky',
      call: async () => {
        calls++;
        if (calls === 1) throw Object.assign(new Error('overloaded'), { code: 'X' });
        return { message: { role: 'assistant', content: 'fine' }, usage: { inputTokens: 1, outputTokens: 1 } };
      },
    });
    // A plain Error is not a retryable ModelError: no retry, the run fails with the step.
    const plain = engine.workflow({ name: unique('gen-plain-error') }, async (ctx) =>
      ctx.generate(flaky, { messages: [{ role: 'user', content: 'x' }] }),
    );
    let scriptCalls = 0;
    const rateLimited = scriptedModel('rate-limited', (_messages, turn) =>
      scriptCalls++ === 0 ? { error: { message: 'HTTP 429', status: 429, retryable: true } } : `turn ${turn} answered`,
    );
    // The default policy (MODEL_RETRY_DEFAULT) with a short backoff.
    const retried = engine.workflow({ name: unique('gen-retried') }, async (ctx) =>
      ctx.generate(rateLimited, { messages: [{ role: 'user', content: 'x' }], retry: { ...MODEL_RETRY_DEFAULT, initialDelayMs: 5 } }),
    );
    const refusing = scriptedModel('refusing', [{ error: { message: 'HTTP 400 bad request', status: 400 } }]);
    // Even a policy that would retry everything does not retry a non-retryable ModelError.
    const refused = engine.workflow({ name: unique('gen-refused') }, async (ctx) => {
      try {
        await ctx.generate(refusing, { messages: [{ role: 'user', content: 'x' }], retry: { maxAttempts: 5, initialDelayMs: 5 } });
        return 'no error';
      } catch (error) {
        return (error as { details?: { code?: string } }).details?.code;
      }
    });
    const failed = await engine.start(plain, undefined);
    const ok = await engine.start(retried, undefined);
    const no = await engine.start(refused, undefined);
    await (await engine.runWorker({ manual: true })).drain();

    expect(await engine.getRun(failed.runId)).toMatchObject({ status: 'FAILED' });
    expect(calls).toBe(1);
    expect(await engine.getRun(ok.runId)).toMatchObject({ status: 'SUCCEEDED', output: { message: { content: 'turn 0 answered' } } });
    expect((await steps(ok.runId))[0]).toMatchObject({ status: 'SUCCEEDED', attempts: 2 });
    expect(await engine.getRun(no.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'MODEL_ERROR' });
    expect((await steps(no.runId))[0]).toMatchObject({ status: 'FAILED', attempts: 1 });
  });

  it('a model that does not write to its stream never opens one (the run needs no stream)', async () => {
    const { engine } = testEngine();
    let seen: ModelCallArgs | undefined;
    const quiet = defineModel({
      name: 'quiet',
      call: async (args) => {
        seen = args;
        return { message: { role: 'assistant', content: 'done' }, usage: { inputTokens: 2, outputTokens: 1 } };
      },
    });
    const wf = engine.workflow({ name: unique('gen-quiet') }, async (ctx) => ctx.generate(quiet, { messages: [] }));
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED' });
    expect(seen?.signal).toBeInstanceOf(AbortSignal);
    expect(typeof seen?.stream.write).toBe('function');
  });
});

describe('bad input', () => {
  it('defineModel refuses a bad name or a call that is not a function (CONFIG)', () => {
    expect(() => defineModel({ name: 'has space', call: async () => ({}) as never })).toThrow(expect.objectContaining({ code: 'CONFIG' }));
    expect(() => defineModel({ name: '', call: async () => ({}) as never })).toThrow(expect.objectContaining({ code: 'CONFIG' }));
    expect(() => defineModel({ name: 'ok', call: 'nope' as never })).toThrow(expect.objectContaining({ code: 'CONFIG' }));
  });

  it('ctx.generate with no model, bad messages or a tool not made by defineTool: CONFIG, and no step is recorded', async () => {
    const { engine } = testEngine();
    const model = scriptedModel('never-called', ['x']);
    const attempts = [
      (ctx: any) => ctx.generate({ name: 'fake' }, { messages: [] }),
      (ctx: any) => ctx.generate(model, { messages: 'hello' }),
      (ctx: any) => ctx.generate(model, { messages: [{ role: 'robot', content: 'x' }] }),
      (ctx: any) => ctx.generate(model, { messages: [], tools: [{ name: 'x', run: () => 1 }] }),
      (ctx: any) => ctx.generate(model, { messages: [], tools: [readFile, readFile] }),
      (ctx: any) => ctx.generate(model, { messages: [], maxOutputTokens: 0 }),
    ];
    const wf = engine.workflow({ name: unique('gen-bad-input') }, async (ctx) => {
      const codes: string[] = [];
      for (const attempt of attempts) {
        try {
          await attempt(ctx);
          codes.push('no error');
        } catch (error) {
          codes.push((error as { code: string }).code);
        }
      }
      return codes;
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: attempts.map(() => 'CONFIG') });
    expect(await steps(handle.runId)).toEqual([]);
    expect(model.calls).toHaveLength(0);
  });

  it('a reply without usage, or without a message, fails the step with MODEL_ERROR (an unmetered call is not free)', async () => {
    const { engine } = testEngine();
    const noUsage = defineModel({ name: 'no-usage', call: async () => ({ message: { role: 'assistant', content: 'x' } }) as never });
    const noMessage = defineModel({ name: 'no-message', call: async () => ({ usage: { inputTokens: 1, outputTokens: 1 } }) as never });
    const wf = engine.workflow({ name: unique('gen-bad-reply') }, async (ctx) => {
      const codes: unknown[] = [];
      for (const model of [noUsage, noMessage]) {
        try {
          await ctx.generate(model, { messages: [] });
        } catch (error) {
          codes.push((error as { details?: { code?: string } }).details?.code);
        }
      }
      return codes;
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: ['MODEL_ERROR', 'MODEL_ERROR'] });
    expect((await steps(handle.runId)).map((s) => [s.name, s.status, s.attempts])).toEqual([
      ['generate:no-usage', 'FAILED', 1],
      ['generate:no-message', 'FAILED', 1],
    ]);
  });
});

/**
 * These need the lead's ctx.chargeNow, ctx.budget.remaining and budgets in several
 * dimensions (limits.budget as { tokens, costUsd, toolCalls }); they fail until those land.
 */
describe('budgets (needs ctx.chargeNow and ctx.budget.remaining)', () => {
  it('the usage is charged to tokens and costUsd; maxOutputTokens is what the token budget leaves', async () => {
    const { engine } = testEngine();
    const model = scriptedModel('metered', [
      { content: 'one', usage: { inputTokens: 100, outputTokens: 50, costUsd: 0.01 } },
      { content: 'two', usage: { inputTokens: 200, outputTokens: 25, costUsd: 0.02 } },
    ]);
    const wf = engine.workflow({ name: unique('gen-budget'), limits: { budget: { tokens: 1000, costUsd: 1 } as never } }, async (ctx) => {
      const first = await ctx.generate(model, { messages: [{ role: 'user', content: 'a' }] });
      await ctx.generate(model, { messages: [{ role: 'user', content: 'a' }, first.message], maxOutputTokens: 2000 });
      return ctx.budget.remaining();
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect(model.calls.map((c) => c.maxOutputTokens)).toEqual([1000, 850]);
    expect(run?.output).toMatchObject({ tokens: 625 });
    expect((run?.output as { costUsd: number }).costUsd).toBeCloseTo(0.97, 10);
  });

  it('usage of an attempt that crashed after the provider answered, before the checkpoint, is charged, not lost', async () => {
    const clock = createTestClock('2030-01-01T00:00:00Z');
    const engine = createTestEngine({ connectionString: t.db.url, clock, crashAt: { when: 'before-checkpoint', step: 'generate:billed' } });
    engines.push(engine);
    const model = scriptedModel('billed', [{ content: 'x', usage: { inputTokens: 30, outputTokens: 10 } }]);
    const wf = engine.workflow({ name: unique('gen-crash-usage'), limits: { budget: { tokens: 1000 } as never } }, async (ctx) =>
      ctx.generate(model, { messages: [] }),
    );
    const handle = await engine.start(wf, undefined);
    const doomed = await engine.runWorker({ manual: true, leaseMs: 30_000 });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    const survivor = await engine.runWorker({ manual: true, leaseMs: 30_000 });
    clock.advance('31s');
    await survivor.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED' });
    expect(model.calls).toHaveLength(2);
    const used = await t.db.pool.query('select budget_used from runledger.runs where run_id = $1', [handle.runId]);
    // Both attempts were billed by the provider: both are charged.
    expect(used.rows[0].budget_used).toMatchObject({ tokens: 80 });
  });
});

/**
 * This needs the streams feature (ctx.stream, engine.readStream), built in parallel; it fails
 * until that lands. A chunk is read as the value written or as `{ chunk | data | value }`.
 */
describe('streams (needs ctx.stream and engine.readStream)', () => {
  it("what the model writes goes to the run's stream in order, as { delta, model, step }; a replay writes nothing", async () => {
    const { engine, clock } = testEngine();
    const model = scriptedModel('streamer', ['Partial output, chunk by chunk.'], { streamChunkSize: 5 });
    const wf = engine.workflow({ name: unique('gen-stream') }, async (ctx) => {
      const reply = await ctx.generate(model, { messages: [], streamTopic: 'answer' });
      await ctx.stream('answer').close();
      await ctx.sleep('replay', '1h');
      return reply.message.content;
    });
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    clock.advance('1h');
    await worker.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: 'Partial output, chunk by chunk.' });
    const chunks: Array<{ delta: string; model: string; step: string }> = [];
    const read = (engine as unknown as { readStream(runId: string, topic: string, o: object): AsyncIterable<any> }).readStream;
    for await (const item of read.call(engine, handle.runId, 'answer', { fromOffset: 0 })) {
      chunks.push(item?.delta !== undefined ? item : (item?.chunk ?? item?.data ?? item?.value));
    }
    expect(chunks.map((c) => c.delta)).toEqual(['Parti', 'al ou', 'tput,', ' chun', 'k by ', 'chunk', '.']);
    expect(chunks.every((c) => c.model === 'streamer' && c.step === 'generate:streamer')).toBe(true);
    expect(model.calls).toHaveLength(1);
  });
});
