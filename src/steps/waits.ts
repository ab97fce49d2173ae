import { flushPending } from '../engine/run/checkpoint.js';
import { ChildFailedError, ConfigError } from '../engine/core/errors.js';
import { toInstant, toMs, type Duration } from '../engine/core/duration.js';
import type { Execution } from '../engine/run/execution.js';
import { toJsonText } from '../engine/core/json.js';
import { haltOnDbError } from '../engine/run/halts.js';
import type { Workflow } from '../engine/core/workflow.js';
import { replayCheckpoint } from './replay.js';
import { runWait } from './wait.js';

/** Signal topics: plain names, never spliced into SQL. */
export const TOPIC_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$/;

/**
 * A wait's wake time as _wait takes it: a Date as `until` (a valid one, within PostgreSQL's
 * range), a duration as `timeout_ms` (0 to 2^53 - 1 ms); ConfigError otherwise, in the
 * workflow's code, before anything is written (docs/waits.md#how-far-ahead).
 */
function timeoutSpec(timeout: Duration | Date | undefined, what: string): Record<string, unknown> {
  if (timeout === undefined) return {};
  if (timeout instanceof Date) return { until: toInstant(timeout, what) };
  return { timeout_ms: toMs(timeout, what) };
}

/** `ctx.sleep(name, duration | Date)`: the wake time is a checkpoint; the run waits holding no worker. */
export async function sleep(exec: Execution, name: string, duration: Duration | Date): Promise<void> {
  // Without a duration the timer would have no wake-up time and the run would wait forever
  // (ctx.sleep('5s') passes the duration as the name).
  if (duration === undefined || duration === null) {
    throw new ConfigError(`ctx.sleep(${JSON.stringify(name)}): a duration (or a Date) is required: ctx.sleep(name, duration)`);
  }
  await runWait(exec, name, 'sleep', timeoutSpec(duration, `sleep ${JSON.stringify(name)}`));
}

export interface WaitForSignalOptions {
  /** Give up after this long (or at this time): the wait returns null. */
  timeout?: Duration | Date;
  /** Step name; default the topic. */
  name?: string;
}

/** `ctx.waitForSignal(topic)`: consumes exactly one signal on the topic (consumption and checkpoint commit together), or null at the timeout. */
export async function waitForSignal<T>(exec: Execution, topic: string, options: WaitForSignalOptions = {}): Promise<T | null> {
  if (!TOPIC_PATTERN.test(topic)) throw new ConfigError(`waitForSignal: invalid topic ${JSON.stringify(topic)}`);
  const output = await runWait(exec, options.name ?? topic, 'signal', { topic, ...timeoutSpec(options.timeout, `waitForSignal ${topic}`) });
  return output.timed_out ? null : ((output.payload ?? null) as T | null);
}

export interface ApprovalRequest {
  /** What is asked for, e.g. 'refund'. */
  action: string;
  /** What the approver sees (JSON). */
  evidence?: unknown;
  /**
   * Who may decide; default anyone. A name that is a database role is met by the deciding
   * connection's role being a member of it (never by the name a decider gives).
   */
  approvers?: string[];
  /** Several decisions: `count` approvals from `of` (approvers as above) decide it; one rejection ends it at once. */
  requires?: { count: number; of: string[] };
  timeout?: Duration | Date;
}

export interface ApprovalVote {
  decidedBy: string;
  approved: boolean;
  note: string | null;
  decidedAt: string;
}

export interface ApprovalDecision {
  approved: boolean;
  decidedBy: string;
  decidedAt: string;
  note: string | null;
  requestId: string;
  /** With `requires`: every decision, in order (the last one decided it). */
  votes?: ApprovalVote[];
}

/** `ctx.requestApproval(name, request)`: the decision, or null when the request expires undecided. */
export async function requestApproval(exec: Execution, name: string, request: ApprovalRequest): Promise<ApprovalDecision | null> {
  if (typeof request?.action !== 'string' || request.action.length === 0) throw new ConfigError('requestApproval: action is required');
  if (request.approvers !== undefined && (!Array.isArray(request.approvers) || request.approvers.some((a) => typeof a !== 'string'))) {
    throw new ConfigError('requestApproval: approvers must be a list of names');
  }
  const requires = request.requires;
  if (requires !== undefined) {
    if (request.approvers !== undefined)
      throw new ConfigError('requestApproval: give approvers or requires, not both (requires.of are the approvers)');
    const of = requires?.of;
    if (!Array.isArray(of) || of.length === 0 || of.some((a) => typeof a !== 'string' || a.length === 0)) {
      throw new ConfigError('requestApproval: requires.of must be a non-empty list of names');
    }
    if (!Number.isInteger(requires.count) || requires.count < 1 || requires.count > of.length) {
      throw new ConfigError(`requestApproval: requires.count must be a whole number from 1 to ${of.length} (the size of requires.of)`);
    }
  }
  exec.checkPayload(toJsonText(request.evidence, `approval ${name} evidence`), `the evidence of approval ${JSON.stringify(name)}`);
  exec.checkText(request.action, `the action of approval ${JSON.stringify(name)}`);
  const output = await runWait(exec, name, 'approval', {
    // What is asked is the run's data too: with a codec, approvals.action holds its envelope's JSON text.
    action: exec.payloads.note(request.action),
    // What the approvers see is a copy: the workflow's redact paths apply to it, then the codec.
    evidence: request.evidence === undefined ? null : exec.payloads.value(exec.mask(request.evidence)),
    ...(request.approvers ? { approvers: request.approvers } : {}),
    ...(requires ? { approvers: requires.of, required: requires.count } : {}),
    ...timeoutSpec(request.timeout, `requestApproval ${name}`),
  });
  return output.timed_out ? null : (output as unknown as ApprovalDecision);
}

export interface ChildOptions {
  /** Step name; default `child:<workflow name>`. */
  name?: string;
  queue?: string;
  priority?: number;
}

/** Starts a child run and checkpoints its id in one transaction: a replay never starts a second child. */
export async function startChild<In>(
  exec: Execution,
  register: (workflow: Workflow<any, any>) => Promise<void>,
  workflow: Workflow<any, any, In>,
  input: In,
  options: ChildOptions = {},
): Promise<{ runId: string }> {
  const name = `${options.name ?? `child:${workflow.name}`}:start`;
  const position = exec.takeStep(name, 'child_start');
  if (!position) return exec.suspend();
  if (position.recorded) return replayCheckpoint<{ runId: string }>(position.recorded);
  if (!(await flushPending(exec))) return exec.suspend();
  if (exec.stopping) return exec.noNewStep();
  let stored: unknown = input;
  if (workflow.inputSchema) stored = workflow.inputSchema.parse(input);
  const clearInput = toJsonText(stored, `input of child ${workflow.name}`);
  exec.checkPayload(clearInput, `the input of child ${workflow.name}`);
  const inputText = exec.payloads.optionalText(clearInput);
  await register(workflow);
  try {
    const result = await exec.deps.pool.query(
      'select runledger._start_child(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_workflow => $5, p_input => $6::jsonb, p_options => $7::jsonb) as run_id',
      [
        exec.runId,
        exec.fencingToken.toString(),
        position.seq,
        name,
        workflow.name,
        inputText ?? null,
        JSON.stringify({
          version: workflow.version,
          queue: options.queue ?? workflow.queue,
          max_recovery_attempts: workflow.maxRecoveryAttempts,
          ...(options.priority === undefined ? {} : { priority: options.priority }),
          // A child's executions are traced under the span of the execution that started it.
          ...(exec.trace ? { traceparent: exec.trace.traceparent } : {}),
        }),
      ],
    );
    return { runId: result.rows[0].run_id };
  } catch (error) {
    haltOnDbError(exec, error);
    return exec.suspend();
  }
}

/** Waits, holding nothing, until the child run ends; returns its output or throws ChildFailedError (the same on every replay). */
export async function waitForChild<O>(exec: Execution, childRunId: string, name = `child:${childRunId}`): Promise<O> {
  const output = await runWait(exec, name, 'child', { child_run_id: childRunId });
  if (output.status !== 'SUCCEEDED') {
    throw new ChildFailedError(`child run ${childRunId} ended ${String(output.status)} (${String(output.terminationReason)})`, output);
  }
  return output.output as O;
}
