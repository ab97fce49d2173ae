/**
 * One run: summary and links (parent, children, forks), its actions, the step timeline,
 * the operation ledger (UNKNOWN highlighted, with resolve), waits, approvals, signals,
 * live streams, session entries, its execution environments, the termination record and the
 * event history.
 */
import { html } from 'hono/html';
import type { EnvironmentRow, SessionEntryRow, StreamRow } from '../queries.js';
import { actionForm, json, layout, runLink, status, when, type Html, type PageContext } from './layout.js';

type Row = Record<string, unknown>;

export interface RunPage {
  doc: Row;
  streams: StreamRow[];
  sessionEntries: SessionEntryRow[];
  environments: EnvironmentRow[];
}

const ms = (from: unknown, to: unknown): string => {
  if (!(from instanceof Date) || !(to instanceof Date)) return '-';
  const d = to.getTime() - from.getTime();
  return d < 1000 ? `${d} ms` : d < 120_000 ? `${(d / 1000).toFixed(1)} s` : `${(d / 60_000).toFixed(1)} min`;
};

const TERMINAL = ['SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'];

export function runPage(ctx: PageContext, page: RunPage): Html {
  const { doc } = page;
  const runId = doc.run_id as string;
  const runStatus = doc.status as string;
  const steps = doc.steps as Row[];
  const operations = doc.operations as Row[];
  const approvals = doc.approvals as Row[];
  const signals = doc.signals as Row[];
  const children = doc.children as Row[];
  const events = doc.events as Row[];
  const wait = doc.wait as Row | null;
  const manifest = doc.version_manifest as Row | null;
  const forkedFrom = manifest?.forked_from as string | undefined;
  const forks = events.filter((e) => e.kind === 'forked').map((e) => (e.detail as Row).fork as string);
  const created = doc.created_at as Date;

  const actions = html`
    ${
      ['PENDING', 'RUNNING', 'WAITING'].includes(runStatus)
        ? actionForm(
            ctx,
            'cancel',
            html`<input type="hidden" name="run_id" value="${runId}" /><input name="reason" placeholder="reason" />`,
            'Cancel run',
          )
        : ''
    }
    ${
      ['FAILED', 'DEAD_LETTER'].includes(runStatus)
        ? actionForm(ctx, 'retry', html`<input type="hidden" name="run_id" value="${runId}" />`, 'Retry from last checkpoint')
        : ''
    }
    ${actionForm(
      ctx,
      'fork',
      html`<input type="hidden" name="run_id" value="${runId}" /><label
          >from step <input name="from_step" type="number" min="0" value="${steps.filter((s) => s.status !== 'WAITING').length}" size="4"
        /></label>
        <input name="version" placeholder="version (same)" size="10" />`,
      'Fork',
    )}
    ${
      runStatus === 'WAITING' || runStatus === 'RUNNING' || runStatus === 'PENDING'
        ? actionForm(
            ctx,
            'signal',
            html`<input type="hidden" name="run_id" value="${runId}" /><input name="topic" placeholder="topic" required />
              <input name="payload" placeholder='payload JSON, e.g. {"ok":true}' size="24" />`,
            'Send signal',
          )
        : ''
    }
  `;

  const body = html`
    <h1>Run <span class="mono">${runId}</span> ${status(runStatus)}</h1>
    <dl class="summary" data-testid="summary">
      <dt>workflow</dt>
      <dd>
        ${doc.workflow_name}@${doc.workflow_version} · queue ${doc.queue_name}${doc.concurrency_key ? ` · key ${doc.concurrency_key}` : ''}
      </dd>
      <dt>status</dt>
      <dd>
        ${runStatus}${doc.termination_reason ? ` (${doc.termination_reason})` : ''}${
          wait
            ? html` — waiting for <strong>${wait.waiting_for}</strong>${wait.step_name ? ` at step ${wait.step_name}` : ''}${
                  wait.until ? ` until ${when(wait.until as Date)}` : ''
                }`
            : ''
        }
      </dd>
      <dt>created</dt>
      <dd>${when(created)}${doc.finished_at ? ` · finished ${when(doc.finished_at as Date)} (${ms(created, doc.finished_at)})` : ''}</dd>
      <dt>recovery</dt>
      <dd>${doc.recovery_attempts} of at most ${doc.max_recovery_attempts} · fencing token ${String(doc.fencing_token)}</dd>
      ${
        doc.lease_owner
          ? html`<dt>lease</dt>
              <dd>${doc.lease_owner} until ${when(doc.lease_expires_at as Date)}</dd>`
          : ''
      }
      ${
        doc.parent_run_id
          ? html`<dt>parent</dt>
              <dd>${runLink(doc.parent_run_id as string)}</dd>`
          : ''
      }
      ${
        forkedFrom
          ? html`<dt>forked from</dt>
              <dd>${runLink(forkedFrom)} at step ${String(manifest?.from_step)}</dd>`
          : ''
      }
      ${
        forks.length > 0
          ? html`<dt>forks</dt>
              <dd>${forks.map((f) => html`${runLink(f)} `)}</dd>`
          : ''
      }
      ${
        children.length > 0
          ? html`<dt>child runs</dt>
              <dd>${children.map((c) => html`${runLink(c.run_id as string)} ${c.workflow_name} ${status(c.status as string)}<br />`)}</dd>`
          : ''
      }
      <dt>input</dt>
      <dd><pre>${json(doc.input)}</pre></dd>
      ${
        doc.output !== null
          ? html`<dt>output</dt>
              <dd><pre>${json(doc.output)}</pre></dd>`
          : ''
      }
      <dt>version manifest</dt>
      <dd><pre>${json(manifest)}</pre></dd>
    </dl>
    <p>${actions}</p>

    ${
      TERMINAL.includes(runStatus) || doc.termination_reason
        ? html`<h2>Termination</h2>
            <dl class="summary" data-testid="termination">
              <dt>reason</dt>
              <dd>${doc.termination_reason ?? '-'} at ${when(doc.terminated_at as Date | null)}</dd>
              <dt>evidence</dt>
              <dd><pre>${json(doc.termination_evidence)}</pre></dd>
              ${
                doc.error
                  ? html`<dt>error</dt>
                      <dd><pre>${json(doc.error)}</pre></dd>`
                  : ''
              }
            </dl>`
        : ''
    }

    <h2>Steps (${steps.length})</h2>
    ${
      steps.length === 0
        ? html`<p class="muted">No checkpoints yet.</p>`
        : html`<table data-testid="steps">
            <tr>
              <th class="num">#</th>
              <th>step</th>
              <th>kind</th>
              <th>status</th>
              <th class="num">started</th>
              <th class="num">took</th>
              <th class="num">attempts</th>
              <th>timeline</th>
            </tr>
            ${steps.map((s) => {
              const total = Math.max(1, ((doc.finished_at as Date | null) ?? new Date()).getTime() - created.getTime());
              const left = (((s.started_at as Date).getTime() - created.getTime()) / total) * 100;
              const width = Math.max(0.5, (((s.finished_at as Date).getTime() - (s.started_at as Date).getTime()) / total) * 100);
              return html`<tr>
                <td class="num">${s.seq}</td>
                <td>${s.name}</td>
                <td>${s.kind}</td>
                <td>${status(s.status as string)}</td>
                <td class="num">+${ms(created, s.started_at)}</td>
                <td class="num">${ms(s.started_at, s.finished_at)}</td>
                <td class="num">${s.attempts}</td>
                <td style="width:30%">
                  <div
                    style="margin-left:${Math.min(99, left).toFixed(1)}%;width:${Math.min(100, width).toFixed(1)}%;height:8px;background:#5b7bd5"
                  ></div>
                </td>
              </tr>`;
            })}
          </table>`
    }

    <h2>Operations ledger (${operations.length})</h2>
    ${
      operations.length === 0
        ? html`<p class="muted">No external operations.</p>`
        : html`<table data-testid="operations">
            <tr>
              <th class="num">#</th>
              <th>operation</th>
              <th>status</th>
              <th class="num">attempts</th>
              <th>idempotency key</th>
              <th>result / error</th>
              <th></th>
            </tr>
            ${operations.map(
              (o) =>
                html`<tr class="${o.status === 'UNKNOWN' ? 'unknown' : ''}">
                  <td class="num">${o.seq}</td>
                  <td>${o.name}<br /><span class="muted mono">${o.operation_id}</span></td>
                  <td>${status(o.status as string)}</td>
                  <td class="num">${o.attempts}</td>
                  <td class="mono">${o.idempotency_key}</td>
                  <td><pre>${json(o.error ?? o.result, 600)}</pre></td>
                  <td>${o.status === 'UNKNOWN' ? resolveForm(ctx, o.operation_id as string) : ''}</td>
                </tr>`,
            )}
          </table>`
    }

    <h2>Waits, approvals and signals</h2>
    ${
      wait
        ? html`<p>
            Waiting for <strong>${wait.waiting_for}</strong> since
            ${when(wait.since as Date | null)}${wait.until ? `, until ${when(wait.until as Date)}` : ''}.
          </p>`
        : html`<p class="muted">Not waiting.</p>`
    }
    ${
      approvals.length > 0
        ? html`<table data-testid="approvals">
            <tr>
              <th>request</th>
              <th>action</th>
              <th>evidence</th>
              <th>decision</th>
            </tr>
            ${approvals.map(
              (a) =>
                html`<tr>
                  <td class="mono">${a.request_id}<br />${a.name}</td>
                  <td>${a.action}</td>
                  <td><pre>${json(a.evidence, 800)}</pre></td>
                  <td>
                    ${
                      a.decision === null
                        ? html`pending${decideForm(ctx, a.request_id as string)}`
                        : html`${a.decision ? 'approved' : 'rejected'} by ${a.decided_by} at
                          ${when(a.decided_at as Date)}${a.note ? html`<br /><em>${a.note}</em>` : ''}`
                    }
                  </td>
                </tr>`,
            )}
          </table>`
        : ''
    }
    ${
      signals.length > 0
        ? html`<table data-testid="signals">
            <tr>
              <th>signal</th>
              <th>topic</th>
              <th>received</th>
              <th>state</th>
            </tr>
            ${signals.map(
              (s) =>
                html`<tr>
                  <td class="mono">${s.signal_id}</td>
                  <td>${s.topic}</td>
                  <td>${when(s.received_at as Date)}</td>
                  <td>${s.consumed_seq === null ? 'in the inbox' : `consumed by step ${s.consumed_seq}`}</td>
                </tr>`,
            )}
          </table>`
        : ''
    }
    ${
      page.streams.length > 0
        ? html`<h2>Streams</h2>
            ${page.streams.map(
              (s) =>
                html`<h3 class="mono">${s.topic} <span class="muted">${s.chunks} chunks${s.closed ? ', closed' : ''}</span></h3>
                  <pre data-stream="${s.topic}" data-run="${runId}" data-next="${s.next_offset}" data-closed="${s.closed ? '1' : ''}">
${s.tail.map((c) => (typeof c.chunk === 'string' ? c.chunk : `${JSON.stringify(c.chunk)}\n`)).join('')}</pre>`,
            )}
            <script src="/static/streams.js" defer></script>`
        : ''
    }
    ${
      page.sessionEntries.length > 0
        ? html`<h2>Session entries (${page.sessionEntries.length})</h2>
            <table data-testid="session">
              <tr>
                <th>session</th>
                <th class="num">#</th>
                <th>role</th>
                <th>content</th>
              </tr>
              ${page.sessionEntries.map(
                (e) =>
                  html`<tr>
                    <td class="mono">${e.session_id}</td>
                    <td class="num">${e.seq}</td>
                    <td>${e.role}</td>
                    <td><pre>${json(e.content, 1200)}</pre></td>
                  </tr>`,
              )}
            </table>`
        : ''
    }
    ${
      page.environments.length > 0
        ? html`<h2>Environment</h2>
            ${environmentTable(page.environments, false)}`
        : ''
    }

    <h2>Event history (${events.length})</h2>
    <table data-testid="events">
      <tr>
        <th class="num">at</th>
        <th>event</th>
        <th>token</th>
        <th>detail</th>
      </tr>
      ${events.map(
        (e) =>
          html`<tr>
            <td class="num">+${ms(created, e.at)}</td>
            <td>${e.kind}</td>
            <td>${e.fencing_token === null ? '-' : String(e.fencing_token)}</td>
            <td><pre>${json(e.detail, 600)}</pre></td>
          </tr>`,
      )}
    </table>
  `;
  return layout(ctx, `Run ${runId}`, body);
}

/** Approve or reject with a note: one form, two buttons (the pressed one is the decision). */
export function decideForm(ctx: PageContext, requestId: string): Html {
  if (!ctx.actionsEnabled || !ctx.signedIn) return '';
  return html`<form class="inline" method="post" action="/actions/decide" data-testid="decide-${requestId}">
    <input type="hidden" name="csrf" value="${ctx.csrf ?? ''}" /><input type="hidden" name="back" value="${ctx.here}" />
    <input type="hidden" name="request_id" value="${requestId}" />
    <input name="by" value="${ctx.name ?? ''}" placeholder="decided by" required size="10" />
    <input name="note" placeholder="note" size="18" />
    <button type="submit" name="decision" value="approve">Approve</button>
    <button type="submit" name="decision" value="reject">Reject</button>
  </form>`;
}

export function resolveForm(ctx: PageContext, operationId: string): Html {
  return actionForm(
    ctx,
    'resolve',
    html`<input type="hidden" name="operation_id" value="${operationId}" />
      <select name="status">
        <option value="SUCCEEDED">it happened (SUCCEEDED)</option>
        <option value="FAILED">it did not (FAILED)</option>
      </select>
      <input name="result" placeholder="result JSON" size="14" /><input name="by" value="${ctx.name ?? ''}" placeholder="by" size="8" />`,
    'Resolve',
    { testId: `resolve-${operationId}` },
  );
}

/** Execution environments: the manifest, which attempt made it, and its reclaim (or why it has not happened). */
export function environmentTable(rows: EnvironmentRow[], withRun: boolean): Html {
  return html`<table data-testid="environments">
    <tr>
      ${withRun ? html`<th>run</th>` : ''}
      <th>environment</th>
      <th>manifest</th>
      <th>made</th>
      <th>reclaim</th>
      <th class="num">tries</th>
      <th>last error</th>
    </tr>
    ${rows.map(
      (e) =>
        html`<tr>
          ${withRun ? html`<td>${runLink(e.run_id)}<br />${e.workflow_name}</td>` : ''}
          <td class="mono">${e.env_id}</td>
          <td><pre>${json(e.manifest, 800)}</pre></td>
          <td>step ${e.seq}, attempt ${e.attempt}<br />${when(e.created_at)}</td>
          <td>
            ${
              e.reclaimed_at
                ? html`reclaimed (${e.reclaimed_status}) ${when(e.reclaimed_at)}`
                : e.reclaiming
                  ? 'being reclaimed'
                  : 'not reclaimed yet'
            }
          </td>
          <td class="num">${e.reclaim_attempts}</td>
          <td>${e.last_error ? html`<pre>${json(e.last_error, 600)}</pre>` : '-'}</td>
        </tr>`,
    )}
  </table>`;
}
