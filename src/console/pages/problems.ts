/** Runs parked in the dead letter (retry, fork), operations whose outcome is UNKNOWN (resolve), environments whose reclaim fails. */
import { html } from 'hono/html';
import { actionForm, json, layout, runLink, since, when, type Html, type PageContext } from './layout.js';
import { environmentTable, resolveForm } from './run.js';
import type { EnvironmentRow } from '../queries.js';

export function problemsPage(
  ctx: PageContext,
  dead: Array<Record<string, unknown>>,
  unknown: Array<Record<string, unknown>>,
  reclaims: EnvironmentRow[] = [],
): Html {
  const body = html`
    <h1>Dead letter (${dead.length})</h1>
    ${
      dead.length === 0
        ? html`<p>No dead-lettered runs.</p>`
        : html`<table data-testid="dead-letter">
            <tr>
              <th>run</th>
              <th>workflow</th>
              <th>reason</th>
              <th>evidence</th>
              <th class="num">recoveries</th>
              <th>when</th>
              <th></th>
            </tr>
            ${dead.map(
              (r) =>
                html`<tr>
                  <td>${runLink(r.run_id as string)}</td>
                  <td>${r.workflow_name}@${r.workflow_version}</td>
                  <td>
                    ${r.termination_reason ?? '-'}${r.compensations_due ? html`<br /><span class="muted">effects not undone</span>` : ''}
                  </td>
                  <td><pre>${json(r.termination_evidence, 800)}</pre></td>
                  <td class="num">${r.recovery_attempts}/${r.max_recovery_attempts}</td>
                  <td>${when(r.terminated_at as Date | null)}</td>
                  <td>
                    ${actionForm(ctx, 'retry', html`<input type="hidden" name="run_id" value="${r.run_id}" />`, 'Retry', {
                      testId: `retry-${r.run_id as string}`,
                    })}
                    ${actionForm(
                      ctx,
                      'fork',
                      html`<input type="hidden" name="run_id" value="${r.run_id}" /><input
                          name="from_step"
                          type="number"
                          min="0"
                          value="${Number(r.steps_done)}"
                          size="3"
                        /><input name="version" placeholder="version" size="8" />`,
                      'Fork',
                      { testId: `fork-${r.run_id as string}` },
                    )}
                  </td>
                </tr>`,
            )}
          </table>`
    }
    <h1>Unknown operations (${unknown.length})</h1>
    ${
      unknown.length === 0
        ? html`<p>No operations with an unknown outcome.</p>`
        : html`<p class="muted">
              The worker died between the call and recording its outcome. Ask the outside system with the idempotency key, then say what
              happened.
            </p>
            <table data-testid="unknown">
              <tr>
                <th>operation</th>
                <th>run</th>
                <th>idempotency key</th>
                <th class="num">attempts</th>
                <th>unknown for</th>
                <th>resolve</th>
              </tr>
              ${unknown.map(
                (o) =>
                  html`<tr class="unknown">
                    <td>${o.name}<br /><span class="mono muted">${o.operation_id}</span></td>
                    <td>${runLink(o.run_id as string)}<br />${o.workflow_name} (${o.run_status})</td>
                    <td class="mono">${o.idempotency_key}</td>
                    <td class="num">${o.attempts}</td>
                    <td>${since(o.unknown_since as Date)}</td>
                    <td>${resolveForm(ctx, o.operation_id as string)}</td>
                  </tr>`,
              )}
            </table>`
    }
    ${
      reclaims.length === 0
        ? ''
        : html`<h1>Environments not reclaimed (${reclaims.length})</h1>
            <p class="muted">
              Their run has finished, but the workflow's reclaim failed: the workspace, browser or sandbox may still be running. The workers
              try again; fix the cause (the last error says it) or reclaim it by hand.
            </p>
            ${environmentTable(reclaims, true)}`
    }
  `;
  return layout(ctx, 'Dead letter & unknown', body);
}
