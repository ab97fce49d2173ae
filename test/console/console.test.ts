import { request } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { Worker } from '../../src/index.js';
import { startConsole, type RunningConsole } from '../../src/console/server.js';
import { Guard, MAX_SESSIONS, SESSION_MS, safeBack } from '../../src/console/security.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';

/**
 * The web console over HTTP (no browser): filters and keyset pages of the run list, the
 * refusals of actions (no token configured, no or a wrong token, GET, another site, another
 * Host), the coded error of a refused action, and the 404 of an unknown run.
 */
const TOKEN = 'console-test-token';
const t = useTestEngine();
const { db } = t;
let ui: RunningConsole;
let readOnly: RunningConsole;

beforeAll(async () => {
  ui = await startConsole({ pool: db.pool, port: 0, token: TOKEN });
  readOnly = await startConsole({ pool: db.pool, port: 0 });
});
afterAll(async () => {
  await ui?.close();
  await readOnly?.close();
});

const get = (path: string, headers: Record<string, string> = {}, base = ui.url) => fetch(`${base}${path}`, { headers, redirect: 'manual' });
const post = (path: string, form: Record<string, string>, headers: Record<string, string> = {}, base = ui.url) =>
  fetch(`${base}${path}`, {
    method: 'POST',
    body: new URLSearchParams(form),
    headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
    redirect: 'manual',
  });

/** Signs in with the token: the session cookie, and the CSRF field the pages then carry. */
async function signIn(token = TOKEN): Promise<{ cookie: string; csrf: string }> {
  const answer = await post('/signin', { token, name: 'maria', back: '/runs' });
  expect(answer.status).toBe(303);
  const cookie = answer.headers
    .getSetCookie()
    .map((c) => c.split(';')[0]!)
    .join('; ');
  const page = await (await get('/approvals', { cookie })).text();
  const csrf = /name="csrf" value="([0-9a-f]+)"/.exec(page)?.[1];
  expect(csrf).toMatch(/^[0-9a-f]{64}$/);
  return { cookie, csrf: csrf! };
}

/** The run ids listed on a page, in order. */
const listed = (page: string) => [...page.matchAll(/<a class="mono" href="\/runs\/([^"]+)">/g)].map((m) => m[1]!);

describe('the run list', () => {
  const ids: Record<string, string[]> = { alpha: [], beta: [] };
  beforeAll(async () => {
    const alpha = t.engine.workflow({ name: 'console-alpha', queue: 'console-a' }, async () => 1);
    const beta = t.engine.workflow({ name: 'console-beta', queue: 'console-b' }, async () => 2);
    // No worker serves these queues: the runs stay PENDING. Started one after another, so their ids ascend.
    for (let i = 0; i < 7; i++) ids.alpha!.push((await t.engine.start(alpha, undefined, { concurrencyKey: `k${i % 2}` })).runId);
    for (let i = 0; i < 3; i++) ids.beta!.push((await t.engine.start(beta, undefined)).runId);
    await t.engine.cancel(ids.beta![0]!);
  });

  it('filters by workflow, status, queue, concurrency key and a part of the run id, and counts per status', async () => {
    const byWorkflow = await (await get('/runs?workflow=console-alpha')).text();
    expect(listed(byWorkflow)).toEqual([...ids.alpha!].reverse());
    expect(byWorkflow).toMatch(/data-testid="count-PENDING"[^>]*>[\s\S]*?PENDING<\/span> 7/);

    const cancelled = await (await get('/runs?status=cancelled')).text();
    expect(listed(cancelled)).toEqual([ids.beta![0]]);
    const pendingBeta = await (await get('/runs?workflow=console-beta&status=PENDING')).text();
    expect(listed(pendingBeta)).toEqual([ids.beta![2], ids.beta![1]]);
    // The counts keep the other filters but not the status: they say what each status link lists.
    expect(pendingBeta).toMatch(/count-CANCELLED[^>]*>[\s\S]*?CANCELLED<\/span> 1/);

    expect(listed(await (await get('/runs?queue=console-b')).text())).toEqual([...ids.beta!].reverse());
    const k1 = ids.alpha!.filter((_, i) => i % 2 === 1).reverse();
    expect(listed(await (await get('/runs?key=k1')).text())).toEqual(k1);

    const target = ids.alpha![3]!;
    expect(listed(await (await get(`/runs?q=${target.slice(-10).toLowerCase()}`)).text())).toEqual([target]);
    expect(listed(await (await get(`/runs?q=${target}`)).text())).toEqual([target]);
    expect(await (await get('/runs?q=NOSUCHRUNIDPART')).text()).toContain('No runs match.');
  });

  it('pages by keyset, newest first: older and newer links cover every run once', async () => {
    const seen: string[] = [];
    let path: string | undefined = '/runs?workflow=console-alpha&limit=3';
    const pages: string[] = [];
    while (path) {
      const page = await (await get(path)).text();
      pages.push(page);
      seen.push(...listed(page));
      path = /href="([^"]+)" rel="next"/.exec(page)?.[1]?.replaceAll('&amp;', '&');
      expect(path ?? '').not.toContain('offset');
    }
    expect(pages).toHaveLength(3); // 3 + 3 + 1
    expect(seen).toEqual([...ids.alpha!].reverse());
    // From the last page, "newer" goes back to the page before it.
    const newer = /href="([^"]+)" rel="prev"/.exec(pages[2]!)?.[1]?.replaceAll('&amp;', '&');
    expect(newer).toContain(`after=${ids.alpha![0]}`);
    expect(listed(await (await get(newer!)).text())).toEqual([ids.alpha![3], ids.alpha![2], ids.alpha![1]]);
    expect(pages[0]).not.toContain('rel="prev"');
  });

  it('answers 404 with NOT_FOUND for an unknown run', async () => {
    const answer = await get('/runs/01NOSUCHRUN0000000000000000');
    expect(answer.status).toBe(404);
    expect(await answer.text()).toContain('error [NOT_FOUND]: run 01NOSUCHRUN0000000000000000 not found');
  });
});

describe('actions', () => {
  let runId: string;
  let requestId: string;
  let worker: Worker | undefined;
  afterAll(async () => {
    await worker?.stop();
  });
  beforeAll(async () => {
    const flow = t.engine.workflow({ name: 'console-approval', queue: 'console-approval' }, async (ctx) => {
      const decision = await ctx.requestApproval('ship', { action: 'ship order 42', evidence: { total: 120 }, timeout: '1h' });
      return decision?.approved ? 'shipped' : 'held';
    });
    worker = await t.engine.runWorker({ queues: ['console-approval'], pollIntervalMs: 100 });
    runId = (await t.engine.start(flow, undefined)).runId;
    requestId = await waitFor('the approval request', async () => {
      const r = await db.pool.query('select request_id from runledger.approval_inbox where run_id = $1', [runId]);
      return r.rows[0]?.request_id as string | undefined;
    });
  });
  const pending = async () =>
    (await db.pool.query('select decision from runledger.approvals where request_id = $1', [requestId])).rows[0].decision === null;

  it('are refused without a token configured, without signing in, with a wrong token or a wrong CSRF field', async () => {
    const form = { request_id: requestId, decision: 'approve', by: 'maria' };
    const disabled = await post('/actions/decide', form, {}, readOnly.url);
    expect(disabled.status).toBe(403);
    expect(await disabled.text()).toContain('error [ACTIONS_DISABLED]');
    expect((await post('/signin', { token: TOKEN }, {}, readOnly.url)).status).toBe(403);

    const anonymous = await post('/actions/decide', form);
    expect(anonymous.status).toBe(403);
    expect(await anonymous.text()).toContain('error [TOKEN_REQUIRED]');

    const wrong = await post('/signin', { token: 'not-the-token' });
    expect(wrong.status).toBe(403);
    expect(wrong.headers.getSetCookie()).toEqual([]);
    expect(await wrong.text()).toContain('error [WRONG_TOKEN]');

    const { cookie, csrf } = await signIn();
    const badCsrf = await post('/actions/decide', { ...form, csrf: csrf.replace(/.$/, (c) => (c === '0' ? '1' : '0')) }, { cookie });
    expect(badCsrf.status).toBe(403);
    const noCookie = await post('/actions/decide', { ...form, csrf });
    expect(noCookie.status).toBe(403);
    expect(await pending()).toBe(true);
  });

  it('are refused by GET, from another site, and to another Host name', async () => {
    const { cookie, csrf } = await signIn();
    const byGet = await get(`/actions/decide?request_id=${requestId}&decision=approve&by=maria&csrf=${csrf}`, { cookie });
    expect(byGet.status).toBe(405);
    expect(byGet.headers.get('allow')).toBe('POST');

    const form = { request_id: requestId, decision: 'approve', by: 'maria', csrf };
    const crossOrigin = await post('/actions/decide', form, { cookie, origin: 'http://evil.example' });
    expect(crossOrigin.status).toBe(403);
    expect(await crossOrigin.text()).toContain('error [CROSS_SITE]');
    const crossSite = await post('/actions/decide', form, { cookie, 'sec-fetch-site': 'cross-site' });
    expect(crossSite.status).toBe(403);

    // A page of another site whose name resolves here (DNS rebinding) sends its own Host.
    const port = new URL(ui.url).port;
    const status = await new Promise<number>((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port, path: '/runs', headers: { host: `evil.example:${port}` } }, (res) => {
        res.resume();
        resolve(res.statusCode!);
      });
      req.on('error', reject);
      req.end();
    });
    expect(status).toBe(421);
    expect(await pending()).toBe(true);
  });

  it('approve through decide_approval, and a refused one shows its code (ALREADY_DECIDED, NOT_FOUND)', async () => {
    const { cookie, csrf } = await signIn();
    const origin = ui.url;
    const back = `/runs/${runId}`;
    const approved = await post(
      '/actions/decide',
      { request_id: requestId, decision: 'approve', by: 'maria', note: 'ok to ship', csrf, back },
      { cookie, origin },
    );
    expect(approved.status).toBe(303);
    expect(approved.headers.get('location')).toMatch(new RegExp(`^/runs/${runId}\\?notice=`));
    const row = (await db.pool.query('select decision, decided_by, note from runledger.approvals where request_id = $1', [requestId]))
      .rows[0];
    expect(row).toEqual({ decision: true, decided_by: 'maria', note: 'ok to ship' });
    await waitFor('the run to finish', async () => (await t.engine.getRun(runId))?.status === 'SUCCEEDED');

    const again = await post('/actions/decide', { request_id: requestId, decision: 'reject', by: 'maria', csrf, back }, { cookie, origin });
    expect(again.status).toBe(409);
    const text = await again.text();
    expect(text).toContain('error [ALREADY_DECIDED]');
    expect(text).toContain('the first decision stands');

    const unknown = await post('/actions/retry', { run_id: 'NOSUCHRUN', csrf, back: '/problems' }, { cookie, origin });
    expect(unknown.status).toBe(404);
    expect(await unknown.text()).toMatch(/error \[NOT_FOUND\]: .*NOSUCHRUN/);
    const invalid = await post('/actions/retry', { run_id: runId, csrf }, { cookie, origin });
    expect(invalid.status).toBe(409);
    expect(await invalid.text()).toContain('error [INVALID_STATE]');
  });

  it('pause and resume a queue through set_queue', async () => {
    const { cookie, csrf } = await signIn();
    const paused = async () => (await db.pool.query("select paused from runledger.queues where name = 'console-a'")).rows[0]?.paused;
    expect((await post('/actions/queue', { name: 'console-a', paused: 'true', csrf }, { cookie })).status).toBe(303);
    expect(await paused()).toBe(true);
    expect(await (await get('/queues')).text()).toMatch(/console-a<\/strong> <span class="status FAILED">PAUSED/);
    expect((await post('/actions/queue', { name: 'console-a', paused: 'false', csrf }, { cookie })).status).toBe(303);
    expect(await paused()).toBe(false);
  });
});

describe('where sign-in goes back to', () => {
  const OFF_SITE = [
    '/\t/evil.example',
    '/\n/evil.example',
    '/\r/evil.example',
    '//evil.example',
    '/\\evil.example',
    '\\\\evil.example',
    'https://evil.example',
    'http://evil.example/runs',
    'javascript:alert(1)',
    ' /runs',
    '/ /runs',
    '',
  ];

  it('an address off this console, or one a browser could read as such, goes to /', async () => {
    for (const back of OFF_SITE) {
      const answer = await post('/signin', { token: TOKEN, back });
      expect(answer.status, JSON.stringify(back)).toBe(303);
      const location = answer.headers.get('location')!;
      expect(location, JSON.stringify(back)).toMatch(/^\/\?notice=/);
      expect(new URL(location, ui.url).origin).toBe(new URL(ui.url).origin);
      // The sign-in page carries / in its form, not the address it was given.
      const page = await (await get(`/signin?back=${encodeURIComponent(back)}`)).text();
      expect(page, JSON.stringify(back)).toContain('name="back" value="/"');
    }
    // / then keeps the notice on its way to the run list.
    const home = await get('/?notice=signed%20in');
    expect(home.status).toBe(302);
    expect(home.headers.get('location')).toBe('/runs?notice=signed%20in');
  });

  it('a path of this console is kept', async () => {
    for (const back of ['/runs', '/runs/01ABC?status=FAILED&limit=3', '/approvals', '/', '/?x=1']) {
      const answer = await post('/signin', { token: TOKEN, back });
      expect(answer.headers.get('location')).toBe(`${back}${back.includes('?') ? '&' : '?'}notice=signed+in%3A+actions+are+enabled`);
    }
    expect(OFF_SITE.map((back) => safeBack(back))).toEqual(OFF_SITE.map(() => '/'));
    expect(safeBack(undefined)).toBe('/');
  });

  it("an action's back address is held to the same rule", async () => {
    const { cookie, csrf } = await signIn();
    const answer = await post('/actions/queue', { name: 'console-a', paused: 'false', csrf, back: '/\t/evil.example' }, { cookie });
    expect(answer.status).toBe(303);
    expect(answer.headers.get('location')).toMatch(/^\/\?notice=/);
  });
});

describe('signing out', () => {
  it('closes the session on the server: a copy of its cookie taken before no longer works; another session does', async () => {
    const a = await signIn();
    const b = await signIn();
    expect(a.cookie).not.toBe(b.cookie);
    expect(a.csrf).not.toBe(b.csrf);
    const act = (session: { cookie: string; csrf: string }) =>
      post('/actions/queue', { name: 'console-a', paused: 'false', csrf: session.csrf }, { cookie: session.cookie });
    expect((await act(a)).status).toBe(303);
    // One session's field does not work with another's cookie.
    expect((await post('/actions/queue', { name: 'console-a', paused: 'false', csrf: b.csrf }, { cookie: a.cookie })).status).toBe(403);

    const out = await post('/logout', { csrf: a.csrf }, { cookie: a.cookie });
    expect(out.status).toBe(303);
    expect(out.headers.getSetCookie().join(';')).toMatch(/runledger_console=;/);

    // The captured cookie and field, replayed after the sign-out.
    const replayed = await act(a);
    expect(replayed.status).toBe(403);
    expect(await replayed.text()).toContain('error [TOKEN_REQUIRED]');
    const page = await (await get('/approvals', { cookie: a.cookie })).text();
    expect(page).toContain('sign in to act');
    expect(page).not.toContain('name="csrf"');
    expect((await post('/logout', { csrf: a.csrf }, { cookie: a.cookie })).status).toBe(403);
    // The other browser's session is untouched.
    expect((await act(b)).status).toBe(303);
  });

  it('a session ends after SESSION_MS, and the oldest gives way past MAX_SESSIONS', () => {
    const guard = new Guard('a-token');
    const t0 = 1_000_000;
    const id = guard.openSession(t0);
    expect(guard.session(id, t0 + SESSION_MS - 1)).toBe(id);
    expect(guard.session(id, t0 + SESSION_MS)).toBeUndefined();
    expect(guard.session(id, t0)).toBeUndefined(); // ended is closed
    const first = guard.openSession(t0);
    for (let i = 1; i < MAX_SESSIONS; i++) guard.openSession(t0);
    expect(guard.session(first, t0)).toBe(first);
    const last = guard.openSession(t0);
    expect(guard.session(first, t0)).toBeUndefined();
    expect(guard.session(last, t0)).toBe(last);
    expect(guard.csrfMatches(guard.csrfFor(last), last)).toBe(true);
    expect(guard.csrfMatches(guard.csrfFor(last), first)).toBe(false);
    expect(new Guard(undefined).session(last)).toBeUndefined();
    // The token itself, only: not with NULs appended (which HMAC's zero-padded key would not tell apart), nor a prefix.
    expect(guard.tokenMatches('a-token')).toBe(true);
    for (const other of ['a-token\u0000', 'a-token\u0000\u0000', 'a-toke', 'a-token ', '', undefined])
      expect(guard.tokenMatches(other)).toBe(false);
  });
});

describe('input PostgreSQL cannot hold', () => {
  const invalid = async (answer: Response, what: string) => {
    expect(answer.status, what).toBe(400);
    expect(await answer.text(), what).toContain('INVALID_INPUT');
  };

  it('a NUL in the query or the path is 400 INVALID_INPUT, not a 500', async () => {
    for (const path of [
      '/runs?workflow=%00',
      '/runs?status=FAILED%00',
      '/runs?queue=a%00b',
      '/runs?key=%00',
      '/runs?q=%00',
      '/runs?before=%00',
      '/runs?%00=1',
      '/runs/%00',
      '/runs/01ABC%00',
      '/approvals?x=%00',
    ]) {
      await invalid(await get(path), path);
    }
    const poll = await get('/runs/01ABC/streams/out%00?from=0');
    expect(poll.status).toBe(400);
    expect(await poll.json()).toMatchObject({ error: { code: 'INVALID_INPUT' } });
    // Bytes that are not UTF-8 (a surrogate's own encoding among them) are taken as written: a search that finds nothing.
    const undecodable = await get('/runs?workflow=%ED%A0%80&q=%F0%9F%98');
    expect(undecodable.status).toBe(200);
  });

  it('a NUL in a form field, or a NUL or lone surrogate escaped in a JSON field, is 400 INVALID_INPUT and stores nothing', async () => {
    await invalid(await post('/signin', { token: `${TOKEN}\u0000` }), 'sign-in token');
    const { cookie, csrf } = await signIn();
    await invalid(await post('/actions/queue', { name: 'console-a\u0000', paused: 'true', csrf }, { cookie }), 'queue name');
    await invalid(await post('/actions/queue', { name: 'console-a', paused: 'true', csrf, back: '/runs\u0000' }, { cookie }), 'back');
    const runId = '01CONSOLEINPUTRUN000000000'; // refused before any SQL: the run need not exist
    const signals = async () =>
      (await db.pool.query('select count(*)::int as n from runledger.signals where run_id = $1', [runId])).rows[0].n;
    for (const payload of ['{"text": "a\\u0000b"}', '{"text": "Great \\ud83d"}', '{"\\udc00": 1}']) {
      await invalid(await post('/actions/signal', { run_id: runId, topic: 'go', payload, csrf }, { cookie }), payload);
    }
    expect(await signals()).toBe(0);
    expect((await db.pool.query("select paused from runledger.queues where name = 'console-a'")).rows[0]?.paused ?? false).toBe(false);
  });
});

describe('starting', () => {
  it('refuses a host that is not loopback without a token', async () => {
    await expect(startConsole({ pool: db.pool, host: '0.0.0.0', port: 0 })).rejects.toMatchObject({ code: 'CONFIG' });
  });
});
