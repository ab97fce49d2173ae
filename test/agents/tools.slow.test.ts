/**
 * ctx.callTool: the tool contract (docs/models-and-tools.md). Arguments checked against
 * the schema (a bad one is an observation), 'none' as a step, 'idempotent' and 'external'
 * through the operation ledger, approvals before the call, failures as observations. Manual
 * workers and a test clock for most; a real worker process, SIGKILLed between an external
 * call and its checkpoint, for the crash claim.
 */
import { afterAll, afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { z } from 'zod';
import { defineTool, type Engine, type ToolResult } from '../../src/index.js';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { TicketService } from '../helpers/ticket-service.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { defineAgentWorkflows, ticketTool } from '../fixtures/agent-workflows.js';

let service: TicketService;
const t = useTestEngine({
  engine: false,
  prepare: async () => {
    service = await TicketService.start();
    return () => service.stop();
  },
});
const engines: Engine[] = [];
afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
});
afterEach(() => {
  service.holdReplies(false);
  service.reject(false);
});

function testEngine(crashAt?: { when: 'after-call'; step: string }) {
  const clock = createTestClock('2030-01-01T00:00:00Z');
  const engine = createTestEngine({ connectionString: t.db.url, clock, ...(crashAt ? { crashAt } : {}) });
  engines.push(engine);
  return { engine, clock };
}

let names = 0;
const unique = (prefix: string) => `${prefix}-${++names}`;

const steps = async (runId: string) =>
  (await t.db.pool.query('select seq, name, kind, status, output from runledger.steps where run_id = $1 order by seq', [runId])).rows;
const operations = async (runId: string) =>
  (
    await t.db.pool.query(
      'select seq, name, idempotency_key, status, attempts, external_resource_id, result from runledger.operations where run_id = $1 order by seq',
      [runId],
    )
  ).rows;

describe('arguments', () => {
  it('a bad argument is the observation INVALID_TOOL_ARGUMENTS, recorded as the call step; the tool does not run', async () => {
    const { engine, clock } = testEngine();
    let ran = 0;
    const add = defineTool({
      name: 'add',
      description: 'Adds two numbers',
      input: z.object({ a: z.number(), b: z.number() }),
      sideEffect: 'none',
      run: async ({ a, b }) => (ran++, a + b),
    });
    const wf = engine.workflow({ name: unique('tool-bad-args') }, async (ctx) => {
      const bad = await ctx.callTool(add, { a: 1, b: 'two' });
      const good = await ctx.callTool(add, { a: 1, b: 2 });
      await ctx.sleep('replay', '1h');
      return [bad, good];
    });
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    clock.advance('1h');
    await worker.drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    const [bad, good] = run?.output as [ToolResult<number>, ToolResult<number>];
    expect(bad).toEqual({
      ok: false,
      error: { code: 'INVALID_TOOL_ARGUMENTS', message: expect.stringContaining('b: Invalid input: expected number, received string') },
    });
    expect(good).toEqual({ ok: true, result: 3 });
    expect(ran).toBe(1);
    expect((await steps(handle.runId)).map((s) => [s.name, s.kind, s.status])).toEqual([
      ['tool:add', 'step', 'SUCCEEDED'],
      ['tool:add', 'step', 'SUCCEEDED'],
      ['replay', 'sleep', 'SUCCEEDED'],
    ]);
    expect((await steps(handle.runId))[0].output).toEqual(bad);
  });
});

describe("sideEffect 'none'", () => {
  it('runs as a step: once across a replay; concurrent calls replay at the same positions', async () => {
    const { engine, clock } = testEngine();
    const runs: string[] = [];
    const lookup = defineTool({
      name: 'lookup',
      description: 'Looks a word up',
      input: z.object({ word: z.string() }),
      sideEffect: 'none',
      run: async ({ word }, { idempotencyKey, attempt }) => {
        runs.push(word);
        return { word, length: word.length, key: idempotencyKey, attempt };
      },
    });
    const wf = engine.workflow({ name: unique('tool-none') }, async (ctx) => {
      const first = await ctx.callTool(lookup, { word: 'durable' });
      const both = await Promise.all([ctx.callTool(lookup, { word: 'left' }), ctx.callTool(lookup, { word: 'right' })]);
      await ctx.sleep('replay', '1h');
      return [first, ...both];
    });
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    clock.advance('1h');
    await worker.drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect(runs.sort()).toEqual(['durable', 'left', 'right']);
    expect(run?.output).toEqual([
      { ok: true, result: { word: 'durable', length: 7, key: `${handle.runId}:0:lookup`, attempt: 1 } },
      { ok: true, result: { word: 'left', length: 4, key: `${handle.runId}:1:lookup`, attempt: 1 } },
      { ok: true, result: { word: 'right', length: 5, key: `${handle.runId}:2:lookup`, attempt: 1 } },
    ]);
    expect((await steps(handle.runId)).map((s) => [s.seq, s.name, s.kind])).toEqual([
      [0, 'tool:lookup', 'step'],
      [1, 'tool:lookup', 'step'],
      [2, 'tool:lookup', 'step'],
      [3, 'replay', 'sleep'],
    ]);
  });

  it('a tool that throws is the observation TOOL_FAILED after its retries; onError: throw fails the call instead', async () => {
    const { engine } = testEngine();
    let attempts = 0;
    const broken = defineTool({
      name: 'broken',
      description: 'Always fails',
      input: z.object({}),
      sideEffect: 'none',
      retry: { maxAttempts: 2, initialDelayMs: 1 },
      run: async () => {
        attempts++;
        throw Object.assign(new Error('disk full'), { code: 'ENOSPC' });
      },
    });
    const strict = defineTool({ ...broken, name: 'strict', onError: 'throw', retry: { maxAttempts: 1 } });
    const wf = engine.workflow({ name: unique('tool-fails') }, async (ctx) => {
      const observed = await ctx.callTool(broken, {});
      try {
        await ctx.callTool(strict, {});
        return [observed, 'no error'];
      } catch (error) {
        return [observed, (error as { code: string }).code];
      }
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.output).toEqual([
      {
        ok: false,
        error: { code: 'TOOL_FAILED', message: 'broken failed: disk full', details: { errorName: 'Error', errorCode: 'ENOSPC' } },
      },
      'STEP_FAILED',
    ]);
    expect(attempts).toBe(3);
  });
  it('a result over the payload limit is TOOL_FAILED with PAYLOAD_TOO_LARGE (until results are stored by reference)', async () => {
    const engine = createTestEngine({ connectionString: t.db.url, clock: createTestClock('2030-01-01T00:00:00Z'), maxPayloadBytes: 1_000 });
    engines.push(engine);
    const dump = defineTool({
      name: 'dump',
      description: 'Returns a lot',
      input: z.object({}),
      sideEffect: 'none',
      run: async () => 'x'.repeat(2_000),
    });
    const wf = engine.workflow({ name: unique('tool-too-large') }, async (ctx) => ctx.callTool(dump, {}));
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({
      status: 'SUCCEEDED',
      output: { ok: false, error: { code: 'TOOL_FAILED', details: { errorCode: 'PAYLOAD_TOO_LARGE' } } },
    });
  });
});

describe("sideEffects 'external' and 'idempotent': the operation ledger", () => {
  it('an external call goes through the ledger under the key derived from the run and its position', async () => {
    const { engine } = testEngine();
    const wf = engine.workflow({ name: unique('tool-external') }, async (ctx) => {
      await ctx.step('before', () => 1);
      return ctx.callTool(ticketTool(service.url), { title: 'first' });
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const key = `${handle.runId}:1:create_ticket`;
    const run = await engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED', output: { ok: true, result: { id: service.tickets.get(key) } } });
    expect(await operations(handle.runId)).toEqual([
      {
        seq: 1,
        name: 'tool:create_ticket',
        idempotency_key: key,
        status: 'SUCCEEDED',
        attempts: 1,
        external_resource_id: service.tickets.get(key),
        result: { id: service.tickets.get(key) },
      },
    ]);
    expect(service.calls.get(key)).toBe(1);
  });

  it('a provider refusal is the observation TOOL_FAILED and the ledger row FAILED; the model may try again under a new key', async () => {
    const { engine } = testEngine();
    const wf = engine.workflow({ name: unique('tool-refused') }, async (ctx) => {
      service.reject(true);
      const refused = await ctx.callTool(ticketTool(service.url), { title: 'refused' });
      service.reject(false);
      const again = await ctx.callTool(ticketTool(service.url), { title: 'again' });
      return [refused, again];
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const run = await engine.getRun(handle.runId);
    expect(run?.output).toMatchObject([
      { ok: false, error: { code: 'TOOL_FAILED', details: { errorCode: 'TICKET_REJECTED' } } },
      { ok: true, result: { id: expect.any(String) } },
    ]);
    expect((await operations(handle.runId)).map((o) => [o.idempotency_key, o.status])).toEqual([
      [`${handle.runId}:0:create_ticket`, 'FAILED'],
      [`${handle.runId}:1:create_ticket`, 'SUCCEEDED'],
    ]);
  });

  it('a key from the arguments (tool.idempotencyKey): a repeat in the run is DUPLICATE_TOOL_CALL, the provider is called once', async () => {
    const { engine } = testEngine();
    const merges: number[] = [];
    const tag = unique('merge');
    const merge = defineTool({
      name: 'merge_pr',
      description: 'Merges a pull request',
      input: z.object({ pr: z.number().int() }),
      sideEffect: 'external',
      idempotencyKey: ({ pr }) => `pr-${pr}-${tag}`,
      run: async ({ pr }, { idempotencyKey }) => (merges.push(pr), { merged: pr, key: idempotencyKey }),
    });
    const wf = engine.workflow({ name: unique('tool-business-key') }, async (ctx) => {
      const first = await ctx.callTool(merge, { pr: 7 });
      const repeat = await ctx.callTool(merge, { pr: 7 });
      const given = await ctx.callTool(merge, { pr: 8 }, { idempotencyKey: `given-${ctx.runId}` });
      return [first, repeat, given];
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    const key = `pr-7-${tag}`;
    const run = await engine.getRun(handle.runId);
    expect(run?.status).toBe('SUCCEEDED');
    expect(run?.output).toEqual([
      { ok: true, result: { merged: 7, key } },
      {
        ok: false,
        error: {
          code: 'DUPLICATE_TOOL_CALL',
          message: expect.stringContaining(`merge_pr was already called in this run with idempotency key "${key}" (step 1, SUCCEEDED)`),
          details: { idempotencyKey: key, operationId: expect.any(String), seq: 1, status: 'SUCCEEDED', result: { merged: 7, key } },
        },
      },
      { ok: true, result: { merged: 8, key: `given-${handle.runId}` } },
    ]);
    expect(merges).toEqual([7, 8]);
    expect((await operations(handle.runId)).map((o) => [o.seq, o.idempotency_key])).toEqual([
      [1, key],
      [4, `given-${handle.runId}`],
    ]);
    // Each business-keyed call first records its key check as a step.
    expect((await steps(handle.runId)).map((s) => [s.seq, s.name, s.kind])).toEqual([
      [0, 'tool:merge_pr:key', 'step'],
      [1, 'tool:merge_pr', 'operation'],
      [2, 'tool:merge_pr:key', 'step'],
      [3, 'tool:merge_pr:key', 'step'],
      [4, 'tool:merge_pr', 'operation'],
    ]);
  });

  it("'idempotent': an outcome lost in a crash is settled by calling again with the same key", async () => {
    const { engine: doomedEngine, clock } = testEngine({ when: 'after-call', step: 'tool:upsert' });
    const calls: string[] = [];
    const define = (engine: Engine) => {
      const upsert = defineTool({
        name: 'upsert',
        description: 'Writes a record (safe to repeat with the same key)',
        input: z.object({ value: z.number() }),
        sideEffect: 'idempotent',
        run: async ({ value }, { idempotencyKey }) => (calls.push(idempotencyKey), { stored: value }),
      });
      return engine.workflow({ name: 'tool-idempotent', queue: 'tool-idempotent' }, async (ctx) => ctx.callTool(upsert, { value: 5 }));
    };
    const handle = await doomedEngine.start(define(doomedEngine), undefined);
    const doomed = await doomedEngine.runWorker({ manual: true, leaseMs: 30_000, queues: ['tool-idempotent'] });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    const survivorEngine = createTestEngine({ connectionString: t.db.url, clock });
    engines.push(survivorEngine);
    define(survivorEngine);
    clock.advance('31s');
    await (await survivorEngine.runWorker({ manual: true, leaseMs: 30_000, queues: ['tool-idempotent'] })).drain();
    expect(await survivorEngine.getRun(handle.runId)).toMatchObject({ status: 'SUCCEEDED', output: { ok: true, result: { stored: 5 } } });
    const key = `${handle.runId}:0:upsert`;
    expect(calls).toEqual([key, key]);
    expect(await operations(handle.runId)).toMatchObject([{ idempotency_key: key, status: 'SUCCEEDED', attempts: 2 }]);
  });

  it('compensate gets the result and the arguments when the run later fails; once', async () => {
    const { engine } = testEngine();
    const undone: unknown[] = [];
    const reserve = defineTool({
      name: 'reserve',
      description: 'Reserves a seat',
      input: z.object({ seat: z.string() }),
      sideEffect: 'external',
      run: async ({ seat }) => ({ reservation: `R-${seat}` }),
      compensate: async ({ result, args, idempotencyKey }) => void undone.push({ result, args, idempotencyKey }),
    });
    const wf = engine.workflow({ name: unique('tool-compensate') }, async (ctx) => {
      await ctx.callTool(reserve, { seat: '12A' });
      throw new Error('the trip was cancelled');
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'FAILED' });
    // The compensation has a key of its own, derived from the call's.
    expect(undone).toEqual([
      { result: { reservation: 'R-12A' }, args: { seat: '12A' }, idempotencyKey: `${handle.runId}:0:reserve:compensate` },
    ]);
  });
});

describe('a crash between an external call and its checkpoint, with real worker processes', () => {
  const { processes } = stoppedAfterEach();
  async function agentWorker(env: Record<string, string> = {}): Promise<WorkerProcess> {
    const w = await spawnWorker(
      { DATABASE_URL: t.db.url, LEASE_MS: '1000', ...env },
      new URL('../fixtures/agent-worker.ts', import.meta.url).pathname,
    );
    processes.push(w);
    onTestFailed(() => console.error(`--- agent worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
    return w;
  }

  it('the worker is SIGKILLed after the ticket service acted: the next worker reconciles, the service was called once', async () => {
    const starter = t.newEngine();
    const { ticketAgent } = defineAgentWorkflows(starter);
    const handle = await starter.start(ticketAgent, { service: service.url });
    const key = `${handle.runId}:0:create_ticket`;

    const doomed = await agentWorker({ RUNLEDGER_FAILPOINTS: 'after-call:tool:create_ticket' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    expect(service.calls.get(key)).toBe(1);
    expect(await operations(handle.runId)).toMatchObject([{ idempotency_key: key, status: 'STARTED' }]);

    await agentWorker();
    const result = await handle.result({ timeoutMs: 30_000 });
    expect(result).toEqual({ ok: true, result: { id: service.tickets.get(key) } });
    expect(service.calls.get(key)).toBe(1);
    expect(await operations(handle.runId)).toMatchObject([
      { idempotency_key: key, status: 'SUCCEEDED', attempts: 1, external_resource_id: service.tickets.get(key) },
    ]);
    const unknown = await t.db.pool.query(
      `select count(*)::int as n from runledger.events where run_id = $1 and kind = 'operation_unknown'`,
      [handle.runId],
    );
    expect(unknown.rows[0].n).toBe(1);
  });
});

describe('approvals', () => {
  const deploy = (calls: string[]) =>
    defineTool({
      name: 'deploy',
      description: 'Deploys a service to an environment',
      input: z.object({ service: z.string(), env: z.enum(['staging', 'production']) }),
      sideEffect: 'external',
      needsApproval: ({ env }) => env === 'production',
      approvers: ['senior'],
      run: async ({ service: s, env }) => (calls.push(`${s}@${env}`), { deployed: `${s}@${env}` }),
    });
  const pendingRequest = async (runId: string) =>
    (await t.db.pool.query('select request_id, action, evidence, approvers from runledger.approvals where run_id = $1', [runId])).rows[0];

  it('needsApproval waits (holding no worker) for a decision with the arguments as evidence; approved, the tool runs', async () => {
    const { engine } = testEngine();
    const calls: string[] = [];
    const wf = engine.workflow({ name: unique('tool-approved') }, async (ctx) => {
      const staging = await ctx.callTool(deploy(calls), { service: 'api', env: 'staging' });
      const production = await ctx.callTool(deploy(calls), { service: 'api', env: 'production' });
      return [staging, production];
    });
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'WAITING', waitKind: 'approval' });
    expect(calls).toEqual(['api@staging']);
    const request = await pendingRequest(handle.runId);
    expect(request).toMatchObject({
      action: 'deploy',
      evidence: { tool: 'deploy', arguments: { service: 'api', env: 'production' } },
      approvers: ['senior'],
    });
    await t.db.pool.query(`select runledger.decide_approval($1, true, 'senior', 'go')`, [request.request_id]);
    await worker.drain();
    const run = await engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED' });
    expect(run?.output).toEqual([
      { ok: true, result: { deployed: 'api@staging' } },
      { ok: true, result: { deployed: 'api@production' } },
    ]);
    expect(calls).toEqual(['api@staging', 'api@production']);
    expect((await steps(handle.runId)).map((s) => [s.name, s.kind])).toEqual([
      ['tool:deploy', 'operation'],
      ['tool:deploy:approval', 'approval'],
      ['tool:deploy', 'operation'],
    ]);
  });

  it('a rejection is the observation TOOL_REJECTED (with who and why); nothing is called or put in the ledger', async () => {
    const { engine } = testEngine();
    const calls: string[] = [];
    const wf = engine.workflow({ name: unique('tool-rejected') }, async (ctx) =>
      ctx.callTool(deploy(calls), { service: 'db', env: 'production' }),
    );
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    const request = await pendingRequest(handle.runId);
    await t.db.pool.query(`select runledger.decide_approval($1, false, 'senior', 'not on a Friday')`, [request.request_id]);
    await worker.drain();
    const run = await engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED' });
    expect(run?.output).toEqual({
      ok: false,
      error: {
        code: 'TOOL_REJECTED',
        message: 'senior rejected the call of deploy: not on a Friday',
        details: { decidedBy: 'senior', note: 'not on a Friday', requestId: request.request_id },
      },
    });
    expect(calls).toEqual([]);
    expect(await operations(handle.runId)).toEqual([]);
  });

  it('an approval that expires undecided is TOOL_REJECTED too', async () => {
    const { engine, clock } = testEngine();
    const calls: string[] = [];
    const hasty = defineTool({ ...deploy(calls), name: 'hasty_deploy', approvalTimeout: '10m', needsApproval: true });
    const wf = engine.workflow({ name: unique('tool-expired') }, async (ctx) => ctx.callTool(hasty, { service: 'x', env: 'staging' }));
    const handle = await engine.start(wf, undefined);
    const worker = await engine.runWorker({ manual: true });
    await worker.drain();
    clock.advance('11m');
    await worker.drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({
      status: 'SUCCEEDED',
      output: { ok: false, error: { code: 'TOOL_REJECTED', details: { expired: true } } },
    });
    expect(calls).toEqual([]);
  });
});

describe('bad input', () => {
  const input = z.object({ x: z.number() });
  const run = async () => 1;
  it('defineTool refuses a bad contract with CONFIG', () => {
    const bad: Array<Record<string, unknown>> = [
      { name: 'has space', description: 'd', input, sideEffect: 'none', run },
      { name: 'x'.repeat(65), description: 'd', input, sideEffect: 'none', run },
      { name: 't', description: '', input, sideEffect: 'none', run },
      { name: 't', description: 'd', input: { type: 'object' }, sideEffect: 'none', run },
      { name: 't', description: 'd', input, sideEffect: 'sometimes', run },
      { name: 't', description: 'd', input, sideEffect: 'none' },
      { name: 't', description: 'd', input, sideEffect: 'none', run, reconcile: async () => ({ status: 'unknown' }) },
      { name: 't', description: 'd', input, sideEffect: 'none', run, idempotencyKey: () => 'k' },
      { name: 't', description: 'd', input, sideEffect: 'external', run, compensate: 'undo' },
      { name: 't', description: 'd', input, sideEffect: 'external', run, needsApproval: 'yes' },
      { name: 't', description: 'd', input, sideEffect: 'external', run, approvers: 'senior' },
      { name: 't', description: 'd', input, sideEffect: 'external', run, approvalTimeout: 'soon' },
      { name: 't', description: 'd', input, sideEffect: 'external', run, onError: 'ignore' },
      // No JSON schema to show the model.
      { name: 't', description: 'd', input: z.object({ when: z.date() }), sideEffect: 'none', run },
    ];
    for (const definition of bad) {
      expect(() => defineTool(definition as never), JSON.stringify(definition)).toThrow(expect.objectContaining({ code: 'CONFIG' }));
    }
  });

  it('ctx.callTool with something that is not a tool, or a bad key: CONFIG, and nothing is recorded', async () => {
    const { engine } = testEngine();
    const none = defineTool({ name: 'n', description: 'd', input, sideEffect: 'none', run });
    const ext = defineTool({ name: 'e', description: 'd', input, sideEffect: 'external', run });
    const keyed = defineTool({ name: 'k', description: 'd', input, sideEffect: 'external', run, idempotencyKey: () => '' });
    const attempts = [
      (ctx: any) => ctx.callTool({ name: 'fake', run }, { x: 1 }),
      (ctx: any) => ctx.callTool(none, { x: 1 }, { idempotencyKey: 'k' }),
      (ctx: any) => ctx.callTool(ext, { x: 1 }, { idempotencyKey: 42 }),
      (ctx: any) => ctx.callTool(keyed, { x: 1 }),
      (ctx: any) => ctx.callTool(ext, { x: 1 }, { name: '' }),
    ];
    const wf = engine.workflow({ name: unique('tool-bad-input') }, async (ctx) => {
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
    expect(await operations(handle.runId)).toEqual([]);
  });
});

/**
 * These need the lead's ctx.chargeNow, ctx.budget.remaining and budgets in several
 * dimensions (limits.budget as { toolCalls }); they fail until those land.
 */
describe('budgets (needs ctx.chargeNow and ctx.budget.remaining)', () => {
  it('every call charges toolCalls (a bad argument too); past the limit the run ends BUDGET before the next tool runs', async () => {
    const { engine } = testEngine();
    const ran: number[] = [];
    const count = defineTool({
      name: 'count',
      description: 'Counts',
      input: z.object({ n: z.number() }),
      sideEffect: 'none',
      run: async ({ n }) => (ran.push(n), n),
    });
    const wf = engine.workflow({ name: unique('tool-budget'), limits: { budget: { toolCalls: 2 } as never } }, async (ctx) => {
      await ctx.callTool(count, { n: 'one' });
      await ctx.callTool(count, { n: 2 });
      await ctx.callTool(count, { n: 3 });
      return 'not reached';
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'TERMINATED', terminationReason: 'BUDGET' });
    expect(ran).toEqual([2]);
  });

  it('an external tool with no call left in the budget: the run ends before a ledger intent is recorded', async () => {
    const { engine } = testEngine();
    const wf = engine.workflow({ name: unique('tool-budget-ledger'), limits: { budget: { toolCalls: 1 } as never } }, async (ctx) => {
      await ctx.callTool(ticketTool(service.url), { title: 'one' });
      await ctx.callTool(ticketTool(service.url), { title: 'two' });
      return 'not reached';
    });
    const handle = await engine.start(wf, undefined);
    await (await engine.runWorker({ manual: true })).drain();
    expect(await engine.getRun(handle.runId)).toMatchObject({ status: 'TERMINATED', terminationReason: 'BUDGET' });
    expect((await operations(handle.runId)).map((o) => o.status)).toEqual(['SUCCEEDED']);
  });
});
