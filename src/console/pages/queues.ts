/** Queues (what they hold, their limits, pause and resume) and workers (heartbeat age, runs held, versions served). */
import { html } from 'hono/html';
import type { QueueRow, WorkerRow } from '../queries.js';
import { actionForm, age, layout, type Html, type PageContext } from './layout.js';

const limitText = (q: QueueRow) =>
  [
    q.concurrency === null ? undefined : `concurrency ${q.concurrency}`,
    q.per_key_concurrency === null ? undefined : `per key ${q.per_key_concurrency}`,
    q.rate_limit_max === null ? undefined : `${q.rate_limit_max} per ${q.rate_limit_period_ms} ms`,
  ]
    .filter(Boolean)
    .join(', ') || 'none';

export function queuesPage(ctx: PageContext, queues: { totals: QueueRow[]; keys: QueueRow[] }, workers: WorkerRow[]): Html {
  const body = html`
    <h1>Queues (${queues.totals.length})</h1>
    <table data-testid="queues">
      <tr>
        <th>queue</th>
        <th class="num">queued</th>
        <th class="num">ready</th>
        <th class="num">running</th>
        <th class="num">waiting</th>
        <th>oldest pending</th>
        <th>limits</th>
        <th>actions</th>
      </tr>
      ${queues.totals.map(
        (q) =>
          html`<tr data-queue="${q.queue_name}">
              <td><strong>${q.queue_name}</strong>${q.paused ? html` <span class="status FAILED">PAUSED</span>` : ''}</td>
              <td class="num">${q.waiting_admission}</td>
              <td class="num">${q.dispatched}</td>
              <td class="num">${q.running}</td>
              <td class="num">${q.waiting}</td>
              <td>${age(q.oldest_pending_s)}</td>
              <td>${limitText(q)}</td>
              <td>
                ${actionForm(
                  ctx,
                  'queue',
                  html`<input type="hidden" name="name" value="${q.queue_name}" /><input
                      type="hidden"
                      name="paused"
                      value="${q.paused ? 'false' : 'true'}"
                    />`,
                  q.paused ? 'Resume' : 'Pause',
                  { testId: `pause-${q.queue_name}` },
                )}
                ${actionForm(
                  ctx,
                  'queue',
                  html`<input type="hidden" name="name" value="${q.queue_name}" />
                    <input name="concurrency" placeholder="conc." size="4" value="${q.concurrency ?? ''}" />
                    <input name="per_key" placeholder="per key" size="4" value="${q.per_key_concurrency ?? ''}" />
                    <input
                      name="rate"
                      placeholder="max/ms"
                      size="8"
                      value="${q.rate_limit_max === null ? '' : `${q.rate_limit_max}/${q.rate_limit_period_ms}`}"
                    />`,
                  'Set limits',
                  { testId: `limits-${q.queue_name}` },
                )}
              </td>
            </tr>
            ${queues.keys
              .filter((k) => k.queue_name === q.queue_name)
              .map(
                (k) =>
                  html`<tr class="muted">
                    <td>&nbsp;&nbsp;key ${k.concurrency_key === '' ? '(none)' : k.concurrency_key}</td>
                    <td class="num">${k.waiting_admission}</td>
                    <td class="num">${k.dispatched}</td>
                    <td class="num">${k.running}</td>
                    <td class="num">${k.waiting}</td>
                    <td>${age(k.oldest_pending_s)}</td>
                    <td colspan="2"></td>
                  </tr>`,
              )}`,
      )}
    </table>
    <p class="muted">Limits: empty clears one; rate is MAX/PERIOD_MS. Changes act at once on every worker (runledger.set_queue).</p>
    <h1>Workers (${workers.length})</h1>
    <table data-testid="workers">
      <tr>
        <th>worker</th>
        <th>state</th>
        <th>heartbeat</th>
        <th class="num">runs held</th>
        <th class="num">concurrency</th>
        <th>queues</th>
        <th>serves</th>
      </tr>
      ${workers.map(
        (w) =>
          html`<tr>
            <td class="mono">${w.worker_id}</td>
            <td>${w.state}</td>
            <td>${age(w.heartbeat_age_s)} ago</td>
            <td class="num">${w.runs_held}</td>
            <td class="num">${w.concurrency}</td>
            <td>${w.queues.join(', ')}</td>
            <td>${w.workflows.join(', ')}</td>
          </tr>`,
      )}
    </table>
  `;
  return layout(ctx, 'Queues & workers', body);
}
