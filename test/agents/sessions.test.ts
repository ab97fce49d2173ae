import { beforeAll, describe, expect, it } from 'vitest';
import type { Engine } from '../../src/index.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { runCli } from '../helpers/cli.js';

/**
 * Sessions (src/agents/session.ts, sql/0012_agents.sql) with an in-process worker:
 * two runs on one session are serialised (the second WAITING, holding no worker), a run
 * that ends in any way lets the next one in, bad input is refused with a code and stores
 * nothing, and the history reads the same from SQL, the CLI and the workflow. The crash
 * cases, with real processes, are in test/agents/session-crash.slow.test.ts.
 */
const MAX_PAYLOAD = 64 * 1024;
const t = useTestEngine({ engine: { maxPayloadBytes: MAX_PAYLOAD } });
const { db } = t;

let flows: ReturnType<typeof defineFlows>;
/** While true, the step 'flaky' of the chat workflow throws (a bug fixed before retry_run). */
let flaky = false;

interface ChatInput {
  sessionId: string;
  tag: string;
  /** Waits for this signal between its two appends (holding the session). */
  pause?: string;
  /** Throws after its appends. */
  fail?: boolean;
}

function defineFlows(e: Engine) {
  const chat = e.workflow({ name: 'session-chat', queue: 'sessions' }, async (ctx, input: ChatInput) => {
    const session = await ctx.session(input.sessionId);
    const seen = (await session.history()).map((entry) => entry.content);
    await session.append([{ role: 'user', content: `${input.tag}:1` }]);
    if (input.pause) await ctx.waitForSignal(input.pause);
    await ctx.step('flaky', () => {
      if (flaky) throw new Error('flaky step');
      return 'ok';
    });
    await session.append([
      { role: 'assistant', content: `${input.tag}:2` },
      { role: 'tool', content: { tag: input.tag } },
    ]);
    if (input.fail) throw new Error(`${input.tag} fails while holding the session`);
    return { seen, after: (await session.history()).map((entry) => entry.content) };
  });

  // Lets go of the session explicitly, then keeps running (waiting) without it.
  const releaser = e.workflow({ name: 'session-releaser', queue: 'sessions' }, async (ctx, input: { sessionId: string }) => {
    const session = await ctx.session(input.sessionId);
    await session.append([{ role: 'user', content: 'releaser' }]);
    await session.release();
    await session.release(); // a second release does nothing
    const codes: Record<string, unknown> = {};
    for (const [label, call] of [
      ['append', () => session.append([{ role: 'user', content: 'late' }])],
      ['history', () => session.history()],
    ] as const) {
      try {
        await call();
        codes[label] = 'ok';
      } catch (error) {
        codes[label] = (error as { code?: unknown }).code;
      }
    }
    await ctx.waitForSignal('end');
    return codes;
  });

  // Holds the session until signalled, then appends: after an operator took the session away, that append is refused.
  const stubborn = e.workflow({ name: 'session-stubborn', queue: 'sessions' }, async (ctx, input: { sessionId: string }) => {
    const session = await ctx.session(input.sessionId);
    await ctx.waitForSignal('go');
    try {
      await session.append([{ role: 'user', content: 'too late' }]);
      return 'appended';
    } catch (error) {
      return (error as { code?: unknown }).code;
    }
  });

  const impatient = e.workflow({ name: 'session-impatient', queue: 'sessions' }, async (ctx, input: { sessionId: string }) => {
    try {
      await ctx.session(input.sessionId, { timeout: '300ms' });
      return 'held';
    } catch (error) {
      return (error as { code?: unknown }).code;
    }
  });

  const bad = e.workflow({ name: 'session-bad', queue: 'sessions' }, async (ctx, input: { sessionId: string }) => {
    const codes: Record<string, unknown> = {};
    const attempt = async (label: string, call: () => Promise<unknown>) => {
      try {
        await call();
        codes[label] = 'ok';
      } catch (error) {
        codes[label] = (error as { code?: unknown }).code;
      }
    };
    await attempt('empty id', () => ctx.session(''));
    await attempt('space in id', () => ctx.session('a b'));
    await attempt('path-like id', () => ctx.session('../etc'));
    await attempt('id too long', () => ctx.session('x'.repeat(93)));
    await attempt('id not a string', () => ctx.session(42 as unknown as string));
    const session = await ctx.session(input.sessionId);
    await attempt('entries not an array', () => session.append({ role: 'user', content: 'x' } as never));
    await attempt('unknown role', () => session.append([{ role: 'bot', content: 'x' } as never]));
    await attempt('no content', () => session.append([{ role: 'user' } as never]));
    await attempt('content not JSON', () => session.append([{ role: 'user', content: 10n }]));
    await attempt('a good entry with a bad one', () =>
      session.append([{ role: 'user', content: 'fine' }, { role: 'nobody', content: 'x' } as never]),
    );
    await attempt('over the payload limit', () => session.append([{ role: 'tool', content: 'x'.repeat(MAX_PAYLOAD) }]));
    await attempt('no entries', () => session.append([]));
    return codes;
  });

  const quick = e.workflow({ name: 'session-quick', queue: 'sessions' }, async (ctx) => ctx.step('done', () => 'done'));
  return { chat, releaser, stubborn, impatient, bad, quick };
}

beforeAll(async () => {
  flows = defineFlows(t.engine);
  // One slot: a run waiting for a session must not hold it, or nothing else could run.
  await t.engine.runWorker({ queues: ['sessions'], concurrency: 1, leaseMs: 5_000, pollIntervalMs: 50 });
});

const runRow = async (runId: string) =>
  (await db.pool.query('select status, wait_kind, wait_key, lease_owner from runledger.runs where run_id = $1', [runId])).rows[0];
const waitingOn = (runId: string, key: string) =>
  waitFor(`${runId} WAITING on ${key}`, async () => {
    const row = await runRow(runId);
    return row.status === 'WAITING' && row.wait_key === key;
  });
const history = async (sessionId: string) =>
  (
    await db.pool.query<{ seq: number; role: string; content: unknown; run_id: string; step_position: number }>(
      'select seq, role, content, run_id, step_position from runledger.session_history($1)',
      [sessionId],
    )
  ).rows;
const listed = async (sessionId: string) =>
  (
    await db.pool.query(
      'select holder_run_id, holder_status, waiting_run_ids, waiters, entries, last_holder_run_id, release_reason from runledger.session_list where session_id = $1',
      [sessionId],
    )
  ).rows[0];

describe('two runs on one session', () => {
  it('are serialised: the second waits (WAITING, no worker held) until the first ends; entries never interleave', async () => {
    const sessionId = 'serial';
    const first = await t.engine.start(flows.chat, { sessionId, tag: 'A', pause: 'go' });
    await waitingOn(first.runId, 'go');
    const second = await t.engine.start(flows.chat, { sessionId, tag: 'B' });
    await waitingOn(second.runId, `session:${sessionId}`);
    expect(await runRow(second.runId)).toMatchObject({ wait_kind: 'signal', lease_owner: null });
    expect(await listed(sessionId)).toMatchObject({
      holder_run_id: first.runId,
      holder_status: 'WAITING',
      waiting_run_ids: [second.runId],
      waiters: 1,
      entries: 1,
    });
    const waitingView = await db.pool.query('select waiting_for from runledger.waiting where run_id = $1', [second.runId]);
    expect(waitingView.rows[0].waiting_for).toContain(`session:${sessionId}`);
    // The worker's only slot is free: an unrelated run goes through while both wait.
    const other = await t.engine.start(flows.quick, {});
    await expect(other.result({ timeoutMs: 10_000 })).resolves.toBe('done');
    expect((await runRow(second.runId)).status).toBe('WAITING');

    await t.engine.signal(first.runId, 'go');
    expect(await first.result({ timeoutMs: 10_000 })).toEqual({ seen: [], after: ['A:1', 'A:2', { tag: 'A' }] });
    expect(await second.result({ timeoutMs: 10_000 })).toEqual({
      seen: ['A:1', 'A:2', { tag: 'A' }],
      after: ['A:1', 'A:2', { tag: 'A' }, 'B:1', 'B:2', { tag: 'B' }],
    });
    const rows = await history(sessionId);
    expect(rows.map((r) => [r.seq, r.run_id])).toEqual([
      [1, first.runId],
      [2, first.runId],
      [3, first.runId],
      [4, second.runId],
      [5, second.runId],
      [6, second.runId],
    ]);
    expect(await listed(sessionId)).toMatchObject({
      holder_run_id: null,
      waiters: 0,
      entries: 6,
      last_holder_run_id: second.runId,
      release_reason: 'ended',
    });
  });

  it('three runs are served in arrival order', async () => {
    const sessionId = 'fifo';
    const first = await t.engine.start(flows.chat, { sessionId, tag: 'A', pause: 'go' });
    await waitingOn(first.runId, 'go');
    const second = await t.engine.start(flows.chat, { sessionId, tag: 'B' });
    await waitingOn(second.runId, `session:${sessionId}`);
    const third = await t.engine.start(flows.chat, { sessionId, tag: 'C' });
    await waitingOn(third.runId, `session:${sessionId}`);
    expect((await listed(sessionId)).waiting_run_ids).toEqual([second.runId, third.runId]);
    await t.engine.signal(first.runId, 'go');
    await third.result({ timeoutMs: 10_000 });
    const owners = (await history(sessionId)).map((r) => r.run_id);
    expect(owners).toEqual([...Array(3).fill(first.runId), ...Array(3).fill(second.runId), ...Array(3).fill(third.runId)]);
  });
});

describe('a holder that ends lets the next run in', () => {
  it('when it fails', async () => {
    const sessionId = 'holder-fails';
    const first = await t.engine.start(flows.chat, { sessionId, tag: 'A', pause: 'go', fail: true });
    await waitingOn(first.runId, 'go');
    const second = await t.engine.start(flows.chat, { sessionId, tag: 'B' });
    await waitingOn(second.runId, `session:${sessionId}`);
    await t.engine.signal(first.runId, 'go');
    await expect(first.result({ timeoutMs: 10_000 })).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect((await second.result({ timeoutMs: 10_000 })).seen).toEqual(['A:1', 'A:2', { tag: 'A' }]);
  });

  it('when it is cancelled while waiting', async () => {
    const sessionId = 'holder-cancelled';
    const first = await t.engine.start(flows.chat, { sessionId, tag: 'A', pause: 'go' });
    await waitingOn(first.runId, 'go');
    const second = await t.engine.start(flows.chat, { sessionId, tag: 'B' });
    await waitingOn(second.runId, `session:${sessionId}`);
    expect(await t.engine.cancel(first.runId)).toBe('CANCELLED');
    // Its first entry stays: it was committed, and a session's history is not rolled back.
    expect((await second.result({ timeoutMs: 10_000 })).seen).toEqual(['A:1']);
  });

  it('and a queued run that is cancelled leaves the queue', async () => {
    const sessionId = 'waiter-cancelled';
    const first = await t.engine.start(flows.chat, { sessionId, tag: 'A', pause: 'go' });
    await waitingOn(first.runId, 'go');
    const second = await t.engine.start(flows.chat, { sessionId, tag: 'B' });
    await waitingOn(second.runId, `session:${sessionId}`);
    const third = await t.engine.start(flows.chat, { sessionId, tag: 'C' });
    await waitingOn(third.runId, `session:${sessionId}`);
    await t.engine.cancel(second.runId);
    expect((await listed(sessionId)).waiting_run_ids).toEqual([third.runId]);
    await t.engine.signal(first.runId, 'go');
    expect((await third.result({ timeoutMs: 10_000 })).seen).toEqual(['A:1', 'A:2', { tag: 'A' }]);
  });

  it('when it releases the session, while it goes on running; after release, append and history are refused', async () => {
    const sessionId = 'released';
    const first = await t.engine.start(flows.releaser, { sessionId });
    await waitingOn(first.runId, 'end');
    expect(await listed(sessionId)).toMatchObject({ holder_run_id: null, release_reason: 'released', last_holder_run_id: first.runId });
    const second = await t.engine.start(flows.chat, { sessionId, tag: 'B' });
    expect((await second.result({ timeoutMs: 10_000 })).seen).toEqual(['releaser']);
    expect((await runRow(first.runId)).status).toBe('WAITING');
    await t.engine.signal(first.runId, 'end');
    expect(await first.result({ timeoutMs: 10_000 })).toEqual({ append: 'SESSION_NOT_HELD', history: 'SESSION_NOT_HELD' });
    expect((await history(sessionId)).map((r) => r.content)).toEqual(['releaser', 'B:1', 'B:2', { tag: 'B' }]);
  });

  it('a run retried after it failed holding the session takes it back (nobody held it since) and goes on', async () => {
    const sessionId = 'retried';
    flaky = true;
    const run = await t.engine.start(flows.chat, { sessionId, tag: 'R' });
    await expect(run.result({ timeoutMs: 10_000 })).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(await listed(sessionId)).toMatchObject({ holder_run_id: null, release_reason: 'ended', last_holder_run_id: run.runId });
    flaky = false;
    await t.engine.retry(run.runId);
    expect(await t.engine.handle(run.runId).result({ timeoutMs: 10_000 })).toEqual({ seen: [], after: ['R:1', 'R:2', { tag: 'R' }] });
    expect((await history(sessionId)).map((r) => r.content)).toEqual(['R:1', 'R:2', { tag: 'R' }]);
  });
});

describe('waiting with a timeout', () => {
  it('gives up with SESSION_TIMEOUT and leaves the queue', async () => {
    const sessionId = 'timeout';
    const first = await t.engine.start(flows.chat, { sessionId, tag: 'A', pause: 'go' });
    await waitingOn(first.runId, 'go');
    const second = await t.engine.start(flows.impatient, { sessionId });
    await expect(second.result({ timeoutMs: 10_000 })).resolves.toBe('SESSION_TIMEOUT');
    expect(await listed(sessionId)).toMatchObject({ holder_run_id: first.runId, waiting_run_ids: [] });
    await t.engine.signal(first.runId, 'go');
    await first.result({ timeoutMs: 10_000 });
  });
});

describe('operator repair: runledger.release_session', () => {
  it('hands a stuck holder’s session to the next run; the former holder’s append is refused (SESSION_NOT_HELD)', async () => {
    const sessionId = 'repair';
    const stuck = await t.engine.start(flows.stubborn, { sessionId });
    await waitingOn(stuck.runId, 'go');
    const next = await t.engine.start(flows.chat, { sessionId, tag: 'N' });
    await waitingOn(next.runId, `session:${sessionId}`);
    const released = await db.pool.query('select runledger.release_session($1) as next', [sessionId]);
    expect(released.rows[0].next).toBe(next.runId);
    await next.result({ timeoutMs: 10_000 });
    await t.engine.signal(stuck.runId, 'go');
    await expect(stuck.result({ timeoutMs: 10_000 })).resolves.toBe('SESSION_NOT_HELD');
    // The refused append is recorded as that step's failure (a replay gets the same error) and wrote nothing.
    const failed = await db.pool.query(`select status, error->>'code' as code from runledger.steps where run_id = $1 and name = $2`, [
      stuck.runId,
      `session:${sessionId}:append`,
    ]);
    expect(failed.rows).toEqual([{ status: 'FAILED', code: 'SESSION_NOT_HELD' }]);
    expect((await history(sessionId)).map((r) => r.run_id)).toEqual(Array(3).fill(next.runId));
    const events = await db.pool.query(`select detail from runledger.events where run_id = $1 and kind = 'session_released'`, [
      stuck.runId,
    ]);
    expect(events.rows).toEqual([{ detail: { session_id: sessionId, by: 'operator' } }]);
  });
});

describe('bad input', () => {
  it('gets a coded error and stores nothing', async () => {
    const sessionId = 'bad-input';
    const run = await t.engine.start(flows.bad, { sessionId });
    expect(await run.result({ timeoutMs: 10_000 })).toEqual({
      'empty id': 'INVALID_INPUT',
      'space in id': 'INVALID_INPUT',
      'path-like id': 'INVALID_INPUT',
      'id too long': 'INVALID_INPUT',
      'id not a string': 'INVALID_INPUT',
      'entries not an array': 'INVALID_INPUT',
      'unknown role': 'INVALID_INPUT',
      'no content': 'INVALID_INPUT',
      'content not JSON': 'INVALID_INPUT',
      'a good entry with a bad one': 'INVALID_INPUT',
      'over the payload limit': 'PAYLOAD_TOO_LARGE',
      'no entries': 'ok',
    });
    // Only the valid session exists, with no entry; the run took one step, the open.
    const sessions = await db.pool.query(`select session_id, entry_count from runledger.sessions where session_id not in
      ('serial', 'fifo', 'holder-fails', 'holder-cancelled', 'waiter-cancelled', 'released', 'retried', 'timeout', 'repair', 'forked')`);
    expect(sessions.rows).toEqual([{ session_id: sessionId, entry_count: 0 }]);
    const steps = await db.pool.query('select name from runledger.steps where run_id = $1 order by seq', [run.runId]);
    expect(steps.rows.map((r) => r.name)).toEqual([`session:${sessionId}:open`]);
  });

  it('from SQL: an invalid id, an append by a run that does not hold the session, bad entries', async () => {
    const code = async (text: string, values: unknown[]) => {
      try {
        await db.pool.query(text, values);
        return 'ok';
      } catch (error) {
        return (error as { code?: string }).code;
      }
    };
    expect(await code('select * from runledger.session_history($1)', ['a b'])).toBe('RL003');
    expect(await code('select * from runledger.session_history($1)', ['never-opened'])).toBe('RL002');
    expect(await code('select runledger.release_session($1)', ['never-opened'])).toBe('RL002');
    expect(await code(`select runledger._session_append('bad-input', 'nobody', 0, '[{"role":"user","content":1}]')`, [])).toBe('RL005');
    expect(await code(`insert into runledger.sessions (session_id) values ('no spaces allowed')`, [])).toBe('23514');
  });
});

describe('history from SQL and the CLI', () => {
  const cli = (args: string[]) => runCli(db.url, args);

  it('runledger.session_history, runledger session and --json show the same entries in order', async () => {
    const sessionId = 'serial'; // written by the first test of this file
    const rows = await history(sessionId);
    expect(rows.map((r) => r.content)).toEqual(['A:1', 'A:2', { tag: 'A' }, 'B:1', 'B:2', { tag: 'B' }]);
    expect(rows.map((r) => r.role)).toEqual(['user', 'assistant', 'tool', 'user', 'assistant', 'tool']);

    const text = await cli(['session', sessionId]);
    expect(text.stderr).toBe('');
    expect(text.code).toBe(0);
    expect(text.stdout).toContain(`session     ${sessionId}`);
    expect(text.stdout).toContain('entries (6)');
    const lines = text.stdout.split('\n').filter((line) => /^\s+\d+\s+(user|assistant|tool)\s/.test(line));
    expect(lines.map((line) => line.trim().split(/\s+/).slice(0, 2))).toEqual(rows.map((r) => [String(r.seq), r.role]));
    expect(lines[2]).toContain('{"tag":"A"}');

    const json = await cli(['session', sessionId, '--json']);
    expect(json.code).toBe(0);
    const parsed = JSON.parse(json.stdout);
    expect(parsed).toMatchObject({ sessionId, holder: null, waiting: [], lastRelease: { reason: 'ended' } });
    expect(
      parsed.entries.map((e: { seq: number; role: string; content: unknown; runId: string; stepPosition: number }) => [
        e.seq,
        e.role,
        e.content,
        e.runId,
        e.stepPosition,
      ]),
    ).toEqual(rows.map((r) => [r.seq, r.role, r.content, r.run_id, r.step_position]));
  });

  it('runledger session: an unknown session exits 1 NOT_FOUND, an invalid id exits 1 INVALID_INPUT, no id is a usage error', async () => {
    const unknown = await cli(['session', 'never-opened']);
    expect(unknown.code).toBe(1);
    expect(unknown.stderr).toMatch(/^error \[NOT_FOUND\]: session_history: session 'never-opened' not found/);
    const invalid = await cli(['session', 'a b']);
    expect(invalid.code).toBe(1);
    expect(invalid.stderr).toMatch(/^error \[INVALID_INPUT\]: invalid session id/);
    const missing = await cli(['session']);
    expect(missing.code).toBe(2);
  });
});

describe('a fork of a run that held a session', () => {
  it('does not hold it: its first new append fails with SESSION_NOT_HELD and writes nothing', async () => {
    const sessionId = 'forked';
    const source = await t.engine.start(flows.chat, { sessionId, tag: 'S' });
    await source.result({ timeoutMs: 10_000 });
    const fork = await t.engine.fork(source.runId, { fromStep: 1 }); // reuses the open only
    await expect(fork.result({ timeoutMs: 10_000 })).rejects.toMatchObject({ code: 'RUN_FAILED' });
    const run = await t.engine.getRun(fork.runId);
    expect(run?.error).toMatchObject({ code: 'SESSION_NOT_HELD' });
    expect((await history(sessionId)).map((r) => r.run_id)).toEqual(Array(3).fill(source.runId));
  });
});

describe('retention', () => {
  it('prune() removes finished runs but not the entries they appended; delete_session removes a session and its history', async () => {
    const sessionId = 'serial';
    const before = await history(sessionId);
    const authors = [...new Set(before.map((r) => r.run_id))];
    await db.pool.query(`select runledger.prune('0 seconds')`);
    const left = await db.pool.query('select count(*)::int as n from runledger.runs where run_id = any($1)', [authors]);
    expect(left.rows[0].n).toBe(0);
    expect(await history(sessionId)).toEqual(before);
    const deleted = await db.pool.query('select runledger.delete_session($1) as n', [sessionId]);
    expect(deleted.rows[0].n).toBe(6);
    const gone = await db.pool.query('select count(*)::int as n from runledger.session_entries where session_id = $1', [sessionId]);
    expect(gone.rows[0].n).toBe(0);
  });
});
