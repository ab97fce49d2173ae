import type { RunRecord } from '../../engine/client/runs.js';
import { duration, offset, print, printJson, renderTable, screenWidth, shortJson, timestamp, wrap } from '../format.js';
import { runDocument } from '../../engine/client/reads.js';
import { CliError, EXIT_FAILED, JSON_OPTION, cliPayloads, parse, withEngine, withPool, type Command } from '../shared.js';

interface EventRow {
  at: Date;
  kind: string;
  detail: unknown;
  fencing_token: string | null;
}

interface WaitRow {
  waiting_for: string;
  step_name: string | null;
  until: Date | null;
}

interface ApprovalRow {
  request_id: string;
  name: string;
  action: string;
  approvers: string[] | null;
  expires_at: Date | null;
  decision: boolean | null;
  decided_by: string | null;
  decided_at: Date | null;
  note: string | null;
}

interface SignalRow {
  signal_id: string;
  topic: string;
  received_at: Date;
  consumed_seq: number | null;
}

interface ChildRow {
  run_id: string;
  workflow_name: string;
  status: string;
}

interface Related {
  wait: WaitRow | undefined;
  approvals: ApprovalRow[];
  signals: SignalRow[];
  children: ChildRow[];
}

/** One screen about one run: the row, what it waits for, its checkpoints, operations, approvals, signals, history. */
export const show: Command = {
  summary: 'one run: summary, wait, steps with durations, operations, approvals, signals, events',
  usage: 'runledger show RUN_ID [--json]',
  args: [['RUN_ID', 'the run']],
  details:
    "--json prints one object: the run's row of runledger.runs with, under their table's name, its rows of steps,\n" +
    'operations, approvals, signals, events and its child runs, and `wait` (its runledger.waiting row, or null).',
  examples: ['runledger show 01J9Z3K4X8Q2W5E7R1T6Y0U3IO', 'runledger show 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --json | jq .output'],
  async run(args) {
    const parsed = parse(show, args, { json: JSON_OPTION }, { min: 1, max: 1 });
    if (!parsed) return;
    const runId = parsed.positionals[0]!;
    if (parsed.values.json) {
      const document = await withPool(parsed.values, (pool) => runDocument(pool, runId));
      if (!document) throw new CliError('NOT_FOUND', `run ${runId} not found`, EXIT_FAILED);
      printJson(document);
      return;
    }
    const { run, events, related } = await withEngine(parsed.values, async (engine) => {
      const found = await engine.getRun(runId);
      if (!found) throw new CliError('NOT_FOUND', `run ${runId} not found`, 1);
      const query = async <T extends object>(text: string) => (await engine.pool.query<T>(text, [runId])).rows;
      const [history, wait, approvalRows, signals, children] = await Promise.all([
        query<EventRow>('select at, kind, detail, fencing_token from runledger.events where run_id = $1 order by event_id'),
        query<WaitRow>('select waiting_for, step_name, until from runledger.waiting where run_id = $1'),
        query<ApprovalRow>(
          'select request_id, name, action, approvers, expires_at, decision, decided_by, decided_at, note from runledger.approvals where run_id = $1 order by seq',
        ),
        query<SignalRow>(
          'select signal_id, topic, received_at, consumed_seq from runledger.signals where run_id = $1 order by received_at, signal_id',
        ),
        query<ChildRow>('select run_id, workflow_name, status from runledger.runs where parent_run_id = $1 order by created_at, run_id'),
      ]);
      // The engine decoded the run's payloads (RUNLEDGER_KEYS); an approval's action and note are read here, so decoded here.
      const payloads = cliPayloads();
      const approvals = approvalRows.map((a) => ({ ...a, action: payloads.decodeNote(a.action), note: payloads.decodeNote(a.note) }));
      return { run: found, events: history, related: { wait: wait[0], approvals, signals, children } };
    });
    printSummary(run, related);
    printSteps(run);
    printOperations(run);
    printRelated(run, related);
    print();
    print(`events (${events.length}), times from creation`);
    const rows = events.map((e) => [offset(e.at, run.createdAt), e.kind, e.fencing_token ?? '-', shortJson(e.detail, 500)]);
    print(renderTable(['AT', 'EVENT', 'TOKEN', 'DETAIL'], rows, { shrink: [3], indent: 2 }));
  },
};

const LABEL = 12;

/** `label  value`, the value wrapped under itself over a few lines. */
function line(label: string, value: string, maxLines = 1): void {
  wrap(value, screenWidth() - LABEL, maxLines).forEach((part, i) => print(`${(i === 0 ? label : '').padEnd(LABEL)}${part}`));
}

function printSummary(run: RunRecord, related: Related): void {
  line('run', run.runId);
  line(
    'workflow',
    `${run.workflowName}@${run.workflowVersion}  queue ${run.queueName}  priority ${run.priority}` +
      (run.concurrencyKey ? `  key ${run.concurrencyKey}` : ''),
  );
  const waitingFor = related.wait
    ? `, waiting for ${related.wait.waiting_for}${related.wait.step_name ? ` (step ${related.wait.step_name})` : ''}`
    : '';
  line('status', run.terminationReason ? `${run.status} (${run.terminationReason})` : run.status + waitingFor, 2);
  if (run.cancelRequestedAt)
    line('cancel', `requested ${timestamp(run.cancelRequestedAt)}${run.cancelReason ? `: ${run.cancelReason}` : ''}`, 2);
  line('created', timestamp(run.createdAt));
  if (run.startedAt) line('started', timestamp(run.startedAt));
  if (run.finishedAt)
    line('finished', `${timestamp(run.finishedAt)}  (${duration(run.finishedAt.getTime() - run.createdAt.getTime())} after creation)`);
  if (run.wakeAt) line('wakes', timestamp(run.wakeAt));
  if (run.deadlineAt) line('deadline', timestamp(run.deadlineAt));
  const limits = [
    run.maxSteps === null ? undefined : `max steps ${run.maxSteps}`,
    run.budget === null ? undefined : `budget ${run.budgetSpent} of ${run.budget} spent`,
    ...Object.entries(run.budgetLimits ?? {}).map(
      ([dim, limit]) => `${dim} ${(run.budgetUsed as Record<string, number> | null)?.[dim] ?? 0} of ${limit} spent`,
    ),
    run.noProgress === null ? undefined : `no progress after ${run.noProgress} repeats`,
    run.retryBudget === null ? undefined : `retries ${run.retriesUsed} of ${run.retryBudget} used`,
  ].filter((part) => part !== undefined);
  if (limits.length > 0) line('limits', limits.join(', '), 2);
  line('recovery', `${run.recoveryAttempts} of at most ${run.maxRecoveryAttempts}  fencing token ${run.fencingToken}`);
  line('manifest', shortJson(run.versionManifest, Infinity), 3);
  if (run.migrateTo) line('migrating', `to version ${run.migrateTo}: marked by migrate_run, applied by a worker with that migration`, 2);
  if (run.leaseOwner) line('lease', `${run.leaseOwner} until ${timestamp(run.leaseExpiresAt)}`);
  if (run.idempotencyKey) line('idem. key', run.idempotencyKey);
  if (run.parentRunId) line('parent', run.parentRunId);
  if (run.traceparent) line('trace', `${run.traceparent} (started under)`);
  if (run.executionTraceparent) line('last span', `${run.executionTraceparent} (latest traced execution)`);
  // Inputs and outputs can be megabytes: a few lines here, all of it in psql.
  line('input', shortJson(run.input, Infinity), 3);
  if (run.output !== null && run.output !== undefined) line('output', shortJson(run.output, Infinity), 3);
  if (run.error) line('error', errorText(run.error), 6);
  if (run.terminationReason === 'NON_DETERMINISM') line('mismatch', mismatchText(run.terminationEvidence), 4);
  if (run.terminationEvidence) line('evidence', shortJson(run.terminationEvidence, Infinity), 3);
}

/** A non-determinism in words: where, what the history holds, what the code asked for, and both versions. */
export function mismatchText(evidence: unknown): string {
  const e = (evidence ?? {}) as Record<string, unknown>;
  const version = (manifest: unknown) => String((manifest as { workflow?: unknown } | null)?.workflow ?? 'an unknown version');
  const versions = `recorded by ${version(e.run_manifest)}, the code is ${version(e.code_manifest)}`;
  if (typeof e.seq === 'number') {
    return (
      `at step ${e.seq} the history holds ${String(e.expectedKind)} ${JSON.stringify(e.expected)} but the code asked for ` +
      `${String(e.actualKind)} ${JSON.stringify(e.actual)} (${versions}). Fix the code and retry, migrate the run, or fork it from step ${e.seq} onto another version`
    );
  }
  if (typeof e.stepsTaken === 'number') {
    return (
      `the code returned after ${e.stepsTaken} steps but the history has ${String(e.checkpoints)} (the first not reached: ` +
      `${JSON.stringify(e.firstUnreached)}; ${versions})`
    );
  }
  return String(e.message ?? 'no evidence recorded');
}

function printSteps(run: RunRecord): void {
  const steps = run.steps ?? [];
  print();
  const open = steps.filter((step) => step.status === 'WAITING').length;
  // A step's tries are counted by the execution that wrote its checkpoint (in-process
  // retries); an execution lost with its worker records nothing, so the run's recovery
  // count stands beside them.
  const recovered = run.recoveryAttempts > 0 ? `, run recovered ${run.recoveryAttempts} time${run.recoveryAttempts === 1 ? '' : 's'}` : '';
  print(
    `steps (${steps.length - open} checkpoint${steps.length - open === 1 ? '' : 's'}${open > 0 ? `, ${open} waiting` : ''}${recovered})`,
  );
  if (steps.length === 0) return;
  const rows = steps.map((s) => [
    String(s.seq),
    s.name,
    s.kind,
    s.status,
    offset(s.startedAt, run.createdAt),
    duration(s.finishedAt.getTime() - s.startedAt.getTime()),
    String(s.attempts),
    String(s.fencingToken),
  ]);
  print(
    renderTable(['#', 'STEP', 'KIND', 'STATUS', 'STARTED', 'TOOK', 'IN-PROC TRIES', 'TOKEN'], rows, {
      shrink: [1],
      right: [0, 5, 6, 7],
      indent: 2,
    }),
  );
  if (run.recoveryAttempts > 0) {
    print('  IN-PROC TRIES: tries by the execution that wrote the checkpoint (TOKEN); tries lost with a crashed worker are not counted');
  }
  for (const s of steps.filter((step) => step.status === 'FAILED')) line(`  step ${s.seq}`, `failed: ${errorText(s.error)}`, 6);
}

function printOperations(run: RunRecord): void {
  const operations = run.operations ?? [];
  if (operations.length === 0) return;
  print();
  print(`operations (${operations.length}, the ledger of external calls)`);
  const rows = operations.map((op) => [
    String(op.seq),
    op.name,
    op.status,
    String(op.attempts),
    op.idempotencyKey,
    op.compensationStatus ? `compensation ${op.compensationStatus}` : op.externalResourceId ? `resource ${op.externalResourceId}` : '-',
    op.operationId,
  ]);
  print(
    renderTable(['#', 'OPERATION', 'STATUS', 'TRIES', 'KEY', 'NOTE', 'OPERATION ID'], rows, {
      shrink: [4, 5, 1],
      right: [0, 3],
      indent: 2,
    }),
  );
  if (operations.some((op) => op.status === 'UNKNOWN')) {
    print('  UNKNOWN: settle with runledger resolve OPERATION_ID --status SUCCEEDED|FAILED [--result JSON]');
  }
}

function printRelated(run: RunRecord, related: Related): void {
  if (related.approvals.length > 0) {
    print();
    print(`approvals (${related.approvals.length})`);
    const rows = related.approvals.map((a) => [
      a.request_id,
      a.action,
      a.decision === null
        ? a.expires_at && a.expires_at.getTime() <= Date.now()
          ? 'expired'
          : 'pending'
        : a.decision
          ? 'approved'
          : 'rejected',
      a.decided_by ?? (a.approvers && a.approvers.length > 0 ? `(${a.approvers.join(', ')})` : '(anyone)'),
      a.note ?? '-',
    ]);
    print(renderTable(['REQUEST ID', 'ACTION', 'DECISION', 'BY', 'NOTE'], rows, { shrink: [4, 3, 1], indent: 2 }));
  }
  if (related.signals.length > 0) {
    print();
    print(`signals (${related.signals.length})`);
    const rows = related.signals.map((s) => [
      s.signal_id,
      s.topic,
      offset(s.received_at, run.createdAt),
      s.consumed_seq === null ? 'in the inbox' : `consumed by step ${s.consumed_seq}`,
    ]);
    print(renderTable(['SIGNAL ID', 'TOPIC', 'RECEIVED', 'STATE'], rows, { shrink: [1], indent: 2 }));
  }
  if (related.children.length > 0) {
    print();
    print(`child runs (${related.children.length})`);
    print(
      renderTable(
        ['RUN ID', 'WORKFLOW', 'STATUS'],
        related.children.map((c) => [c.run_id, c.workflow_name, c.status]),
        { shrink: [1], indent: 2 },
      ),
    );
  }
}

/** A stored error is {name, message, code?, stack?}: the message is what a person needs here. */
function errorText(error: unknown): string {
  const e = error as { name?: string; message?: string; code?: unknown } | null;
  if (!e || typeof e.message !== 'string') return shortJson(error, Infinity);
  return `${e.name ?? 'Error'}${e.code !== undefined ? ` [${String(e.code)}]` : ''}: ${e.message}`;
}
