/** Signing in: the operator gives the console's token (once) and the name decisions are recorded under. */
import { html } from 'hono/html';
import { layout, type Html, type PageContext } from './layout.js';

export function signinPage(ctx: PageContext, back: string): Html {
  const body = ctx.actionsEnabled
    ? html`<h1>Sign in to act</h1>
        <p>
          Reads need no token. Actions (approve, retry, fork, resolve, queues) need the console's token: the one given with
          <code>--token</code> or <code>RUNLEDGER_UI_TOKEN</code>.
        </p>
        <form method="post" action="/signin" data-testid="signin">
          <input type="hidden" name="back" value="${back}" />
          <p>
            <label>token <input name="token" type="password" autocomplete="current-password" required /></label>
          </p>
          <p>
            <label>your name (decisions are recorded under it) <input name="name" value="${ctx.name ?? ''}" /></label>
          </p>
          <button type="submit">Sign in</button>
        </form>`
    : html`<h1>Actions are disabled</h1>
        <p>
          This console was started without a token, so it only reads. Start it with <code>runledger ui --token TOKEN</code> or
          <code>RUNLEDGER_UI_TOKEN</code> to act from it.
        </p>`;
  return layout(ctx, 'Sign in', body);
}

/** A page for a request that was refused (or an unknown page), with its code. */
export function errorPage(ctx: PageContext, title: string, back?: string): Html {
  return layout(ctx, title, html`<p>${back ? html`<a href="${back}">← back</a>` : html`<a href="/runs">← runs</a>`}</p>`);
}
