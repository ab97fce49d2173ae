/** The run list: filters, counts per status, and keyset pages of 50, newest first. */
import { html } from 'hono/html';
import { RUN_STATES } from '../../engine/core/states.js';
import { COUNT_CAP, PAGE_SIZE, type RunFilters, type RunListRow } from '../queries.js';
import { layout, runLink, since, status, type Html, type PageContext } from './layout.js';

export interface RunsPage {
  filters: RunFilters;
  rows: RunListRow[];
  counts: Map<string, number>;
  older: boolean;
  newer: boolean;
  limit: number;
  /** The planner's estimate of all runs, on the unfiltered list. */
  estimate?: number | undefined;
}

/** The query string of these filters (and a cursor), for links that keep them. */
export function filterQuery(filters: RunFilters, extra: Record<string, string> = {}, limit?: number): string {
  const params = new URLSearchParams();
  if (limit !== undefined && limit !== PAGE_SIZE) params.set('limit', String(limit));
  if (filters.status.length > 0) params.set('status', filters.status.join(','));
  if (filters.workflow) params.set('workflow', filters.workflow);
  if (filters.queue) params.set('queue', filters.queue);
  if (filters.concurrencyKey) params.set('key', filters.concurrencyKey);
  if (filters.search) params.set('q', filters.search);
  for (const [k, v] of Object.entries(extra)) params.set(k, v);
  const text = params.toString();
  return text ? `?${text}` : '';
}

export function runsPage(ctx: PageContext, page: RunsPage): Html {
  const { filters, rows, counts } = page;
  const capped = [...counts.values()].some((n) => n > COUNT_CAP);
  const count = (n: number) => (n > COUNT_CAP ? `${COUNT_CAP.toLocaleString('en')}+` : n.toLocaleString('en'));
  const sum = [...counts.values()].reduce((a, b) => a + Math.min(b, COUNT_CAP), 0);
  const total = capped ? `${sum.toLocaleString('en')}+` : sum.toLocaleString('en');
  const countLinks = RUN_STATES.filter((s) => counts.has(s)).map(
    (s) =>
      html`<a href="/runs${filterQuery({ ...filters, status: [s] })}" data-testid="count-${s}">${status(s)} ${count(counts.get(s)!)}</a>`,
  );
  const input = (name: string, label: string, value: string | undefined, placeholder = '') =>
    html`<label>${label}<input name="${name}" value="${value ?? ''}" placeholder="${placeholder}" /></label>`;
  const body = html`
    <h1>Runs</h1>
    <form class="filters" method="get" action="/runs">
      <label
        >status
        <select name="status">
          <option value="">any</option>
          ${RUN_STATES.map(
            (s) => html`<option value="${s}" ${filters.status.length === 1 && filters.status[0] === s ? 'selected' : ''}>${s}</option>`,
          )}
        </select></label
      >
      ${input('workflow', 'workflow', filters.workflow)} ${input('queue', 'queue', filters.queue)}
      ${input('key', 'concurrency key', filters.concurrencyKey)} ${input('q', 'run id (start or part)', filters.search, '01J9…')}
      <button type="submit">filter</button> <a href="/runs">clear</a>
    </form>
    <p class="counts">
      <a href="/runs${filterQuery({ ...filters, status: [] })}" data-testid="count-all">all ${total}</a>
      ${page.estimate !== undefined && capped ? html`<span class="muted">(about ${page.estimate.toLocaleString('en')} runs in all)</span>` : ''}
      ${countLinks}
    </p>
    ${
      rows.length === 0
        ? html`<p>No runs match.</p>`
        : html`<table data-testid="runs">
            <thead>
              <tr>
                <th>run id</th>
                <th>workflow</th>
                <th>status</th>
                <th>reason / waits for</th>
                <th>queue</th>
                <th>parent</th>
                <th>created</th>
              </tr>
            </thead>
            <tbody>
              ${rows.map(
                (r) =>
                  html`<tr>
                    <td>${runLink(r.run_id)}</td>
                    <td>${r.workflow_name}@${r.workflow_version}</td>
                    <td>${status(r.status)}</td>
                    <td>${r.termination_reason ?? (r.wait_kind ? `waits: ${r.wait_kind}` : '-')}</td>
                    <td>${r.queue_name}${r.concurrency_key ? html` <span class="muted">key ${r.concurrency_key}</span>` : ''}</td>
                    <td>${r.parent_run_id ? runLink(r.parent_run_id) : '-'}</td>
                    <td title="${r.created_at.toISOString()}">${since(r.created_at)} ago</td>
                  </tr>`,
              )}
            </tbody>
          </table>`
    }
    <nav class="pager">
      ${page.newer && rows.length > 0 ? html`<a href="/runs${filterQuery(filters, { after: rows[0]!.run_id }, page.limit)}" rel="prev">← newer</a>` : ''}
      ${page.older && rows.length > 0 ? html`<a href="/runs${filterQuery(filters, { before: rows.at(-1)!.run_id }, page.limit)}" rel="next">older →</a>` : ''}
    </nav>
  `;
  return layout(ctx, 'Runs', body);
}
