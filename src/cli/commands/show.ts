import type { RunRecord } from '../../engine/runs.js';
import { duration, offset, print, renderTable, screenWidth, shortJson, timestamp, wrap } from '../format.js';
import { CliError, parse, withEngine, type Command } from '../shared.js';

interface EventRow {
  at: Date;
  kind: string;
  detail: unknown;
  fencing_token: string | null;
}

/** One screen about one run: the row, its checkpoints with durations, its history. */
export const show: Command = {
  summary: 'one run: summary, steps with durations, events',
  usage: 'runledger show RUN_ID',
  async run(args) {
    const parsed = parse(show, args, {}, { min: 1, max: 1 });
    if (!parsed) return;
    const runId = parsed.positionals[0]!;
    const { run, events } = await withEngine(parsed.values, async (engine) => {
      const found = await engine.getRun(runId);
      if (!found) throw new CliError('NOT_FOUND', `run ${runId} not found`, 1);
      const history = await engine.pool.query<EventRow>(
        'select at, kind, detail, fencing_token from runledger.events where run_id = $1 order by event_id',
        [runId],
      );
      return { run: found, events: history.rows };
    });
    printSummary(run);
    printSteps(run);
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

function printSummary(run: RunRecord): void {
  line('run', run.runId);
  line('workflow', `${run.workflowName}@${run.workflowVersion}  queue ${run.queueName}  priority ${run.priority}`);
  line('status', run.terminationReason ? `${run.status} (${run.terminationReason})` : run.status + (run.waitKind ? `, waiting for ${run.waitKind}` : ''));
  line('created', timestamp(run.createdAt));
  if (run.startedAt) line('started', timestamp(run.startedAt));
  if (run.finishedAt) line('finished', `${timestamp(run.finishedAt)}  (${duration(run.finishedAt.getTime() - run.createdAt.getTime())} after creation)`);
  if (run.wakeAt) line('wakes', timestamp(run.wakeAt));
  if (run.deadlineAt) line('deadline', timestamp(run.deadlineAt));
  line('recovery', `${run.recoveryAttempts} of at most ${run.maxRecoveryAttempts}  fencing token ${run.fencingToken}`);
  if (run.leaseOwner) line('lease', `${run.leaseOwner} until ${timestamp(run.leaseExpiresAt)}`);
  if (run.idempotencyKey) line('idem. key', run.idempotencyKey);
  if (run.parentRunId) line('parent', run.parentRunId);
  // Inputs and outputs can be megabytes: a few lines here, all of it in psql.
  line('input', shortJson(run.input, Infinity), 3);
  if (run.output !== null && run.output !== undefined) line('output', shortJson(run.output, Infinity), 3);
  if (run.error) line('error', errorText(run.error), 6);
  if (run.terminationEvidence) line('evidence', shortJson(run.terminationEvidence, Infinity), 3);
}

function printSteps(run: RunRecord): void {
  const steps = run.steps ?? [];
  print();
  print(`steps (${steps.length} checkpoints)`);
  if (steps.length === 0) return;
  const rows = steps.map((s) => [
    String(s.seq),
    s.name,
    s.kind,
    s.status,
    offset(s.startedAt, run.createdAt),
    duration(s.finishedAt.getTime() - s.startedAt.getTime()),
    String(s.attempts),
  ]);
  print(renderTable(['#', 'STEP', 'KIND', 'STATUS', 'STARTED', 'TOOK', 'TRIES'], rows, { shrink: [1], right: [0, 5, 6], indent: 2 }));
  for (const s of steps.filter((step) => step.status === 'FAILED')) line(`  step ${s.seq}`, `failed: ${errorText(s.error)}`, 6);
}

/** A stored error is {name, message, code?, stack?}: the message is what a person needs here. */
function errorText(error: unknown): string {
  const e = error as { name?: string; message?: string; code?: unknown } | null;
  if (!e || typeof e.message !== 'string') return shortJson(error, Infinity);
  return `${e.name ?? 'Error'}${e.code !== undefined ? ` [${String(e.code)}]` : ''}: ${e.message}`;
}
