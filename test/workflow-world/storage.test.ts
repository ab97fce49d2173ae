import { SPEC_VERSION_CURRENT } from '@workflow/world';
import { afterAll, describe, expect, it } from 'vitest';
import { createWorld, type RunledgerWorld } from '../../src/workflow-world/index.js';
import { successor } from '../../src/workflow-world/events.js';
import { encodeTime } from 'ulid';
import { useTestEngine } from '../helpers/test-engine.js';

/**
 * runledger/workflow-world's storage, called directly: the event log's state machine (what it
 * writes, what it refuses, with the SDK's own error names), and the reads the SDK's suite
 * (test/workflow-world/suite) never calls: runs.list, steps.get/list, events.get,
 * events.listByCorrelationId, hooks.get/list, with their pages and resolveData.
 */
const t = useTestEngine();
let world: RunledgerWorld;
const spec = { specVersion: SPEC_VERSION_CURRENT };
const bytes = (...values: number[]) => new Uint8Array(values);

afterAll(() => world?.close());

function world_(): RunledgerWorld {
  world ??= createWorld({ engine: t.engine, baseUrl: 'http://127.0.0.1:9' });
  return world;
}

async function newRun(workflowName = 'wf-a', input: Uint8Array = bytes(1, 0, 2)): Promise<string> {
  const created = await world_().events.create(null, {
    eventType: 'run_created',
    eventData: { deploymentId: 'dpl-1', workflowName, input },
    ...spec,
  });
  return created.run!.runId;
}

const create = (runId: string, data: Record<string, unknown>) => world_().events.create(runId, { ...spec, ...data } as never);

async function rejection(promise: Promise<unknown>): Promise<{ name: string; message: string }> {
  try {
    await promise;
  } catch (error) {
    return error as { name: string; message: string };
  }
  throw new Error('expected a rejection');
}

describe('the event log', () => {
  it('materializes a run: created, started (with its log), a step, a hook, a sleep, attributes, completed', async () => {
    const runId = await newRun();
    expect(runId).toMatch(/^wrun_/);
    const started = await create(runId, { eventType: 'run_started' });
    expect(started.run?.status).toBe('running');
    expect(started.events?.map((e) => e.eventType)).toEqual(['run_created', 'run_started']);

    await create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 'add', input: bytes(7) } });
    const running = await create(runId, { eventType: 'step_started', correlationId: 'step_1' });
    expect(running.step).toMatchObject({ status: 'running', attempt: 1 });
    // A value with NUL bytes, a NUL in a string, and a date come back as they went in.
    const result = bytes(0, 255, 0);
    const done = await create(runId, { eventType: 'step_completed', correlationId: 'step_1', eventData: { result } });
    expect(done.step?.output).toEqual(result);

    const hook = await create(runId, {
      eventType: 'hook_created',
      correlationId: 'hook_1',
      eventData: { token: `tok-${runId}`, metadata: bytes(9) },
    });
    expect(hook.hook).toMatchObject({ hookId: 'hook_1', token: `tok-${runId}`, runId });
    await create(runId, { eventType: 'hook_received', correlationId: 'hook_1', eventData: { payload: bytes(0, 1) } });
    const resumeAt = new Date(Date.now() + 60_000);
    const wait = await create(runId, { eventType: 'wait_created', correlationId: 'wait_1', eventData: { resumeAt } });
    expect(wait.wait?.resumeAt).toEqual(resumeAt);
    expect((await create(runId, { eventType: 'wait_completed', correlationId: 'wait_1' })).wait?.status).toBe('completed');
    const attrs = await create(runId, {
      eventType: 'attr_set',
      correlationId: 'attr_1',
      eventData: { changes: [{ key: 'customer', value: 'c-\u00e9' }], writer: { type: 'workflow' } },
    });
    expect(attrs.run?.attributes).toEqual({ customer: 'c-\u00e9' });

    const completed = await create(runId, { eventType: 'run_completed', eventData: { output: bytes(0, 0, 42) } });
    expect(completed.run).toMatchObject({ status: 'completed', output: bytes(0, 0, 42) });
    expect(completed.run?.completedAt).toBeInstanceOf(Date);

    // The whole log, in order, and the hook gone with the run (its token free again).
    const log = await world_().events.list({ runId });
    expect(log.data.map((e) => e.eventType)).toEqual([
      'run_created',
      'run_started',
      'step_created',
      'step_started',
      'step_completed',
      'hook_created',
      'hook_received',
      'wait_created',
      'wait_completed',
      'attr_set',
      'run_completed',
    ]);
    expect(log.data[6]?.eventData).toEqual({ payload: bytes(0, 1) });
    expect(log.data[7]?.eventData).toEqual({ resumeAt });
    expect((await world_().hooks.list({ runId })).data).toEqual([]);
    const { rows } = await t.db.pool.query('select count(*)::int as n from runledger.wf_waits where run_id = $1', [runId]);
    expect(rows[0].n).toBe(0);
  });

  it('refuses what the spec refuses, with the errors the SDK runtime reads', async () => {
    const runId = await newRun();
    await create(runId, { eventType: 'run_started' });
    await create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: bytes(1) } });
    // The same step again: the SDK's dedup signal, and nothing written.
    expect(
      (
        await rejection(
          create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: bytes(1) } }),
        )
      ).name,
    ).toBe('EntityConflictError');
    // A step whose retry is not due yet.
    await create(runId, { eventType: 'step_started', correlationId: 'step_1' });
    await create(runId, {
      eventType: 'step_retrying',
      correlationId: 'step_1',
      eventData: { error: bytes(5), retryAfter: new Date(Date.now() + 60_000) },
    });
    const early = await rejection(create(runId, { eventType: 'step_started', correlationId: 'step_1' }));
    expect(early.name).toBe('TooEarlyError');
    expect((early as unknown as { retryAfter: number }).retryAfter).toBeGreaterThan(50);
    // Unknown entities.
    expect(
      (await rejection(create(runId, { eventType: 'hook_received', correlationId: 'nope', eventData: { payload: bytes() } }))).name,
    ).toBe('HookNotFoundError');
    expect(
      (await rejection(create(runId, { eventType: 'step_completed', correlationId: 'nope', eventData: { result: bytes() } }))).message,
    ).toContain('not found');
    expect((await rejection(create('wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV', { eventType: 'run_started' }))).name).toBe(
      'WorkflowRunNotFoundError',
    );

    await create(runId, { eventType: 'run_failed', eventData: { error: bytes(1), errorCode: 'USER_ERROR' } });
    const run = await world_().runs.get(runId);
    expect(run).toMatchObject({ status: 'failed', errorCode: 'USER_ERROR', error: bytes(1) });
    // A run that ended: no second end, no start, no new entities.
    expect((await rejection(create(runId, { eventType: 'run_completed', eventData: { output: bytes() } }))).name).toBe(
      'EntityConflictError',
    );
    expect((await rejection(create(runId, { eventType: 'run_started' }))).name).toBe('RunExpiredError');
    expect(
      (await rejection(create(runId, { eventType: 'wait_created', correlationId: 'w', eventData: { resumeAt: new Date() } }))).name,
    ).toBe('EntityConflictError');
    const events = await world_().events.list({ runId });
    expect(events.data.at(-1)?.eventType).toBe('run_failed');
  });

  it('a lazy step_started creates its step once: the loser of the race gets EntityConflictError', async () => {
    const runId = await newRun();
    await create(runId, { eventType: 'run_started' });
    const lazy = { eventType: 'step_started', correlationId: 'step_lazy', eventData: { stepName: 'lazy', input: bytes(3) } };
    const outcomes = await Promise.allSettled([create(runId, lazy), create(runId, lazy)]);
    const won = outcomes.filter((o) => o.status === 'fulfilled');
    const lost = outcomes.filter((o) => o.status === 'rejected');
    expect(won).toHaveLength(1);
    expect((won[0] as PromiseFulfilledResult<{ stepCreated?: boolean }>).value.stepCreated).toBe(true);
    expect((lost[0] as PromiseRejectedResult).reason.name).toBe('EntityConflictError');
    const log = await world_().events.list({ runId });
    expect(log.data.map((e) => e.eventType)).toEqual(['run_created', 'run_started', 'step_created', 'step_started']);
    // step_created keeps the input; step_started keeps the name only.
    expect(log.data[2]?.eventData).toEqual({ stepName: 'lazy', input: bytes(3) });
    expect(log.data[3]?.eventData).toEqual({ stepName: 'lazy' });
  });

  it('a token another run holds is a hook_conflict event in the second run, not an error', async () => {
    const first = await newRun();
    const second = await newRun();
    const token = `shared-${first}`;
    await create(first, { eventType: 'hook_created', correlationId: 'hook_a', eventData: { token } });
    const conflict = await create(second, { eventType: 'hook_created', correlationId: 'hook_b', eventData: { token } });
    expect(conflict.event).toMatchObject({ eventType: 'hook_conflict', eventData: { token, conflictingRunId: first } });
    expect(conflict.hook).toBeUndefined();
    expect((await world_().hooks.getByToken(token)).runId).toBe(first);
    // Disposing frees the token; disposing twice is a conflict.
    await create(first, { eventType: 'hook_disposed', correlationId: 'hook_a' });
    expect((await rejection(create(first, { eventType: 'hook_disposed', correlationId: 'hook_a' }))).name).toBe('HookNotFoundError');
    expect((await create(second, { eventType: 'hook_created', correlationId: 'hook_c', eventData: { token } })).hook?.runId).toBe(second);
  });

  it('serves World spec 5, and refuses a run written under a newer spec rather than half understand it', async () => {
    expect(world_().specVersion).toBe(5);
    const created = await world_().events.create(null, {
      eventType: 'run_created',
      eventData: { deploymentId: 'dpl-1', workflowName: 'from-the-future', input: bytes(1) },
      specVersion: 6,
    } as never);
    const refused = await rejection(create(created.run!.runId, { eventType: 'run_started' }));
    expect(refused.name).toBe('RunNotSupportedError');
  });

  it("orders a run's log by commit even when a writer's clock is behind the last writer's", async () => {
    const runId = await newRun();
    // An event written by a process whose clock runs an hour ahead of this one.
    const ahead = `wevt_${encodeTime(Date.now() + 3_600_000)}ZZZZZZZZZZZZZZZZ`;
    await t.db.pool.query(
      `insert into runledger.wf_events (event_id, run_id, event_type, spec_version) values ($1, $2, 'run_started', 5)`,
      [ahead, runId],
    );
    const next = await create(runId, { eventType: 'step_created', correlationId: 'step_1', eventData: { stepName: 's', input: bytes(1) } });
    expect(next.event!.eventId > ahead).toBe(true);
    expect(next.event!.eventId).toBe(successor(ahead));
    const log = await world_().events.list({ runId });
    expect(log.data.map((e) => e.eventType)).toEqual(['run_created', 'run_started', 'step_created']);
    expect(successor('wevt_01ARZ3NDEKTSV4RRFFQ69G5FAZ')).toBe('wevt_01ARZ3NDEKTSV4RRFFQ69G5FB0');
  });

  it('refuses an event request the SDK spec does not know, writing nothing', async () => {
    const runId = await newRun();
    const bad = await rejection(create(runId, { eventType: 'step_created', correlationId: 'step_x', eventData: { input: bytes(1) } }));
    expect(bad.name).toBe('WorkflowWorldError');
    expect(bad.message).toContain("Not an event the Workflow SDK's spec knows");
    expect((await rejection(create(runId, { eventType: 'no_such_event' }))).name).toBe('WorkflowWorldError');
    const { rows } = await t.db.pool.query('select count(*)::int as n from runledger.wf_steps where run_id = $1', [runId]);
    expect(rows[0].n).toBe(0);
    expect((await world_().events.list({ runId })).data.map((e) => e.eventType)).toEqual(['run_created']);
  });

  it('refuses a client run id whose time is far from now, and one already used', async () => {
    const stale = await rejection(
      world_().events.create('wrun_01ARZ3NDEKTSV4RRFFQ69G5FAV', {
        eventType: 'run_created',
        eventData: { deploymentId: 'd', workflowName: 'w', input: bytes() },
        ...spec,
      } as never),
    );
    expect(stale.name).toBe('WorkflowWorldError');
    const runId = await newRun();
    const again = await rejection(
      world_().events.create(runId, {
        eventType: 'run_created',
        eventData: { deploymentId: 'd', workflowName: 'w', input: bytes() },
        ...spec,
      } as never),
    );
    expect(again.name).toBe('EntityConflictError');
  });
});

describe('strings PostgreSQL cannot store', () => {
  const NUL = 'a\u0000b';
  const LONE = 'tok-\ud83d';

  it('in an id, a token, a name or an attribute: INVALID_INPUT naming the field, nothing written, other runs unaffected', async () => {
    const runId = await newRun();
    const good = await newRun();
    const bad = [
      create(runId, { eventType: 'step_created', correlationId: NUL, eventData: { stepName: 's', input: bytes(1) } }),
      create(runId, { eventType: 'hook_created', correlationId: 'hook_x', eventData: { token: LONE } }),
      create(runId, { eventType: 'step_created', correlationId: 'step_y', eventData: { stepName: LONE, input: bytes(1) } }),
      create(runId, {
        eventType: 'attr_set',
        correlationId: 'a1',
        eventData: { changes: [{ key: 'k', value: NUL }], writer: { type: 'workflow' } },
      }),
      world_().events.create(null, {
        eventType: 'run_created',
        eventData: { deploymentId: 'd', workflowName: NUL, input: bytes() },
        ...spec,
      } as never),
    ];
    // Another run's events, written at the same time, are not affected.
    const [outcomes, fine] = await Promise.all([
      Promise.allSettled(bad),
      create(good, { eventType: 'step_created', correlationId: 'step_ok', eventData: { stepName: 'ok', input: bytes(1) } }),
    ]);
    expect(fine.step?.stepId).toBe('step_ok');
    const reasons = outcomes.map((o) => (o as PromiseRejectedResult).reason as { name: string; code: string; message: string });
    expect(reasons.map((r) => [r.name, r.code])).toEqual(Array(5).fill(['WorkflowWorldError', 'INVALID_INPUT']));
    expect(reasons[0]!.message).toContain('correlationId holds a NUL character');
    expect(reasons[1]!.message).toContain('eventData.token holds a lone surrogate');
    expect(reasons[3]!.message).toContain('eventData.changes[0].value holds a NUL character');
    expect((await world_().events.list({ runId })).data.map((e) => e.eventType)).toEqual(['run_created']);
    const { rows } = await t.db.pool.query('select count(*)::int as n from runledger.wf_runs where workflow_name = $1', ['a\ufffdb']);
    expect(rows[0].n).toBe(0);
  });

  it('in a read: INVALID_INPUT, not a database error', async () => {
    for (const read of [
      world_().runs.get(NUL),
      world_().steps.get('wrun_x', LONE),
      world_().hooks.getByToken(LONE),
      world_().events.get('wrun_x', NUL),
      world_().runs.list({ workflowName: NUL }),
      world_().events.listByCorrelationId({ correlationId: LONE }),
    ])
      expect(await rejection(read)).toMatchObject({ name: 'WorkflowWorldError', code: 'INVALID_INPUT' });
  });

  it('in a payload: stored and read back as it was (payloads are json, which keeps both)', async () => {
    const runId = await newRun();
    await create(runId, {
      eventType: 'hook_created',
      correlationId: 'hook_p',
      eventData: { token: `p-${runId}`, metadata: { note: `${NUL}${LONE}` } },
    });
    expect((await world_().hooks.get('hook_p')).metadata).toEqual({ note: `${NUL}${LONE}` });
  });
});

describe('the reads the suite does not call', () => {
  it('runs.list: newest first, filtered by workflow and status, in pages, without data on resolveData none', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(await newRun('wf-list'));
    await create(ids[0]!, { eventType: 'run_started' });
    const first = await world_().runs.list({ workflowName: 'wf-list', pagination: { limit: 2 } });
    expect(first.data.map((r) => r.runId)).toEqual([ids[4], ids[3]]);
    expect(first.hasMore).toBe(true);
    const second = await world_().runs.list({ workflowName: 'wf-list', pagination: { limit: 2, cursor: first.cursor! } });
    expect(second.data.map((r) => r.runId)).toEqual([ids[2], ids[1]]);
    const last = await world_().runs.list({ workflowName: 'wf-list', pagination: { limit: 2, cursor: second.cursor! } });
    expect(last.data.map((r) => r.runId)).toEqual([ids[0]]);
    expect(last.hasMore).toBe(false);
    const running = await world_().runs.list({ workflowName: 'wf-list', status: 'running' });
    expect(running.data.map((r) => r.runId)).toEqual([ids[0]]);
    expect(running.data[0]?.input).toEqual(bytes(1, 0, 2));
    const bare = await world_().runs.list({ workflowName: 'wf-list', resolveData: 'none' });
    expect(bare.data.every((r) => r.input === undefined)).toBe(true);
    expect((await rejection(world_().runs.get('wrun_missing'))).name).toBe('WorkflowRunNotFoundError');
  });

  it('steps.get and steps.list, events.get and events.listByCorrelationId, hooks.get and hooks.list', async () => {
    const runId = await newRun();
    await create(runId, { eventType: 'run_started' });
    for (const id of ['step_a', 'step_b', 'step_c'])
      await create(runId, { eventType: 'step_created', correlationId: id, eventData: { stepName: `n-${id}`, input: bytes(1) } });
    await create(runId, { eventType: 'step_started', correlationId: 'step_b' });
    await create(runId, { eventType: 'step_completed', correlationId: 'step_b', eventData: { result: bytes(2) } });

    const step = await world_().steps.get(runId, 'step_b');
    expect(step).toMatchObject({ stepName: 'n-step_b', status: 'completed', attempt: 1, output: bytes(2), input: bytes(1) });
    expect((await world_().steps.get(runId, 'step_b', { resolveData: 'none' })).output).toBeUndefined();
    const page1 = await world_().steps.list({ runId, pagination: { limit: 2 } });
    expect(page1.data.map((s) => s.stepId)).toEqual(['step_c', 'step_b']);
    const page2 = await world_().steps.list({ runId, pagination: { limit: 2, cursor: page1.cursor! } });
    expect(page2.data.map((s) => s.stepId)).toEqual(['step_a']);
    expect((await rejection(world_().steps.get(runId, 'nope'))).message).toContain('Step not found');

    const byStep = await world_().events.listByCorrelationId({ correlationId: 'step_b' });
    expect(byStep.data.map((e) => e.eventType)).toEqual(['step_created', 'step_started', 'step_completed']);
    const newestFirst = await world_().events.listByCorrelationId({ correlationId: 'step_b', pagination: { sortOrder: 'desc', limit: 1 } });
    expect(newestFirst.data.map((e) => e.eventType)).toEqual(['step_completed']);
    expect(newestFirst.hasMore).toBe(true);
    const one = await world_().events.get(runId, byStep.data[2]!.eventId);
    expect(one.eventData).toEqual({ result: bytes(2) });
    expect((await world_().events.get(runId, byStep.data[2]!.eventId, { resolveData: 'none' })).eventData).toBeUndefined();
    expect((await rejection(world_().events.get(runId, 'wevt_missing'))).message).toContain('Event not found');

    for (const id of ['hook_1', 'hook_2', 'hook_3'])
      await create(runId, { eventType: 'hook_created', correlationId: id, eventData: { token: `${runId}-${id}`, metadata: bytes(4) } });
    expect(await world_().hooks.get('hook_2')).toMatchObject({ runId, token: `${runId}-hook_2`, metadata: bytes(4) });
    expect((await world_().hooks.get('hook_2', { resolveData: 'none' })).metadata).toBeUndefined();
    const hooks1 = await world_().hooks.list({ runId, pagination: { limit: 2 } });
    expect(hooks1.data.map((h) => h.hookId)).toEqual(['hook_1', 'hook_2']);
    const hooks2 = await world_().hooks.list({ runId, pagination: { limit: 2, cursor: hooks1.cursor! } });
    expect(hooks2.data.map((h) => h.hookId)).toEqual(['hook_3']);
    expect(hooks2.hasMore).toBe(false);
    expect((await rejection(world_().hooks.get('hook_missing'))).name).toBe('HookNotFoundError');
    expect((await rejection(world_().hooks.getByToken('token_missing'))).name).toBe('HookNotFoundError');
  });

  it('a page limit that is not a whole number >= 1 is refused, naming it', async () => {
    expect((await rejection(world_().runs.list({ pagination: { limit: 0 } }))).message).toContain('pagination.limit');
  });
});
