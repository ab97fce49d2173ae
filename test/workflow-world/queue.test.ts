import { serve, type ServerType } from '@hono/node-server';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createWorld, DELIVERY_WORKFLOW, type RunledgerWorld } from '../../src/workflow-world/index.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { waitFor } from '../helpers/database.js';

/**
 * runledger/workflow-world's queue: each message is a runledger run of 'workflow-world' that
 * POSTs it to the app's handler (createQueueHandler) and, when the handler asks, sleeps and
 * delivers it again; an idempotency key is one live delivery; a handler that fails is tried
 * again; the runledger queue's concurrency limit holds; the deliveries are in runledger.runs
 * and in the view workflow_world_runs.
 */
const t = useTestEngine();
let world: RunledgerWorld;
let server: ServerType;

interface Received {
  body: any;
  attempt: number;
  queueName: string;
  messageId: string;
}
const received: Received[] = [];
/** What the handler answers per message: a number of seconds to be called again after, or a failure. */
const script = new Map<string, Array<number | 'fail'>>();
let inFlight = 0;
let maxInFlight = 0;
let holdMs = 0;

beforeAll(async () => {
  const port = await new Promise<number>((resolve) => {
    server = serve({ port: 0, hostname: '127.0.0.1', fetch: (req) => handler(req) }, (info) => resolve(info.port));
  });
  world = createWorld({ engine: t.engine, baseUrl: `http://127.0.0.1:${port}`, deliveryAttempts: 3, concurrency: 8 });
  const handler = world.createQueueHandler('__wkf_workflow_', async (body, meta) => {
    inFlight += 1;
    maxInFlight = Math.max(maxInFlight, inFlight);
    try {
      received.push({ body, ...meta });
      if (holdMs) await new Promise((resolve) => setTimeout(resolve, holdMs));
      const next = script.get((body as { tag: string }).tag)?.shift();
      if (next === 'fail') throw new Error('the app failed this delivery');
      return typeof next === 'number' ? { timeoutSeconds: next } : undefined;
    } finally {
      inFlight -= 1;
    }
  });
  await world.start();
});

afterAll(async () => {
  await world?.close();
  await new Promise((resolve) => server?.close(resolve));
});

const deliveriesOf = (tag: string) => received.filter((r) => r.body.tag === tag);

async function deliveryRuns(tag: string) {
  const { rows } = await t.db.pool.query(
    `select run_id, status::text, input from runledger.runs where workflow_name = $1 and input ->> 'body' like $2 order by created_at`,
    [DELIVERY_WORKFLOW, `%"tag":"${tag}"%`],
  );
  return rows as Array<{ run_id: string; status: string; input: Record<string, unknown> }>;
}

describe('the queue', () => {
  it('delivers a message over HTTP as a runledger run, with its bytes and dates intact', async () => {
    const sentAt = new Date('2026-12-01T10:00:00.000Z');
    const { messageId } = await world.queue('__wkf_workflow_plain', {
      runId: 'wrun_q1',
      tag: 'plain',
      data: new Uint8Array([0, 1, 2]),
      requestedAt: sentAt,
    } as never);
    expect(messageId).toMatch(/^msg_/);
    await waitFor('the delivery', async () => deliveriesOf('plain').length === 1);
    const [delivery] = deliveriesOf('plain');
    expect(delivery).toMatchObject({ attempt: 1, queueName: '__wkf_workflow_plain', messageId });
    expect(delivery!.body.data).toEqual(new Uint8Array([0, 1, 2]));
    expect(delivery!.body.requestedAt).toEqual(sentAt);
    await waitFor('its run to succeed', async () => (await deliveryRuns('plain'))[0]?.status === 'SUCCEEDED');
    const [run] = await deliveryRuns('plain');
    expect(run!.input).toMatchObject({ queueName: '__wkf_workflow_plain', messageId, runId: 'wrun_q1' });
  });

  it('delivers again after the timeoutSeconds the handler answers, as a durable sleep', async () => {
    script.set('again', [1, 0]);
    await world.queue('__wkf_workflow_again', { runId: 'wrun_q2', tag: 'again' } as never);
    await waitFor('three deliveries', async () => deliveriesOf('again').length === 3, 20_000);
    expect(deliveriesOf('again').map((d) => d.attempt)).toEqual([1, 2, 3]);
    await waitFor('its run to succeed', async () => (await deliveryRuns('again'))[0]?.status === 'SUCCEEDED');
    const [run] = await deliveryRuns('again');
    const { rows } = await t.db.pool.query(`select kind::text, name from runledger.steps where run_id = $1 order by seq`, [run!.run_id]);
    expect(rows.map((r) => `${r.kind}:${r.name}`)).toEqual(['step:deliver-1', 'sleep:redeliver-1', 'step:deliver-2', 'step:deliver-3']);
  });

  it('a message with an idempotency key is one delivery while it lives, and a new one after', async () => {
    holdMs = 300;
    try {
      const [a, b] = await Promise.all([
        world.queue('__wkf_workflow_keyed', { runId: 'wrun_q3', tag: 'keyed' } as never, { idempotencyKey: 'key-1' }),
        world.queue('__wkf_workflow_keyed', { runId: 'wrun_q3', tag: 'keyed' } as never, { idempotencyKey: 'key-1' }),
      ]);
      expect(a.messageId).toBe(b.messageId);
      await waitFor('the keyed delivery to end', async () => (await deliveryRuns('keyed')).every((r) => r.status === 'SUCCEEDED'));
      expect(deliveriesOf('keyed')).toHaveLength(1);
      // The first delivery ended: the key is free again.
      const c = await world.queue('__wkf_workflow_keyed', { runId: 'wrun_q3', tag: 'keyed' } as never, { idempotencyKey: 'key-1' });
      expect(c.messageId).not.toBe(a.messageId);
      await waitFor('a second keyed delivery', async () => deliveriesOf('keyed').length === 2);
    } finally {
      holdMs = 0;
    }
  });

  it('a handler that fails is tried again; one that keeps failing fails its run, which an operator retries', async () => {
    script.set('flaky', ['fail']);
    await world.queue('__wkf_workflow_flaky', { runId: 'wrun_q4', tag: 'flaky' } as never);
    await waitFor('the flaky delivery to succeed', async () => (await deliveryRuns('flaky'))[0]?.status === 'SUCCEEDED', 20_000);
    expect(deliveriesOf('flaky')).toHaveLength(2);

    script.set('broken', ['fail', 'fail', 'fail']);
    await world.queue('__wkf_workflow_broken', { runId: 'wrun_q5', tag: 'broken' } as never);
    await waitFor('the broken delivery to fail', async () => (await deliveryRuns('broken'))[0]?.status === 'FAILED', 30_000);
    expect(deliveriesOf('broken')).toHaveLength(3);
    const [run] = await deliveryRuns('broken');
    await t.db.pool.query('select runledger.retry_run($1)', [run!.run_id]);
    await waitFor('the retried delivery to succeed', async () => (await deliveryRuns('broken'))[0]?.status === 'SUCCEEDED', 20_000);
    expect(deliveriesOf('broken')).toHaveLength(4);
  });

  it("honours the runledger queue's concurrency limit", async () => {
    await t.engine.setQueue('workflow-world', { concurrency: 2 });
    holdMs = 200;
    maxInFlight = 0;
    try {
      await Promise.all(
        Array.from({ length: 8 }, (_, i) => world.queue('__wkf_workflow_many', { runId: `wrun_m${i}`, tag: 'many' } as never)),
      );
      await waitFor('eight deliveries', async () => deliveriesOf('many').length === 8, 20_000);
      expect(maxInFlight).toBe(2);
    } finally {
      holdMs = 0;
      await t.engine.setQueue('workflow-world', { concurrency: null as never });
    }
  });

  it('shows each SDK run beside its deliveries in runledger.workflow_world_runs', async () => {
    const created = await world.events.create(null, {
      eventType: 'run_created',
      eventData: { deploymentId: 'dpl', workflowName: 'visible', input: new Uint8Array([1]) },
      specVersion: 2,
    } as never);
    const runId = created.run!.runId;
    await world.queue('__wkf_workflow_visible', { runId, tag: 'visible' } as never);
    await waitFor('the view to show the delivery', async () => {
      const { rows } = await t.db.pool.query('select * from runledger.workflow_world_runs where run_id = $1', [runId]);
      return rows[0]?.deliveries === 1 && rows[0]?.deliveries_active === 0;
    });
    const { rows } = await t.db.pool.query('select * from runledger.workflow_world_runs where run_id = $1', [runId]);
    expect(rows[0]).toMatchObject({ workflow_name: 'visible', status: 'pending', deliveries: 1, deliveries_failed: 0 });
    const [run] = await deliveryRuns('visible');
    expect(rows[0].last_delivery_run_id).toBe(run!.run_id);
  });
});

describe('bad input', () => {
  it('a delay that is not a number >= 0 is refused, and nothing is queued', async () => {
    for (const delaySeconds of [-1, Number.NaN, Number.POSITIVE_INFINITY]) {
      await expect(world.queue('__wkf_workflow_bad', { runId: 'wrun_bad', tag: 'bad' } as never, { delaySeconds })).rejects.toThrow(
        'delaySeconds must be a number >= 0',
      );
    }
    expect(await deliveryRuns('bad')).toEqual([]);
  });

  it('a key, a header or a run id PostgreSQL cannot store is INVALID_INPUT, and nothing is queued; in the message itself it is delivered as it was', async () => {
    const refused = [
      world.queue('__wkf_workflow_bad', { runId: 'wrun_bad', tag: 'bad' } as never, { idempotencyKey: 'k\u0000' }),
      world.queue('__wkf_workflow_bad', { runId: 'wrun_bad', tag: 'bad' } as never, { headers: { 'x-trace': 'v\ud800' } }),
      world.queue('__wkf_workflow_bad', { runId: 'wrun_\u0000', tag: 'bad' } as never),
    ];
    for (const attempt of refused) await expect(attempt).rejects.toMatchObject({ name: 'WorkflowWorldError', code: 'INVALID_INPUT' });
    expect(await deliveryRuns('bad')).toEqual([]);
    await world.queue('__wkf_workflow_odd', { runId: 'wrun_odd', tag: 'odd', text: 'nul \u0000 half \ud83d' } as never);
    await waitFor('the odd message', async () => deliveriesOf('odd').length === 1);
    expect(deliveriesOf('odd')[0]!.body.text).toBe('nul \u0000 half \ud83d');
  });
});

describe('the queue handler', () => {
  it('answers 400 to a request without the delivery headers, and to a queue it does not handle', async () => {
    const handler = world.createQueueHandler('__wkf_workflow_', async () => undefined);
    const bare = await handler(new Request('http://x/', { method: 'POST', body: '{}' }));
    expect(bare.status).toBe(400);
    const other = await handler(
      new Request('http://x/', {
        method: 'POST',
        body: '{}',
        headers: { 'x-vqs-queue-name': '__wkf_step_x', 'x-vqs-message-id': 'msg_1', 'x-vqs-message-attempt': '1' },
      }),
    );
    expect(other.status).toBe(400);
    expect(await other.text()).toContain('Unhandled queue');
  });
});
