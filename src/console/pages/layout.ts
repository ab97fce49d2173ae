/**
 * The frame of every page: navigation, the sign-in state, the notice or coded error of the
 * last action, and helpers the pages share. Server-rendered HTML through hono's `html`
 * tag, which escapes every interpolated value (only other `html` fragments pass through).
 */
import { html } from 'hono/html';
import type { HtmlEscapedString } from 'hono/utils/html';

export type Html = HtmlEscapedString | Promise<HtmlEscapedString> | string;

export interface PageContext {
  /** The path and query of this page, where an action returns to. */
  here: string;
  actionsEnabled: boolean;
  signedIn: boolean;
  csrf: string | undefined;
  /** The operator's name, from the sign-in form: the default `decided by`. */
  name: string | undefined;
  notice?: string | undefined;
  error?: { code: string; message: string } | undefined;
}

const STYLE = `
  body { font: 14px/1.4 system-ui, sans-serif; margin: 0; color: #1d2330; background: #f6f7f9; }
  header { background: #1d2330; color: #fff; padding: 8px 16px; display: flex; gap: 18px; align-items: center; }
  header a { color: #cfd8ea; text-decoration: none; } header a:hover, header a.on { color: #fff; text-decoration: underline; }
  header .who { margin-left: auto; font-size: 12px; color: #aab; }
  main { padding: 12px 16px; max-width: 1400px; }
  h1 { font-size: 18px; margin: 6px 0 10px; } h2 { font-size: 15px; margin: 18px 0 6px; }
  table { border-collapse: collapse; background: #fff; width: 100%; margin-bottom: 8px; }
  th, td { text-align: left; padding: 4px 8px; border-bottom: 1px solid #e3e6eb; vertical-align: top; }
  th { background: #eef0f4; font-weight: 600; font-size: 12px; }
  td.num, th.num { text-align: right; }
  code, .mono { font-family: ui-monospace, monospace; font-size: 12px; }
  pre { background: #fff; border: 1px solid #e3e6eb; padding: 6px; max-height: 240px; overflow: auto; margin: 2px 0; white-space: pre-wrap; }
  .status { font-size: 11px; font-weight: 600; padding: 1px 6px; border-radius: 8px; background: #e3e6eb; }
  .SUCCEEDED { background: #d5f1dd; } .FAILED, .DEAD_LETTER, .TERMINATED { background: #f8d7d7; }
  .WAITING, .PENDING { background: #fdf0c8; } .RUNNING, .CANCELLING { background: #d7e6fb; }
  tr.unknown td { background: #fff1c2; } .UNKNOWN { background: #ffcf4d; }
  .notice { background: #d5f1dd; padding: 6px 10px; border-radius: 4px; margin-bottom: 10px; }
  .error { background: #f8d7d7; padding: 6px 10px; border-radius: 4px; margin-bottom: 10px; font-weight: 600; }
  form.inline { display: inline-flex; gap: 4px; align-items: center; margin: 2px 0; flex-wrap: wrap; }
  input, select, button { font: inherit; font-size: 13px; padding: 2px 6px; }
  button { cursor: pointer; }
  .filters { display: flex; gap: 8px; flex-wrap: wrap; align-items: end; margin-bottom: 8px; }
  .filters label { display: flex; flex-direction: column; font-size: 11px; color: #556; }
  .counts a { margin-right: 10px; text-decoration: none; }
  .pager { display: flex; gap: 16px; margin: 8px 0; }
  dl.summary { display: grid; grid-template-columns: 140px 1fr; gap: 2px 10px; background: #fff; padding: 8px; margin: 0; }
  dl.summary dt { color: #556; } dl.summary dd { margin: 0; }
  .muted { color: #778; font-size: 12px; }
`;

const NAV: Array<[string, string]> = [
  ['/runs', 'Runs'],
  ['/approvals', 'Approvals'],
  ['/problems', 'Dead letter & unknown'],
  ['/queues', 'Queues & workers'],
];

export function layout(ctx: PageContext, title: string, body: Html): Html {
  const path = ctx.here.split('?')[0]!;
  const who = !ctx.actionsEnabled
    ? html`read-only: no token configured`
    : ctx.signedIn
      ? html`signed in${ctx.name ? ` as ${ctx.name}` : ''}
          <form class="inline" method="post" action="/logout">${csrfField(ctx)}<button>sign out</button></form>`
      : html`<a href="/signin?back=${encodeURIComponent(ctx.here)}">sign in to act</a>`;
  return html`<!doctype html>
    <html lang="en">
      <head>
        <meta charset="utf-8" />
        <meta name="referrer" content="same-origin" />
        <title>${title} · runledger</title>
        <style>
          ${STYLE}
        </style>
      </head>
      <body>
        <header>
          <strong>runledger</strong>
          ${NAV.map(([href, label]) => html`<a href="${href}" class="${path.startsWith(href) ? 'on' : ''}">${label}</a>`)}
          <span class="who">${who}</span>
        </header>
        <main>
          ${ctx.notice ? html`<div class="notice" role="status">${ctx.notice}</div>` : ''}
          ${ctx.error ? html`<div class="error" role="alert">error [${ctx.error.code}]: ${ctx.error.message}</div>` : ''} ${body}
        </main>
      </body>
    </html>`;
}

export function csrfField(ctx: PageContext): Html {
  return html`<input type="hidden" name="csrf" value="${ctx.csrf ?? ''}" /><input type="hidden" name="back" value="${ctx.here}" />`;
}

/**
 * A POST form to one action (/actions/NAME), or, for an operator not signed in, nothing
 * but a hint: forms carry the CSRF field only for a signed-in operator.
 */
export function actionForm(ctx: PageContext, action: string, fields: Html, button: string, extra: { testId?: string } = {}): Html {
  if (!ctx.actionsEnabled || !ctx.signedIn) return '';
  return html`<form class="inline" method="post" action="/actions/${action}" data-testid="${extra.testId ?? action}">
    ${csrfField(ctx)}${fields}<button type="submit">${button}</button>
  </form>`;
}

export function status(value: string | null | undefined): Html {
  return html`<span class="status ${value ?? ''}">${value ?? '-'}</span>`;
}

export function runLink(runId: string | null | undefined): Html {
  return runId ? html`<a class="mono" href="/runs/${encodeURIComponent(runId)}">${runId}</a>` : html`-`;
}

export function when(date: Date | string | null | undefined): string {
  if (date === null || date === undefined) return '-';
  const d = typeof date === 'string' ? new Date(date) : date;
  return d
    .toISOString()
    .replace('T', ' ')
    .replace(/\.\d+Z$/, 'Z');
}

/** "3 s", "4 min", "2 h", "5 d": an age for a table cell. */
export function age(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) return '-';
  if (seconds < 120) return `${Math.max(0, Math.round(seconds))} s`;
  if (seconds < 7200) return `${Math.round(seconds / 60)} min`;
  if (seconds < 172_800) return `${Math.round(seconds / 3600)} h`;
  return `${Math.round(seconds / 86_400)} d`;
}

export function since(date: Date | null | undefined): string {
  return date ? age((Date.now() - date.getTime()) / 1000) : '-';
}

/** JSON for a <pre>, cut at `max` characters (the whole value is in psql). */
export function json(value: unknown, max = 4000): string {
  if (value === null || value === undefined) return '-';
  const text = JSON.stringify(value, (_key, v: unknown) => (typeof v === 'bigint' ? v.toString() : v), 2);
  return text.length > max ? `${text.slice(0, max)}\n… (${text.length - max} more characters: runledger show RUN_ID --json)` : text;
}
