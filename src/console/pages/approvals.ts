/** The approval inbox: pending requests with their action and evidence, decided here with a note. */
import { html } from 'hono/html';
import { json, layout, runLink, when, type Html, type PageContext } from './layout.js';
import { decideForm } from './run.js';

export function approvalsPage(ctx: PageContext, rows: Array<Record<string, unknown>>): Html {
  const body = html`
    <h1>Approval inbox (${rows.length})</h1>
    ${
      rows.length === 0
        ? html`<p>No pending approval requests.</p>`
        : html`<table data-testid="inbox">
            <tr>
              <th>request</th>
              <th>run</th>
              <th>action</th>
              <th>evidence</th>
              <th>approvers</th>
              <th>requested / expires</th>
              <th>decide</th>
            </tr>
            ${rows.map(
              (a) =>
                html`<tr data-request="${a.request_id}">
                  <td class="mono">${a.request_id}<br />${a.name}</td>
                  <td>${runLink(a.run_id as string)}<br />${a.workflow_name}</td>
                  <td><strong>${a.action}</strong></td>
                  <td><pre>${json(a.evidence, 1500)}</pre></td>
                  <td>${(a.approvers as string[] | null)?.join(', ') || 'anyone'}</td>
                  <td>${when(a.requested_at as Date)}<br />${a.expires_at ? `until ${when(a.expires_at as Date)}` : 'no expiry'}</td>
                  <td>${ctx.signedIn ? decideForm(ctx, a.request_id as string) : html`<span class="muted">sign in to decide</span>`}</td>
                </tr>`,
            )}
          </table>`
    }
  `;
  return layout(ctx, 'Approvals', body);
}
