import { randomBytes } from 'node:crypto';
import { afterAll, describe, expect, it } from 'vitest';
import {
  aesGcmCodec,
  createEngine,
  defineTool,
  scriptedModel,
  isAesGcmEnvelope,
  loadLarge,
  storeLarge,
  type Engine,
  type EngineOptions,
  type JsonValue,
  type MigrationArgs,
  type PayloadCodec,
  type Worker,
} from '../../../src/index.js';
import { z } from 'zod';
import { Payloads } from '../../../src/engine/core/payloads.js';
import { cliCodec } from '../../../src/cli/shared.js';
import { startConsole } from '../../../src/console/server.js';
import { createTestClock, createTestEngine, type TestClock } from '../../../src/testing/index.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { waitFor } from '../../helpers/database.js';
import { whereStored as storedIn } from '../../helpers/where-stored.js';

/**
 * The payload codec (createEngine({ codec }), aesGcmCodec): every user payload is stored as
 * the codec's envelope and read back in clear; nothing the engine writes copies a clear
 * payload; keys rotate without rewriting rows; a worker lacking a key gives the run back
 * unchanged; rows written before the codec still read. In-process, on a test clock with
 * manual workers, so every wait and crash is deterministic.
 */
const t = useTestEngine({ engine: false });
const { db } = t;
const engines: Engine[] = [];
afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
});

const K1 = randomBytes(32);
const K2 = randomBytes(32).toString('base64');
const k1Only = () => aesGcmCodec({ keys: { k1: K1 }, activeKey: 'k1' });
const k1k2 = () => aesGcmCodec({ keys: { k1: K1, k2: K2 }, activeKey: 'k2' });
const k2Only = () => aesGcmCodec({ keys: { k2: K2 }, activeKey: 'k2' });
const clock: TestClock = createTestClock('2030-01-01T00:00:00Z');

function engineWith(options: Partial<EngineOptions> = {}): Engine {
  const engine = createTestEngine({ connectionString: db.url, clock, ...options });
  engines.push(engine);
  return engine;
}

const one = async <T = Record<string, unknown>>(text: string, values: unknown[] = []) => (await db.pool.query(text, values)).rows[0] as T;

const model = scriptedModel('codec-model', (messages) => ({ content: `answer: ${String(messages.at(-1)?.content)}` }), {
  streamChunkSize: 1_000,
});
const echo = defineTool({
  name: 'echo',
  description: 'echoes',
  input: z.object({ text: z.string() }),
  sideEffect: 'none',
  run: async (args) => ({ echoed: args.text }),
});
const file = defineTool({
  name: 'file',
  description: 'files a ticket',
  input: z.object({ text: z.string() }),
  sideEffect: 'external',
  run: async (args) => ({ filed: args.text }),
});

function markerWorkflows(engine: Engine) {
  const child = engine.workflow({ name: 'codec-child' }, async (ctx, input: { secret: string }) => {
    return ctx.step('child-step', () => ({ child: input.secret }));
  });
  const main = engine.workflow(
    {
      name: 'codec-marker',
      verify: (output) => ({ ok: true, evidence: { saw: (output as { echo: string }).echo } }),
    },
    async (ctx, input: { secret: string; pad: string }) => {
      const stepped = await ctx.step('load', async ({ heartbeat }) => {
        await heartbeat({ progress: input.secret });
        return { secret: input.secret, pad: input.pad };
      });
      const tx = await ctx.transaction('tx', async () => ({ tx: input.secret }));
      const op = await ctx.operation('charge', { idempotencyKey: `codec-charge-${ctx.runId}` }, async () => ({ receipt: input.secret }));
      const stream = ctx.stream('out');
      await stream.write({ text: input.secret });
      await stream.close();
      const session = await ctx.session(`codec-session-${ctx.runId}`);
      await session.append([{ role: 'user', content: { said: input.secret } }]);
      const history = await session.history();
      await session.release();
      const artifact = await ctx.artifact('report', `report ${input.secret}`);
      const large = await ctx.step('large', () => storeLarge(ctx, 'large', { blob: `${input.secret}${'x'.repeat(70_000)}` }));
      const loaded = (await loadLarge(ctx, large)) as { blob: string };
      const fromChild = await ctx.runChild(child, { secret: input.secret });
      const decision = await ctx.requestApproval('ship-it', {
        action: `ship ${input.secret}`,
        evidence: { secret: input.secret },
        approvers: ['ops'],
      });
      const reply = await ctx.waitForSignal<{ reply: string }>('reply');
      // The agent layer: a model call streaming its reply (topic model), a tool, a tool through the ledger.
      const generated = await ctx.generate(model, { messages: [{ role: 'user', content: input.secret }] });
      const echoed = await ctx.callTool(echo, { text: input.secret });
      const filed = await ctx.callTool(file, { text: input.secret });
      return {
        echo: input.secret,
        stepped: stepped.secret,
        tx: tx.tx,
        op: op.receipt,
        history: history.map((e) => e.content),
        artifactId: artifact.artifactId,
        loaded: loaded.blob.slice(0, input.secret.length),
        child: fromChild.child,
        note: decision?.note,
        reply: reply?.reply,
        generated: generated.message.content,
        echoed: echoed.ok ? echoed.result.echoed : null,
        filed: filed.ok ? filed.result.filed : null,
      };
    },
  );
  const unverified = engine.workflow(
    {
      name: 'codec-unverified',
      verify: (output) => ({ ok: false, reason: 'refused by the test', evidence: { secret: (output as { secret: string }).secret } }),
    },
    async (_ctx, input: { secret: string }) => ({ secret: input.secret }),
  );
  const resolved = engine.workflow({ name: 'codec-resolved' }, async (ctx) => {
    const paid = await ctx.operation('pay', { idempotencyKey: `codec-pay-${ctx.runId}` }, async () => ({ paid: 'by the call' }));
    return paid;
  });
  // reconcile answers the outside world's data in no known shape: the step fails, the ledger stays UNKNOWN.
  const reconciled = engine.workflow({ name: 'codec-reconcile' }, async (ctx, input: { secret: string }) =>
    ctx.operation(
      'settle',
      {
        idempotencyKey: `codec-settle-${ctx.runId}`,
        reconcile: async () => ({ status: 'settled', by: input.secret }) as never,
      },
      async () => ({ settled: true }),
    ),
  );
  // A misused ctx call given the run's data: the run fails with the engine's error.
  const misused = engine.workflow({ name: 'codec-misused' }, async (ctx, input: { secret: string }) => {
    await ctx.progress(input.secret as never);
    return 'not reached';
  });
  return { child, main, unverified, resolved, reconciled, misused };
}

/** Runs codec-reconcile on a worker that dies after the call (the ledger row stays STARTED), then on `worker`: reconcile's answer is invalid. */
async function invalidReconcile(options: Partial<EngineOptions>, worker: Worker, secret: string): Promise<string> {
  const crashing = engineWith({ ...options, crashAt: { step: 'settle', when: 'after-call' } });
  const { reconciled } = markerWorkflows(crashing);
  const handle = await crashing.start(reconciled, { secret });
  await (await crashing.runWorker({ manual: true, leaseMs: 30_000 })).drain();
  clock.advance('31s');
  await worker.drain();
  const run = await one<{ status: string; op: string; error: { message: string; code: string } }>(
    `select r.status, (select status from runledger.operations o where o.run_id = r.run_id) as op,
            (select error from runledger.steps s where s.run_id = r.run_id and s.name = 'settle') as error
       from runledger.runs r where r.run_id = $1`,
    [handle.runId],
  );
  expect(run).toMatchObject({ status: 'FAILED', op: 'UNKNOWN', error: { code: 'INVALID_RECONCILE_ANSWER' } });
  return run.error.message;
}

describe('with aesGcmCodec on', () => {
  it('stores every payload as an envelope, copies none in clear, and reads each back through the engine', async () => {
    const MARKER = `MARKER-${randomBytes(8).toString('hex')}`;
    const engine = engineWith({ codec: k1Only() });
    const { main, unverified, resolved, misused } = markerWorkflows(engine);
    const worker = await engine.runWorker({ manual: true, leaseMs: 30_000 });

    const handle = await engine.start(main, { secret: MARKER, pad: 'p'.repeat(1_000) });
    await worker.drain();
    const request = await one<{ request_id: string }>('select request_id from runledger.approvals where run_id = $1', [handle.runId]);
    const inbox = await one<{ action: string }>('select action from runledger.approval_inbox where request_id = $1', [request.request_id]);
    expect(JSON.parse(inbox.action)).toMatchObject({ $enc: 'k1' });
    // getRun reads the waiting approval's spec in clear.
    const waitingRun = await engine.getRun(handle.runId);
    expect(waitingRun?.steps?.find((step) => step.name === 'ship-it')?.output).toMatchObject({
      spec: { action: `ship ${MARKER}`, evidence: { secret: MARKER } },
    });
    // The console with the keys shows what is asked in clear.
    const ui = await startConsole({ pool: db.pool, port: 0, codec: k1Only() });
    try {
      const page = await (await fetch(`${ui.url}/approvals`)).text();
      expect(page).toContain(`<strong>ship ${MARKER}</strong>`);
    } finally {
      await ui.close();
    }
    const decision = await engine.decideApproval(request.request_id, { approved: true, decidedBy: 'ops', note: `note ${MARKER}` });
    expect(decision).toMatchObject({ recorded: true, approved: true, note: `note ${MARKER}` });
    await worker.drain();
    expect(await engine.signal(handle.runId, 'reply', { reply: MARKER })).toBe(true);
    await worker.drain();

    const output = await handle.result({ timeoutMs: 5_000 });
    expect(output).toEqual({
      echo: MARKER,
      stepped: MARKER,
      tx: MARKER,
      op: MARKER,
      history: [{ said: MARKER }],
      artifactId: expect.any(String),
      loaded: MARKER,
      child: MARKER,
      note: `note ${MARKER}`,
      reply: MARKER,
      generated: `answer: ${MARKER}`,
      echoed: MARKER,
      filed: MARKER,
    });

    // Read back through the engine: the run, its checkpoints and ledger, its stream, its artifact.
    const run = await engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED', input: { secret: MARKER }, output: { echo: MARKER } });
    expect(run?.terminationEvidence).toMatchObject({ verification: { saw: MARKER } });
    const byName = Object.fromEntries(run!.steps!.map((s) => [s.name, s.output]));
    expect(byName.load).toEqual({ secret: MARKER, pad: 'p'.repeat(1_000) });
    expect(byName.charge).toMatchObject({ value: { receipt: MARKER } });
    expect(byName.reply).toMatchObject({ payload: { reply: MARKER } });
    expect(byName['ship-it']).toMatchObject({ approved: true, note: `note ${MARKER}` });
    expect(byName['child:codec-child']).toMatchObject({ status: 'SUCCEEDED', output: { child: MARKER } });
    expect(run!.operations![0]).toMatchObject({ name: 'charge', result: { receipt: MARKER } });
    const chunks = [];
    for await (const chunk of engine.readStream(handle.runId, 'out')) chunks.push(chunk.chunk);
    expect(chunks).toEqual([{ text: MARKER }]);
    const modelChunks = [];
    for await (const chunk of engine.readStream(handle.runId, 'model')) modelChunks.push(chunk.chunk);
    expect(modelChunks).toEqual([{ delta: `answer: ${MARKER}`, model: 'codec-model', step: 'generate:codec-model' }]);
    const artifact = await engine.readArtifact(output.artifactId);
    expect(artifact?.content?.toString('utf8')).toBe(`report ${MARKER}`);
    const children = await engine.listRuns({ workflow: 'codec-child' });
    expect(children[0]).toMatchObject({ input: { secret: MARKER }, output: { child: MARKER } });

    // verify's evidence of a refused output, and an operator's result for an UNKNOWN operation.
    const refused = await engine.start(unverified, { secret: MARKER });
    await worker.drain();
    const refusedRun = await engine.getRun(refused.runId);
    expect(refusedRun).toMatchObject({ status: 'FAILED', terminationReason: 'UNVERIFIED' });
    expect(refusedRun?.terminationEvidence).toEqual({ reason: 'refused by the test', evidence: { secret: MARKER } });
    const crashing = engineWith({ codec: k1Only(), crashAt: { step: 'pay', when: 'after-call' } });
    markerWorkflows(crashing);
    const unknown = await crashing.start(resolved, undefined);
    await (await crashing.runWorker({ manual: true, leaseMs: 30_000 })).drain();
    clock.advance('31s');
    await worker.drain();
    const op = await one<{ operation_id: string; status: string }>(
      'select operation_id, status from runledger.operations where run_id = $1',
      [unknown.runId],
    );
    expect(op.status).toBe('UNKNOWN');
    await engine.resolveOperation(op.operation_id, { status: 'SUCCEEDED', result: { paid: MARKER }, resolvedBy: 'ops' });
    await worker.drain();
    expect(await engine.getRun(unknown.runId)).toMatchObject({ status: 'SUCCEEDED', output: { paid: MARKER } });

    // An invalid reconcile answer holding the marker: the error describes it and quotes nothing.
    const invalid = await invalidReconcile({ codec: k1Only() }, worker, MARKER);
    expect(invalid).toContain('answered an object whose status is none of the three (not quoted: the payload codec is on)');
    // ctx.progress given the marker itself: the run's error names its type.
    const misuse = await engine.start(misused, { secret: MARKER });
    await worker.drain();
    expect(await engine.getRun(misuse.runId)).toMatchObject({
      status: 'FAILED',
      error: { code: 'CONFIG', message: expect.stringContaining('not a string') },
    });

    // Nowhere in the schema in clear, not in one text, json, jsonb, text[] or bytea column.
    expect(await storedIn(db.pool, MARKER)).toEqual([]);

    // What psql and the views show: envelopes naming the key, as JSON.
    const stored = await one<Record<string, unknown>>(
      `select r.input, r.output, r.termination_evidence->'verification' as verification,
              (select output from runledger.steps where run_id = r.run_id and name = 'load') as load,
              (select output->'value' from runledger.steps where run_id = r.run_id and name = 'charge') as charge,
              (select result from runledger.operations where run_id = r.run_id and name = 'charge') as result,
              (select payload from runledger.signals where run_id = r.run_id) as payload,
              (select evidence from runledger.approvals where run_id = r.run_id) as evidence,
              (select chunk from runledger.stream_chunks where run_id = r.run_id and topic = 'out') as chunk,
              (select content from runledger.session_entries where run_id = r.run_id) as content,
              (select progress from runledger.step_progress where run_id = r.run_id limit 1) as progress,
              (select c.input from runledger.runs c where c.parent_run_id = r.run_id) as child_input
         from runledger.runs r where r.run_id = $1`,
      [handle.runId],
    );
    for (const [column, value] of Object.entries(stored)) {
      expect(isAesGcmEnvelope(value), `${column}: ${JSON.stringify(value)}`).toBe(true);
      expect((value as { $enc: string }).$enc).toBe('k1');
    }
    const note = await one<{ note: string }>('select note from runledger.approvals where run_id = $1', [handle.runId]);
    expect(JSON.parse(note.note)).toMatchObject({ $enc: 'k1' });
    const blob = await one<{ text: string }>(
      "select convert_from(b.content, 'UTF8') as text from runledger.artifacts a join runledger.artifact_blobs b on b.sha256 = a.blob where a.artifact_id = $1",
      [output.artifactId],
    );
    expect(JSON.parse(blob.text)).toMatchObject({ $enc: 'k1' });

    // The scan finds what is there: the same paths without a codec leave the marker in clear.
    const CONTROL = `CONTROL-${randomBytes(8).toString('hex')}`;
    const clear = engineWith();
    const plain = markerWorkflows(clear);
    const plainWorker = await clear.runWorker({ manual: true, leaseMs: 30_000 });
    const control = await clear.start(plain.main, { secret: CONTROL, pad: '' });
    await plainWorker.drain();
    const controlRequest = await one<{ request_id: string }>('select request_id from runledger.approvals where run_id = $1', [
      control.runId,
    ]);
    await clear.decideApproval(controlRequest.request_id, { approved: true, decidedBy: 'ops', note: CONTROL });
    await plainWorker.drain();
    await clear.signal(control.runId, 'reply', { reply: CONTROL });
    await plainWorker.drain();
    expect((await clear.getRun(control.runId))?.status).toBe('SUCCEEDED');
    expect(await invalidReconcile({}, plainWorker, CONTROL)).toContain(`"by":"${CONTROL}"`);
    expect(await storedIn(db.pool, CONTROL)).toEqual(
      expect.arrayContaining([
        'runs.input',
        'runs.output',
        'steps.output',
        'operations.result',
        'signals.payload',
        'approvals.action',
        'approvals.evidence',
        'approvals.note',
        'stream_chunks.chunk',
        'session_entries.content',
        'step_progress.progress',
        'artifact_blobs.content',
        'events.detail', // the decision's note, in approval_decided
        'audit_log.arguments', // and in decide_approval's record
        'steps.error', // the invalid reconcile answer, quoted without a codec
        'runs.error',
      ]),
    );
  });
});

describe('a run its own process executes', () => {
  it("engine.start's handle gets the clear output from the execution that committed it", async () => {
    const engine = createTestEngine({ connectionString: db.url, codec: k1Only() });
    engines.push(engine);
    const flow = engine.workflow({ name: 'codec-local', queue: 'codec-local' }, async (ctx, input: { secret: string }) => {
      const step = await ctx.step('s', () => ({ inStep: input.secret }));
      return { ...step, out: input.secret };
    });
    const worker = await engine.runWorker({ queues: ['codec-local'], leaseMs: 5_000 });
    try {
      const handles = await Promise.all([1, 2, 3].map((n) => engine.start(flow, { secret: `local ${n}` })));
      for (const [i, handle] of handles.entries()) {
        expect(await handle.result({ timeoutMs: 10_000 })).toEqual({ inStep: `local ${i + 1}`, out: `local ${i + 1}` });
        expect(await one(`select output->>'$enc' as key from runledger.runs where run_id = $1`, [handle.runId])).toEqual({ key: 'k1' });
      }
    } finally {
      await worker.stop();
    }
  });
});

describe('keys', () => {
  const rotating = (engine: Engine) =>
    engine.workflow({ name: 'codec-rotate' }, async (ctx, input: { n: number }) => {
      const first = await ctx.step('first', () => ({ n: input.n, secret: `s${input.n}` }));
      const reply = input.n === 0 ? await ctx.waitForSignal<{ more: string }>('more') : null;
      return { ...first, reply: reply?.more ?? null };
    });

  it('rotate: runs written with k1 and with k2 all read back; each envelope names its key', async () => {
    const old = engineWith({ codec: k1Only() });
    const oldFlow = rotating(old);
    const oldWorker = await old.runWorker({ manual: true, leaseMs: 30_000 });
    const waiting = await old.start(oldFlow, { n: 0 }); // waits on a signal across the rotation
    const before = [await old.start(oldFlow, { n: 1 }), await old.start(oldFlow, { n: 2 })];
    await oldWorker.drain();

    // Every process gets k2 as a known key first (and k1 kept), then k2 becomes the active one.
    const rotated = engineWith({ codec: k1k2() });
    const flow = rotating(rotated);
    const worker = await rotated.runWorker({ manual: true, leaseMs: 30_000 });
    const after = [await rotated.start(flow, { n: 3 }), await rotated.start(flow, { n: 4 })];
    await rotated.signal(waiting.runId, 'more', { more: 'after the rotation' });
    await worker.drain();

    const keyOf = async (runId: string) =>
      one<{ input: string; output: string; first: string }>(
        `select r.input->>'$enc' as input, r.output->>'$enc' as output,
                (select output->>'$enc' from runledger.steps where run_id = r.run_id and name = 'first') as first
           from runledger.runs r where r.run_id = $1`,
        [runId],
      );
    for (const [i, handle] of [...before, ...after].entries()) {
      const n = i + 1;
      expect(await rotated.getRun(handle.runId)).toMatchObject({ input: { n }, output: { n, secret: `s${n}`, reply: null } });
      const key = n <= 2 ? 'k1' : 'k2';
      expect(await keyOf(handle.runId)).toEqual({ input: key, output: key, first: key });
    }
    // The run that waited: written with k1 before, finished with k2; it reads whole.
    expect(await rotated.getRun(waiting.runId)).toMatchObject({
      status: 'SUCCEEDED',
      input: { n: 0 },
      output: { n: 0, secret: 's0', reply: 'after the rotation' },
    });
    expect(await keyOf(waiting.runId)).toEqual({ input: 'k1', output: 'k2', first: 'k1' });
    expect(await one(`select payload->>'$enc' as key from runledger.signals where run_id = $1`, [waiting.runId])).toEqual({ key: 'k2' });
    // An engine with k1 only still reads the old runs.
    expect(await old.getRun(before[0]!.runId)).toMatchObject({ output: { n: 1 } });
  });

  it('a missing key: reads fail with PAYLOAD_KEY_MISSING naming it; a worker without it gives the run back unchanged', async () => {
    const writer = engineWith({ codec: k1Only() });
    const flow = writer.workflow({ name: 'codec-missing' }, async (ctx, input: { secret: string }) => {
      const first = await ctx.step('first', () => {
        firstRuns++;
        return { got: input.secret };
      });
      const reply = await ctx.waitForSignal<string>('go');
      return { ...first, reply };
    });
    let firstRuns = 0;
    const writerWorker = await writer.runWorker({ manual: true, leaseMs: 30_000 });
    const done = await writer.start(flow, { secret: 'k1 secret' });
    await writerWorker.drain();
    await writer.signal(done.runId, 'go', 'now');
    await writerWorker.drain();
    expect(await done.result({ timeoutMs: 5_000 })).toEqual({ got: 'k1 secret', reply: 'now' });

    const lacking = engineWith({ codec: k2Only() });
    const missing = { code: 'PAYLOAD_KEY_MISSING', details: { keyId: 'k1' }, message: expect.stringContaining('"k1"') };
    await expect(lacking.getRun(done.runId)).rejects.toMatchObject(missing);
    await expect(lacking.handle(done.runId).result({ timeoutMs: 5_000 })).rejects.toMatchObject(missing);
    await expect(lacking.listRuns({ workflow: 'codec-missing' })).rejects.toMatchObject(missing);

    // A run with a k1 checkpoint, waiting: the signal comes from a k2 process, and a k2-only worker claims it.
    const waiting = await writer.start(flow, { secret: 'half done' });
    await writerWorker.drain();
    expect(firstRuns).toBe(2);
    const rowsBefore = await one(
      `select r.input::text as input, (select jsonb_agg(s.output order by seq)::text from runledger.steps s where s.run_id = r.run_id) as steps
         from runledger.runs r where r.run_id = $1`,
      [waiting.runId],
    );
    lacking.workflow({ name: 'codec-missing' }, async (ctx) => ctx.step('first', () => 'never'));
    await lacking.signal(waiting.runId, 'go', 'from k2');
    const lackingWorker = await lacking.runWorker({ manual: true, leaseMs: 30_000 });
    expect(await lackingWorker.drain()).toBe(1);
    const released = await one<{ status: string; detail: { reason: string } }>(
      `select r.status, (select detail from runledger.events e where e.run_id = r.run_id and kind = 'released' order by event_id desc limit 1) as detail
         from runledger.runs r where r.run_id = $1`,
      [waiting.runId],
    );
    expect(released.status).toBe('PENDING');
    expect(released.detail.reason).toMatch(/^PAYLOAD_KEY_MISSING: .*"k1"/);
    expect(
      await one(
        `select r.input::text as input, (select jsonb_agg(s.output order by seq)::text from runledger.steps s where s.run_id = r.run_id) as steps
           from runledger.runs r where r.run_id = $1`,
        [waiting.runId],
      ),
    ).toEqual(rowsBefore);

    // A worker with both keys finishes it: the k1 checkpoint replays, the k2 signal is read.
    const both = engineWith({ codec: k1k2() });
    both.workflow({ name: 'codec-missing' }, async (ctx, input: { secret: string }) => {
      const first = await ctx.step('first', () => {
        firstRuns++;
        return { got: 'ran again' };
      });
      return { ...first, reply: await ctx.waitForSignal<string>('go'), input: input.secret };
    });
    clock.advance('5s'); // past the release's delay
    await (await both.runWorker({ manual: true, leaseMs: 30_000 })).drain();
    expect(await both.getRun(waiting.runId)).toMatchObject({
      status: 'SUCCEEDED',
      output: { got: 'half done', reply: 'from k2', input: 'half done' },
    });
    expect(firstRuns).toBe(2);
  });
});

describe('recovery and old rows', () => {
  it('a worker that dies mid-run: the next one replays the encrypted checkpoints, and runs no step twice', async () => {
    const ran: Record<string, number> = {};
    const define = (engine: Engine) =>
      engine.workflow({ name: 'codec-recover' }, async (ctx, input: { secret: string }) => {
        const first = await ctx.step('first', () => {
          ran.first = (ran.first ?? 0) + 1;
          return { first: input.secret, at: 1 };
        });
        const second = await ctx.step('second', () => {
          ran.second = (ran.second ?? 0) + 1;
          return { second: `${first.first}!` };
        });
        return { ...first, ...second };
      });
    const dying = engineWith({ codec: k1Only(), crashAt: { step: 'second', when: 'before-checkpoint' } });
    const flow = define(dying);
    const handle = await dying.start(flow, { secret: 'recovered' });
    const dead = await dying.runWorker({ manual: true, leaseMs: 30_000 });
    await dead.drain();
    expect(dead.crashed).toBe(true);
    const checkpoint = await one<{ output: unknown }>(`select output from runledger.steps where run_id = $1 and name = 'first'`, [
      handle.runId,
    ]);
    expect(checkpoint.output).toMatchObject({ $enc: 'k1' });

    clock.advance('31s');
    const next = engineWith({ codec: k1Only() });
    define(next);
    await (await next.runWorker({ manual: true, leaseMs: 30_000 })).drain();
    expect(await next.getRun(handle.runId)).toMatchObject({
      status: 'SUCCEEDED',
      output: { first: 'recovered', at: 1, second: 'recovered!' },
    });
    expect(ran).toEqual({ first: 1, second: 2 });
  });

  it('rows written before the codec (and clear payloads from psql) read and run on with it', async () => {
    const plain = engineWith();
    const define = (engine: Engine) =>
      engine.workflow({ name: 'codec-legacy' }, async (ctx, input: { old: string }) => {
        const first = await ctx.step('first', () => ({ kept: input.old }));
        const reply = await ctx.waitForSignal<{ said: string }>('reply');
        return { ...first, said: reply?.said };
      });
    const plainFlow = define(plain);
    const plainWorker = await plain.runWorker({ manual: true, leaseMs: 30_000 });
    const finished = await plain.start(plainFlow, { old: 'finished in clear' });
    const waiting = await plain.start(plainFlow, { old: 'waiting in clear' });
    await plainWorker.drain();
    await plain.signal(finished.runId, 'reply', { said: 'clear' });
    await plainWorker.drain();

    const coded = engineWith({ codec: k1Only() });
    define(coded);
    const worker: Worker = await coded.runWorker({ manual: true, leaseMs: 30_000 });
    expect(await coded.getRun(finished.runId)).toMatchObject({
      input: { old: 'finished in clear' },
      output: { kept: 'finished in clear', said: 'clear' },
    });
    // A signal from psql in clear, and a run started from psql with a clear input.
    await db.pool.query(`select runledger.send_signal($1, 'reply', '{"said": "from psql"}'::jsonb)`, [waiting.runId]);
    const fromSql = (await one<{ id: string }>(`select runledger.start_run('codec-legacy', '{"old": "psql input"}'::jsonb) as id`)).id;
    await worker.drain();
    await db.pool.query(`select runledger.send_signal($1, 'reply', '{"said": "again"}'::jsonb)`, [fromSql]);
    await worker.drain();
    expect(await coded.getRun(waiting.runId)).toMatchObject({
      status: 'SUCCEEDED',
      input: { old: 'waiting in clear' },
      output: { kept: 'waiting in clear', said: 'from psql' },
    });
    expect(await coded.getRun(fromSql)).toMatchObject({ status: 'SUCCEEDED', output: { kept: 'psql input', said: 'again' } });
    // Old rows stay as they were; what the codec engine wrote is an envelope.
    const rows = await one<{ input: unknown; first: unknown; output: unknown }>(
      `select r.input, r.output, (select output from runledger.steps where run_id = r.run_id and name = 'first') as first
         from runledger.runs r where r.run_id = $1`,
      [waiting.runId],
    );
    expect(rows.input).toEqual({ old: 'waiting in clear' });
    expect(rows.first).toEqual({ kept: 'waiting in clear' });
    expect(rows.output).toMatchObject({ $enc: 'k1' });
  });
});

describe('migrations', () => {
  it('migrate sees the run in clear, and what it returns is stored encoded', async () => {
    // Real time and a running worker: migrate_run needs a live worker with the migration.
    const engine = createTestEngine({ connectionString: db.url, codec: k1Only() });
    engines.push(engine);
    const v1 = engine.workflow({ name: 'codec-move', version: '1', queue: 'codec-move' }, async (ctx, input: { secret: string }) => {
      const a = await ctx.step('a', () => ({ secret: input.secret }));
      await ctx.waitForSignal('go');
      return ctx.step('b', () => `v1:${a.secret}`);
    });
    let seen: MigrationArgs | undefined;
    engine.workflow(
      {
        name: 'codec-move',
        version: '2',
        queue: 'codec-move',
        input: z.object({ secret: z.string(), moved: z.boolean() }),
        migrations: {
          '1': (args) => {
            seen = args;
            const a = args.checkpoints[0]!;
            return {
              input: { ...(args.input as object), moved: true },
              checkpoints: [{ ...a, output: { secret: `${(a.output as { secret: string }).secret}+` } }, args.checkpoints[1]!],
            };
          },
        },
      },
      async (ctx, input) => {
        const a = await ctx.step('a', () => ({ secret: 'never' }));
        const go = await ctx.waitForSignal<string>('go');
        return ctx.step('b2', () => `v2:${input.moved}:${a.secret}:${go}`);
      },
    );
    const worker = await engine.runWorker({ queues: ['codec-move'], leaseMs: 5_000 });
    try {
      const handle = await engine.start(v1, { secret: 'moving' });
      await waitFor('the run to wait', async () => (await engine.getRun(handle.runId))?.status === 'WAITING');
      await engine.migrateRun(handle.runId, '2');
      expect(seen?.input).toEqual({ secret: 'moving' });
      expect(seen?.checkpoints[0]).toMatchObject({ name: 'a', output: { secret: 'moving' } });
      const stored = await one<{ input: unknown; a: unknown }>(
        `select r.input, (select output from runledger.steps where run_id = r.run_id and name = 'a') as a from runledger.runs r where r.run_id = $1`,
        [handle.runId],
      );
      expect(stored.input).toMatchObject({ $enc: 'k1' });
      expect(stored.a).toMatchObject({ $enc: 'k1' });
      expect(await engine.getRun(handle.runId)).toMatchObject({ workflowVersion: '2', input: { secret: 'moving', moved: true } });
      await engine.signal(handle.runId, 'go', 'yes');
      expect(await handle.result({ timeoutMs: 10_000 })).toBe('v2:true:moving+:yes');
    } finally {
      await worker.stop();
    }
  });
});

describe('aesGcmCodec', () => {
  const codec = k1k2();

  it('round-trips any JSON value through an envelope with a fresh nonce each time', () => {
    const values: JsonValue[] = [{ a: 1, b: [true, null, 'x'] }, 'text', 0, null, [], { nested: { deep: ['é', '💡'] } }];
    for (const value of values) {
      const stored = codec.encode(value);
      expect(isAesGcmEnvelope(stored)).toBe(true);
      expect(stored).toMatchObject({ $enc: 'k2' });
      expect(codec.decode(stored)).toEqual(value);
    }
    const a = codec.encode({ same: 1 }) as { iv: string; data: string };
    const b = codec.encode({ same: 1 }) as { iv: string; data: string };
    expect(Buffer.from(a.iv, 'base64')).toHaveLength(12);
    expect(a.iv).not.toBe(b.iv);
    expect(a.data).not.toBe(b.data);
  });

  it('returns what is not an envelope as it is', () => {
    for (const value of [{ $enc: 'k1' }, { $enc: 'k1', iv: 'x', tag: 'y', data: 'z', extra: 1 }, { a: 1 }, 'text', 5, null, [1]]) {
      expect(codec.decode(value as never)).toEqual(value);
    }
  });

  it('a tampered envelope is PAYLOAD_UNREADABLE; a key it lacks is PAYLOAD_KEY_MISSING', () => {
    const stored = codec.encode({ amount: 100 }) as { $enc: string; iv: string; tag: string; data: string };
    const data = Buffer.from(stored.data, 'base64');
    data[0] = data[0]! ^ 1;
    const unreadable = { code: 'PAYLOAD_UNREADABLE', details: { keyId: 'k2' } };
    expect(() => codec.decode({ ...stored, data: data.toString('base64') })).toThrow(expect.objectContaining(unreadable));
    const tag = Buffer.from(stored.tag, 'base64');
    tag[3] = tag[3]! ^ 0x80;
    expect(() => codec.decode({ ...stored, tag: tag.toString('base64') })).toThrow(expect.objectContaining(unreadable));
    expect(() => codec.decode({ ...stored, iv: 'AAAA' })).toThrow(expect.objectContaining(unreadable));
    // The same id with other key material does not authenticate either.
    const impostor = aesGcmCodec({ keys: { k2: randomBytes(32) }, activeKey: 'k2' });
    expect(() => impostor.decode(stored)).toThrow(expect.objectContaining(unreadable));
    expect(() => k1Only().decode(stored)).toThrow(
      expect.objectContaining({ code: 'PAYLOAD_KEY_MISSING', details: expect.objectContaining({ keyId: 'k2' }) }),
    );
  });

  it('bad keys and options are CONFIG errors at construction', () => {
    const config = expect.objectContaining({ code: 'CONFIG' });
    expect(() => aesGcmCodec({ keys: { k1: randomBytes(16) }, activeKey: 'k1' })).toThrow(config);
    expect(() => aesGcmCodec({ keys: { k1: randomBytes(31).toString('base64') }, activeKey: 'k1' })).toThrow(config);
    expect(() => aesGcmCodec({ keys: { k1: 'not base64!' }, activeKey: 'k1' })).toThrow(config);
    expect(() => aesGcmCodec({ keys: { k1: 42 as never }, activeKey: 'k1' })).toThrow(config);
    expect(() => aesGcmCodec({ keys: {}, activeKey: 'k1' })).toThrow(config);
    expect(() => aesGcmCodec({ keys: { k1: K1 }, activeKey: 'k2' })).toThrow(config);
    expect(() => aesGcmCodec({ keys: { 'bad id': K1 }, activeKey: 'bad id' })).toThrow(config);
    expect(() => createEngine({ connectionString: db.url, codec: {} as never })).toThrow(config);
    expect(aesGcmCodec({ keys: { k1: K1.toString('base64') }, activeKey: 'k1' }).decode(k1Only().encode('same key'))).toBe('same key');
  });

  it("a codec's own failure reads as PAYLOAD_UNREADABLE; RUNLEDGER_KEYS configures the CLI's", () => {
    const broken: PayloadCodec = {
      encode: (v) => ({ wrapped: v }),
      decode: () => {
        throw new Error('boom');
      },
    };
    const payloads = new Payloads(broken);
    expect(payloads.text('{"a":1}')).toBe('{"wrapped":{"a":1}}');
    expect(() => payloads.decode({ wrapped: 1 })).toThrow(expect.objectContaining({ code: 'PAYLOAD_UNREADABLE' }));

    expect(cliCodec({})).toBeUndefined();
    const fromEnv = cliCodec({ RUNLEDGER_KEYS: `k1:${K1.toString('base64')},k2:${K2}` })!;
    expect(fromEnv.encode(1)).toMatchObject({ $enc: 'k2' });
    expect(fromEnv.decode(k1Only().encode('old'))).toBe('old');
    expect(cliCodec({ RUNLEDGER_KEYS: `k1:${K1.toString('base64')},k2:${K2}`, RUNLEDGER_ACTIVE_KEY: 'k1' })!.encode(1)).toMatchObject({
      $enc: 'k1',
    });
    expect(() => cliCodec({ RUNLEDGER_KEYS: 'no-colon' })).toThrow(expect.objectContaining({ code: 'CONFIG' }));
  });
});
