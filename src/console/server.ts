/**
 * The web console (`runledger ui`, docs/console.md): server-rendered pages over the same
 * views and SQL functions the CLI and psql use, served by hono on Node's http server.
 * Reads are open on loopback; actions need the token (security.ts says how).
 */
import type { Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createAdaptorServer } from '@hono/node-server';
import { Hono, type Context } from 'hono';
import { deleteCookie, getCookie, setCookie } from 'hono/cookie';
import pg from 'pg';
import { ConfigError } from '../engine/core/errors.js';
import type { LogFunction } from '../engine/core/log.js';
import type { PayloadCodec } from '../engine/core/codec.js';
import { NO_CODEC, Payloads } from '../engine/core/payloads.js';
import { ACTIONS, ActionError, describeRefusal, type Form } from './actions.js';
import * as q from './queries.js';
import { approvalsPage } from './pages/approvals.js';
import { layout, type Html, type PageContext } from './pages/layout.js';
import { problemsPage } from './pages/problems.js';
import { queuesPage } from './pages/queues.js';
import { runPage } from './pages/run.js';
import { runsPage } from './pages/runs.js';
import { errorPage, signinPage } from './pages/signin.js';
import { Guard, NAME_COOKIE, SESSION_COOKIE, SESSION_MS, allowedHosts, crossSite, isLoopback, safeBack, unstorable } from './security.js';
import { STREAMS_JS } from './static.js';

export interface ConsoleOptions {
  /** The database, when no pool is given. */
  connectionString?: string;
  /** A pool to use (not closed by close()); else the console opens, and closes, its own. */
  pool?: pg.Pool;
  /** Default 127.0.0.1. Any other address than loopback needs a token. */
  host?: string;
  /** Default 3100; 0 takes any free port (the URL says which). */
  port?: number;
  /** Actions need it (RUNLEDGER_UI_TOKEN, --token); without one the console only reads. */
  token?: string;
  log?: LogFunction;
  /** The payload codec, so that notes, results and signal payloads sent from the console are encoded like the engine's. */
  codec?: PayloadCodec;
}

export interface RunningConsole {
  url: string;
  close(): Promise<void>;
}

export const DEFAULT_PORT = 3100;

function withNotice(path: string, notice: string): string {
  const [base, query = ''] = path.split('?');
  const params = new URLSearchParams(query);
  params.delete('notice');
  params.set('notice', notice);
  return `${base}?${params.toString()}`;
}

export async function startConsole(options: ConsoleOptions = {}): Promise<RunningConsole> {
  const host = options.host ?? '127.0.0.1';
  const token = options.token || undefined;
  if (!isLoopback(host) && !token) {
    throw new ConfigError(`runledger ui: binding ${host} (not loopback) needs a token (--token or RUNLEDGER_UI_TOKEN)`);
  }
  if (!options.pool && !options.connectionString) throw new ConfigError('runledger ui: no database (connectionString or pool)');
  const log: LogFunction = options.log ?? (() => {});
  const ownPool = options.pool ? undefined : new pg.Pool({ connectionString: options.connectionString, max: 5 });
  ownPool?.on('error', () => {}); // an idle connection dropped by the server: the next query reports it
  const pool = options.pool ?? ownPool!;
  const payloads = options.codec ? new Payloads(options.codec) : NO_CODEC;
  const guard = new Guard(token);
  let hosts = new Set<string>();

  const app = new Hono();

  const context = (c: Context, extra: Partial<PageContext> = {}): PageContext => {
    const url = new URL(c.req.url);
    const params = new URLSearchParams(url.search);
    const notice = params.get('notice') ?? undefined;
    params.delete('notice');
    const rest = params.toString();
    const session = guard.session(getCookie(c, SESSION_COOKIE));
    return {
      here: `${url.pathname}${rest ? `?${rest}` : ''}`,
      actionsEnabled: guard.actionsEnabled,
      signedIn: session !== undefined,
      csrf: session === undefined ? undefined : guard.csrfFor(session),
      name: getCookie(c, NAME_COOKIE),
      notice,
      ...extra,
    };
  };

  const render = async (c: Context, page: Html, statusCode: 200 | 400 | 403 | 404 | 405 | 409 | 421 | 500 = 200) => {
    c.header('Cache-Control', 'no-store');
    c.header('X-Frame-Options', 'DENY');
    c.header('Content-Security-Policy', "default-src 'self'; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'; form-action 'self'");
    return c.html(await page, statusCode);
  };

  const refuse = (c: Context, statusCode: 400 | 403 | 404 | 405 | 409 | 421 | 500, code: string, message: string, back?: string) =>
    render(c, errorPage(context(c, { error: { code, message } }), `error ${code}`, back), statusCode);

  /** 400 INVALID_INPUT for input PostgreSQL cannot hold; JSON for the stream poll, a page for the rest. */
  const refuseInput = (c: Context, where: string) => {
    const message = `${where} holds a NUL character or half of a UTF-16 surrogate pair, which PostgreSQL cannot store`;
    if (/^\/runs\/[^/]+\/streams\//.test(c.req.path)) return c.json({ error: { code: 'INVALID_INPUT', message } }, 400);
    return render(c, errorPage(context(c, { here: '/', error: { code: 'INVALID_INPUT', message } }), 'error INVALID_INPUT'), 400);
  };

  /** A POST's form, or undefined when a field holds what PostgreSQL cannot hold. */
  const formOf = async (c: Context): Promise<Form | undefined> => {
    const form = (await c.req.parseBody()) as Form;
    return Object.entries(form).some(([key, value]) => unstorable(key) || unstorable(value)) ? undefined : form;
  };

  // Before anything: a request for another host name (DNS rebinding) and a cross-site POST.
  app.use('*', async (c, next) => {
    const hostHeader = c.req.header('host') ?? '';
    if (!hosts.has(hostHeader)) return refuse(c, 421, 'WRONG_HOST', `this console answers to ${[...hosts].join(', ')}, not ${hostHeader}`);
    if (c.req.method === 'POST') {
      const origin = c.req.header('origin');
      const fetchSite = c.req.header('sec-fetch-site');
      if (crossSite({ origin, host: hostHeader, fetchSite })) {
        log('warn', 'runledger ui: refused a cross-site POST', { path: c.req.path, origin: origin ?? null, fetchSite: fetchSite ?? null });
        return refuse(c, 403, 'CROSS_SITE', `a POST from another site (${origin ?? fetchSite}) is refused`);
      }
    }
    // What PostgreSQL cannot hold never reaches a query: a NUL (%00) or half a surrogate pair in the path or the query.
    if (unstorable(c.req.path) || Object.entries(c.req.queries()).some(([key, values]) => unstorable(key) || unstorable(values))) {
      return refuseInput(c, 'the address');
    }
    await next();
  });

  app.get('/', (c) => {
    const query = new URL(c.req.url).search;
    return c.redirect(`/runs${query}`);
  });
  app.get('/static/streams.js', (c) => {
    c.header('Content-Type', 'text/javascript; charset=utf-8');
    return c.body(STREAMS_JS);
  });

  app.get('/runs', async (c) => {
    const query = c.req.query();
    const filters: q.RunFilters = {
      status: (query.status ?? '')
        .split(',')
        .map((s) => s.trim().toUpperCase())
        .filter(Boolean),
      ...(query.workflow ? { workflow: query.workflow } : {}),
      ...(query.queue ? { queue: query.queue } : {}),
      ...(query.key ? { concurrencyKey: query.key } : {}),
      ...(query.q ? { search: query.q } : {}),
    };
    const cursor = { ...(query.before ? { before: query.before } : {}), ...(query.after ? { after: query.after } : {}) };
    const limit = Math.min(Math.max(Math.trunc(Number(query.limit)) || q.PAGE_SIZE, 1), q.MAX_PAGE_SIZE);
    let [page, counts] = await Promise.all([q.listRuns(pool, filters, cursor, limit), q.statusCounts(pool, filters)]);
    if (page.rows.length === 0 && filters.search && !cursor.before && !cursor.after) {
      // No id starts with it: look for it inside the ids (a scan, so only then).
      filters.searchInside = true;
      [page, counts] = await Promise.all([q.listRuns(pool, filters, cursor, limit), q.statusCounts(pool, filters)]);
    }
    const estimate = Object.keys(query).length === 0 ? await q.estimatedRuns(pool) : undefined;
    return render(c, runsPage(context(c), { filters, counts, limit, estimate, ...page }));
  });

  app.get('/runs/:id', async (c) => {
    const runId = c.req.param('id');
    const doc = await q.runDocument(pool, runId);
    if (!doc) return refuse(c, 404, 'NOT_FOUND', `run ${runId} not found`);
    const [streams, sessionEntries, environments] = await Promise.all([
      q.runStreams(pool, runId),
      q.runSessionEntries(pool, runId),
      q.runEnvironments(pool, runId),
    ]);
    return render(c, runPage(context(c), { doc, streams, sessionEntries, environments }));
  });

  // What the live stream view polls: the chunks of one stream from an offset on, as JSON.
  app.get('/runs/:id/streams/:topic', async (c) => {
    const from = Number(c.req.query('from') ?? 0);
    const chunks = await q.streamChunks(pool, c.req.param('id'), c.req.param('topic'), Number.isInteger(from) && from >= 0 ? from : 0);
    const ends = await pool.query<{ end_offset: string }>('select end_offset from runledger.stream_ends where run_id = $1 and topic = $2', [
      c.req.param('id'),
      c.req.param('topic'),
    ]);
    c.header('Cache-Control', 'no-store');
    return c.json({ chunks, closed: ends.rows.length > 0 });
  });

  app.get('/approvals', async (c) => {
    // With the codec (runledger ui with RUNLEDGER_KEYS) what is asked, and its evidence, read in clear;
    // a value this console cannot decode (a key it lacks) is shown as stored.
    const readable = (decode: () => unknown, stored: unknown) => {
      try {
        return decode();
      } catch {
        return stored;
      }
    };
    const rows = (await q.approvalInbox(pool)).map((a) => ({
      ...a,
      action: readable(() => payloads.decodeNote(a.action), a.action),
      evidence: readable(() => payloads.decode(a.evidence), a.evidence),
    }));
    return render(c, approvalsPage(context(c), rows));
  });
  app.get('/problems', async (c) => {
    const [dead, unknown, reclaims] = await Promise.all([q.deadLetters(pool), q.unknownOperations(pool), q.failingReclaims(pool)]);
    return render(c, problemsPage(context(c), dead, unknown, reclaims));
  });
  app.get('/queues', async (c) => {
    const [queues, workers] = await Promise.all([q.queueRows(pool), q.workerRows(pool)]);
    return render(c, queuesPage(context(c), queues, workers));
  });

  app.get('/signin', (c) => render(c, signinPage(context(c), safeBack(c.req.query('back')))));
  app.post('/signin', async (c) => {
    const form = await formOf(c);
    if (!form) return refuseInput(c, 'a form field');
    const back = safeBack(form.back);
    if (!guard.actionsEnabled) return refuse(c, 403, 'ACTIONS_DISABLED', 'this console was started without a token: it only reads');
    if (!guard.tokenMatches(form.token)) {
      log('warn', 'runledger ui: sign-in with a wrong token');
      return render(c, signinPage(context(c, { error: { code: 'WRONG_TOKEN', message: 'that is not the token' } }), back), 403);
    }
    const cookie = { httpOnly: true, sameSite: 'Strict', path: '/', maxAge: SESSION_MS / 1000 } as const;
    // A new session each time; the one this browser held, if any, is closed.
    const previous = guard.session(getCookie(c, SESSION_COOKIE));
    if (previous !== undefined) guard.closeSession(previous);
    setCookie(c, SESSION_COOKIE, guard.openSession(), cookie);
    if (form.name?.trim()) setCookie(c, NAME_COOKIE, form.name.trim().slice(0, 100), cookie);
    return c.redirect(withNotice(back, 'signed in: actions are enabled'), 303);
  });
  app.post('/logout', async (c) => {
    const form = await formOf(c);
    if (!form) return refuseInput(c, 'a form field');
    const session = guard.session(getCookie(c, SESSION_COOKIE));
    if (session === undefined || !guard.csrfMatches(form.csrf, session)) return refuse(c, 403, 'NOT_SIGNED_IN', 'not signed in');
    // Closed here, not only forgotten by this browser: a copy of the cookie no longer works.
    guard.closeSession(session);
    deleteCookie(c, SESSION_COOKIE, { path: '/' });
    return c.redirect('/runs?notice=signed%20out', 303);
  });

  // No action by GET: the address of an action changes nothing when it is merely visited.
  app.get('/actions/:name', (c) => {
    c.header('Allow', 'POST');
    return refuse(c, 405, 'METHOD_NOT_ALLOWED', 'actions are POST only: use the buttons of the pages');
  });
  app.post('/actions/:name', async (c) => {
    const name = c.req.param('name');
    const form = await formOf(c);
    if (!form) return refuseInput(c, 'a form field');
    const back = safeBack(form.back);
    const action = ACTIONS[name];
    if (!action) return refuse(c, 404, 'NOT_FOUND', `no action ${name}`, back);
    if (!guard.actionsEnabled)
      return refuse(
        c,
        403,
        'ACTIONS_DISABLED',
        'this console was started without a token (--token or RUNLEDGER_UI_TOKEN): it only reads',
        back,
      );
    const session = guard.session(getCookie(c, SESSION_COOKIE));
    if (session === undefined || !guard.csrfMatches(form.csrf, session))
      return refuse(
        c,
        403,
        'TOKEN_REQUIRED',
        "actions need the token: sign in first (the page's form field and cookie did not match it)",
        back,
      );
    try {
      const notice = await action.run(pool, form, payloads);
      log('info', `runledger ui: ${name}`, { notice });
      return c.redirect(withNotice(back, notice), 303);
    } catch (error) {
      if (!(error instanceof ActionError)) {
        const { code } = describeRefusal(error);
        if (code === 'ERROR' || /^[0-9A-Z]{5}$/.test(code)) log('error', `runledger ui: ${name} failed`, { error: String(error) });
      }
      const { code, message, httpStatus } = describeRefusal(error);
      return refuse(c, httpStatus, code, message, back);
    }
  });

  app.notFound((c) => refuse(c, 404, 'NOT_FOUND', `no page ${c.req.path}`));
  app.onError((error, c) => {
    const { code, message, httpStatus } = describeRefusal(error);
    // A refusal of the input (PostgreSQL's data exceptions included) is the caller's 400; anything else is ours.
    if (httpStatus === 500) log('error', 'runledger ui: a page failed', { path: c.req.path, error: String(error) });
    return render(c, layout(context(c, { here: '/', error: { code, message } }), 'error', ''), httpStatus);
  });

  const server = createAdaptorServer({ fetch: app.fetch }) as Server;
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(options.port ?? DEFAULT_PORT, host, () => {
      server.off('error', reject);
      resolve();
    });
  }).catch(async (error: unknown) => {
    await ownPool?.end();
    throw error;
  });
  const port = (server.address() as AddressInfo).port;
  hosts = allowedHosts(host, port);
  const url = `http://${host.includes(':') ? `[${host}]` : host}:${port}`;
  log('info', `runledger ui: listening on ${url}`, { actions: guard.actionsEnabled });

  return {
    url,
    async close() {
      await new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      });
      await ownPool?.end();
    },
  };
}
