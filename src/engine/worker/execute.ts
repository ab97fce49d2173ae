import { InvalidInputError, NonDeterminismError, serializeError, SQLSTATE, StepNotAwaitedError, UnverifiedError } from '../core/errors.js';
import { WorkflowContext } from '../../agents/context.js';
import { verifyOutput } from '../../steps/verify.js';
import { Execution, type CheckpointRow, type ExecutionDeps, type Halt } from '../run/execution.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';
import { checkpointValues, flushPending, stepItemValues, type CheckpointRecord } from '../run/checkpoint.js';
import { completeItem } from '../run/commit-items.js';
import type { ClaimedRun } from './dispatcher.js';
import { runCompensations } from '../run/compensate.js';
import { streamsFlushed } from '../../steps/stream.js';
import { checkPayloadSize, toJsonText } from '../core/json.js';
import { storableJson, storableText } from '../core/storable.js';
import { isConnectionError, pgCode } from '../db/pg-errors.js';
import type { Verdict, Workflow } from '../core/workflow.js';
import { budgetStateOf } from '../run/budget-state.js';

/** How long an infrastructure failure keeps a released run off the workers. */
export const RELEASE_DELAY_MS = 1_000;
const FINISH_TRIES = 5;

export interface ExecuteOptions {
  deps: ExecutionDeps;
  workerId: string;
  leaseMs: number;
  resolveWorkflow: (name: string, version: string) => Workflow<any, any> | undefined;
  track: (exec: Execution) => void;
  untrack: (exec: Execution) => void;
}

/** How an execution ended, as far as this process knows: the committed output when the run SUCCEEDED here. */
export type ExecutionEnd = Execution['succeeded'];

/**
 * One claimed run (runledger._claim_batch gave it a new fencing token and a lease):
 * replay the workflow from its checkpoints and record how it ended. Never throws; resolves
 * with the committed output when this execution completed the run (undefined otherwise).
 */
export async function executeClaimed(run: ClaimedRun, options: ExecuteOptions): Promise<ExecutionEnd> {
  const { deps } = options;
  const runId = run.run_id;
  // The run's payloads in clear, once, before any workflow code runs: input, checkpoints, step progress.
  let decoded: ClaimedRun | undefined;
  let unreadable: unknown;
  try {
    decoded = decodeClaimed(run, deps.payloads ?? NO_CODEC);
  } catch (error) {
    unreadable = error;
  }
  const workflow = options.resolveWorkflow(run.workflow_name, run.workflow_version);
  const attempt = run.recovery_attempts + 1;
  const exec = new Execution(
    {
      runId,
      fencingToken: BigInt(run.fencing_token),
      attempt,
      checkpoints: (decoded ?? run).checkpoints,
      claimedAt: Date.now(),
      workflowName: run.workflow_name,
      workflowVersion: run.workflow_version,
      lineageId: run.lineage_id,
      limits: {
        maxSteps: run.max_steps,
        budget: run.budget === null ? null : Number(run.budget),
        budgetSpent: Number(run.budget_spent),
      },
      budget: budgetStateOf(run),
      progress: (decoded ?? run).progress,
      leaseMs: options.leaseMs,
      workflow,
      trace: deps.tracing?.startExecution(run, attempt),
    },
    deps,
  );
  recordTrace(exec);
  if (run.checkpoints.length > 0) deps.metrics?.resumed(run.workflow_name, run.workflow_version, run.recovery_attempts > 0);
  if (run.cancel_requested) exec.startCancelled();
  options.track(exec);
  try {
    if (decoded) await replay(exec, decoded, workflow, options);
    else await releaseUnreadable(exec, unreadable);
  } catch (error) {
    // Our own bookkeeping failed (database unreachable...): give the run back, or let its lease expire.
    exec.log('error', `run ${runId}: execution failed`, { error: serializeError(error) });
    await release(exec, RELEASE_DELAY_MS, 'infrastructure', error).catch(() => undefined);
  } finally {
    exec.end(exec.haltReason ? `this execution stopped: ${exec.haltReason.kind}` : 'this execution stopped');
    exec.trace?.end(exec.succeeded ? 'succeeded' : (exec.haltReason?.kind ?? 'ended'));
    options.untrack(exec);
  }
  return exec.succeeded;
}

/**
 * This execution's span, when a tracer provider records (observe/tracing.ts): its
 * traceparent is recorded on the run (fenced, not awaited) for the next execution to link to.
 */
function recordTrace(exec: Execution): void {
  const { trace } = exec;
  if (!trace) return;
  exec.deps.pool
    .query('select runledger._trace_execution(p_run_id => $1, p_token => $2, p_traceparent => $3)', [
      exec.runId,
      exec.fencingToken.toString(),
      trace.traceparent,
    ])
    .catch((error: unknown) =>
      exec.log('warn', `run ${exec.runId}: could not record the execution's span`, { error: serializeError(error) }),
    );
}

/**
 * The claimed run with its payloads decoded (a checkpoint's by its kind, see Payloads);
 * throws the codec's error (PAYLOAD_KEY_MISSING...) for one this worker cannot read.
 */
function decodeClaimed(run: ClaimedRun, payloads: Payloads): ClaimedRun {
  if (!payloads.enabled) return run;
  const checkpoints = run.checkpoints.map((row): CheckpointRow => {
    const [seq, name, status, output, error, kind] = row;
    return Array.isArray(output) ? [seq, name, status, [payloads.decodeStepOutput(kind, output[0])], error, kind] : row;
  });
  let progress = run.progress;
  if (progress) {
    progress = {};
    for (const [seq, value] of Object.entries(run.progress!)) progress[seq] = payloads.decode(value);
  }
  return { ...run, input: payloads.decode(run.input), checkpoints, progress };
}

/**
 * A payload this worker cannot decode: the fault is the worker's (a key it lacks), so the
 * run is given back unchanged, its input and checkpoints as they were, for a worker that
 * can, with the coded error as the reason (in the released event, and in the evidence of
 * the dead letter the run becomes after max_recovery_attempts such releases).
 */
async function releaseUnreadable(exec: Execution, error: unknown): Promise<void> {
  const coded = error as { code?: unknown; message?: unknown };
  const reason = `${typeof coded?.code === 'string' ? coded.code : 'PAYLOAD_UNREADABLE'}: ${String(coded?.message ?? error)}`;
  exec.log('error', `run ${exec.runId}: released, a stored payload cannot be decoded here: ${reason}`, {
    error: serializeError(error),
  });
  await release(exec, RELEASE_DELAY_MS, reason, error);
}

/** The workflow replayed from its checkpoints and run on, and how it ended recorded. */
async function replay(exec: Execution, run: ClaimedRun, workflow: Workflow<any, any> | undefined, options: ExecuteOptions): Promise<void> {
  const { deps } = options;
  const runId = run.run_id;
  if (!workflow) {
    // Dispatch is per (workflow, version), so this only happens if a definition vanished mid-process.
    await release(exec, RELEASE_DELAY_MS, 'workflow_not_served');
    return;
  }
  const policyVersion = `${workflow.name}@${workflow.version}`;
  exec.observe({ root: 'input' }, run.input);
  let input: unknown = run.input;
  if (workflow.inputSchema) {
    const parsed = workflow.inputSchema.safeParse(run.input);
    if (!parsed.success) {
      const error = new InvalidInputError(`input of run ${runId} does not match workflow ${workflow.name}: ${parsed.error.message}`);
      await finish(exec, 'runledger._fail_run(p_run_id => $1, p_token => $2, p_error => $3::jsonb, p_policy_version => $4)', [
        JSON.stringify(exec.serializeError(error)),
        policyVersion,
      ]);
      return;
    }
    input = exec.observe({ root: 'input' }, parsed.data);
  }

  const ctx = new WorkflowContext(exec);
  if (workflow.limits.noProgress !== undefined) {
    const onNoProgress = workflow.onNoProgress;
    exec.noProgressPolicy = {
      limit: workflow.limits.noProgress,
      ...(onNoProgress ? { onNoProgress: (evidence) => onNoProgress(ctx, evidence) } : {}),
    };
  }
  // The execution ends the moment the workflow function settles (after its verify, which
  // is workflow code too): a ctx call still waiting to start its work then starts none,
  // and a later ctx call is refused.
  // The settlement is chained straight onto the workflow's promise (no extra await in
  // between): `ended` must be set in the same turn the function settles, before a ctx
  // call it left in flight can start its work (STEP_NOT_AWAITED).
  const threw = (error: unknown) => {
    exec.end('the workflow threw');
    return { kind: 'threw' as const, error };
  };
  const returned = (value: unknown, verdict?: Verdict) => {
    exec.end('the workflow returned');
    return { kind: 'returned' as const, value, verdict };
  };
  const verify = workflow.verify;
  // With a trace, the workflow runs with this execution's span active: the application's own spans nest under it.
  const started = exec.trace ? exec.trace.within(() => workflow.fn(ctx, input)) : workflow.fn(ctx, input);
  const settled = started.then((value) => {
    // The output's redacted values are known before verify builds its evidence from it.
    exec.observe({ root: 'output' }, storedForm(value));
    return verify ? verifyOutput(exec, ctx, verify, value, input).then((verdict) => returned(value, verdict), threw) : returned(value);
  }, threw);
  const outcome = await Promise.race([settled, exec.halted]);
  if (run.cancel_requested) {
    // Claimed CANCELLING (a cancel, a policy stop or compensate_run while no worker held
    // it): the replay only rebuilt the compensations; none of its own steps runs again.
    await finishStopping(exec, outcome);
    return;
  }
  if ('kind' in outcome && (outcome.kind === 'returned' || outcome.kind === 'threw') && !exec.haltReason) {
    const error = notAwaited(exec, policyVersion, outcome);
    if (error) exec.halt({ kind: 'not_awaited', error });
  }

  if ('kind' in outcome && outcome.kind === 'returned') {
    if (exec.haltReason) return handleHalt(exec, exec.haltReason, policyVersion);
    const leftover = exec.unconsumedCheckpoints();
    if (leftover.length > 0) {
      const error = new NonDeterminismError(
        `run ${runId}: the workflow returned after ${exec.stepsTaken} steps but the history has ${run.checkpoints.length}`,
        { stepsTaken: exec.stepsTaken, checkpoints: run.checkpoints.length, firstUnreached: leftover[0]![1] },
      );
      return handleHalt(exec, { kind: 'non_determinism', error }, policyVersion);
    }
    let outputText: string | undefined;
    let storedText: string | undefined;
    try {
      outputText = toJsonText(outcome.value, `output of run ${runId}`);
      exec.checkPayload(outputText, `output of run ${runId}`);
      if (outputText !== undefined) {
        checkPayloadSize(outputText, `output of run ${runId}`, deps.maxPayloadBytes);
        storedText = exec.payloads.text(outputText);
        if (storedText !== outputText) checkPayloadSize(storedText, `output of run ${runId} (encoded)`, deps.maxPayloadBytes);
      }
    } catch (error) {
      await finish(exec, 'runledger._fail_run(p_run_id => $1, p_token => $2, p_error => $3::jsonb, p_policy_version => $4)', [
        JSON.stringify(exec.serializeError(error)),
        policyVersion,
      ]);
      return;
    }
    if (outcome.verdict && !outcome.verdict.ok) {
      // verify refused the output: FAILED, reason UNVERIFIED, its reason as the evidence.
      if (!(await flushPending(exec))) return handleHalt(exec, exec.haltReason!, policyVersion);
      const { reason, evidence } = outcome.verdict;
      const error = new UnverifiedError(`run ${runId}: verify refused the output: ${reason}`, { reason, evidence });
      const failures = await runCompensations(exec);
      await finish(
        exec,
        'runledger._fail_run(p_run_id => $1, p_token => $2, p_error => $3::jsonb, p_policy_version => $4, p_reason => $5, p_evidence => $6::jsonb)',
        [
          JSON.stringify(exec.mask({ ...serializeError(error), ...(failures.length > 0 ? { compensationFailures: failures } : {}) })),
          policyVersion,
          'UNVERIFIED',
          // verify's evidence is the user's (it is about the output): redacted, then stored as the codec has it.
          JSON.stringify(exec.mask({ reason, ...(evidence === undefined ? {} : { evidence: exec.payloads.value(exec.mask(evidence)) }) })),
        ],
      );
      return;
    }
    if (deps.crash?.hit('before-complete', workflow.name)) return;
    const last = exec.pendingCheckpoint;
    exec.pendingCheckpoint = undefined;
    const verified = outcome.verdict?.ok ? outcome.verdict.evidence : undefined;
    const verificationJson = outcome.verdict?.ok
      ? JSON.stringify(verified === undefined ? null : exec.payloads.value(exec.mask(verified)))
      : undefined;
    await complete(exec, { clear: outputText, stored: storedText }, policyVersion, last, verificationJson);
  } else if ('kind' in outcome && outcome.kind === 'threw') {
    if (exec.haltReason) return handleHalt(exec, exec.haltReason, policyVersion);
    if (!(await flushPending(exec))) return handleHalt(exec, exec.haltReason!, policyVersion);
    await failRun(exec, exec.serializeError(outcome.error), policyVersion);
  } else {
    await handleHalt(exec, outcome as Halt, policyVersion);
  }
}

/** The ctx calls the workflow left in flight when it returned or threw, as the error the run fails with; undefined if none. */
function notAwaited(
  exec: Execution,
  policyVersion: string,
  outcome: { kind: 'returned' } | { kind: 'threw'; error: unknown },
): StepNotAwaitedError | undefined {
  const calls = [...exec.pendingCalls.values()];
  if (calls.length === 0) return undefined;
  const named = calls
    .map((c) => `ctx.${c.call}(${c.name === undefined ? '' : JSON.stringify(c.name)}) (position ${c.position})`)
    .join(', ');
  const how = outcome.kind === 'returned' ? 'returned' : `threw (${serializeError(outcome.error).message})`;
  return new StepNotAwaitedError(
    `run ${exec.runId}: workflow ${policyVersion} ${how} while ${named} ${calls.length === 1 ? 'was' : 'were'} still in flight: ` +
      'await every ctx call before the workflow returns; its result is not recorded',
    { calls },
    outcome.kind === 'threw' ? { cause: outcome.error } : {},
  );
}

/** Halts that mean this execution no longer holds the run, or must give it back: it writes nothing more. */
const LETTING_GO = new Set<Halt['kind']>(['lease_lost', 'infrastructure', 'shutdown', 'crashed', 'stopped', 'suspended', 'unreadable']);

/**
 * A run claimed CANCELLING: whatever the replay ended with (it stopped at the first step
 * without a checkpoint, returned, threw, or met a step the code no longer has), the
 * compensations it rebuilt run and the run ends: CANCELLED, or with the record of what
 * stopped it (stop_record). Compensations the replay did not reach stay not run; the
 * termination evidence names them.
 */
async function finishStopping(exec: Execution, outcome: unknown): Promise<void> {
  const halt = exec.haltReason;
  if (halt && LETTING_GO.has(halt.kind)) return handleHalt(exec, halt, '');
  if (halt?.kind === 'non_determinism') {
    exec.log('warn', `run ${exec.runId}: the replay of a stopping run diverged; compensating what it reached: ${halt.error.message}`);
  } else if (outcome && typeof outcome === 'object' && 'kind' in outcome && outcome.kind === 'threw') {
    exec.log('info', `run ${exec.runId}: the replay of a stopping run threw; compensating`);
  }
  await compensateAndFinish(exec);
}

/** Runs the compensations and ends the CANCELLING run this execution owns (_finish_cancel: CANCELLED, or its stop_record). */
async function compensateAndFinish(exec: Execution): Promise<void> {
  await runCompensations(exec);
  if (exec.haltReason?.kind === 'crashed' || exec.haltReason?.kind === 'suspended') return; // a crash point (tests)
  await finish(exec, 'runledger._finish_cancel(p_run_id => $1, p_token => $2)', []);
}

async function handleHalt(exec: Execution, halt: Halt, policyVersion: string): Promise<void> {
  switch (halt.kind) {
    case 'lease_lost':
      exec.log('warn', `run ${exec.runId}: ${halt.message}; another worker owns it now`);
      return;
    case 'non_determinism': {
      exec.log('error', halt.error.message);
      await flushPending(exec); // the previous step finished in this execution: keep its result
      // The evidence names both sides: the version the run recorded its history with and the code that differs.
      const recorded = await exec.deps.pool.query('select version_manifest from runledger.runs where run_id = $1', [exec.runId]);
      const evidence = {
        message: halt.error.message,
        ...halt.error.details,
        run_manifest: recorded.rows[0]?.version_manifest ?? null,
        code_manifest: exec.codeManifest ?? null,
      };
      await finish(
        exec,
        'runledger._dead_letter_run(p_run_id => $1, p_token => $2, p_reason => $3, p_evidence => $4::jsonb, p_policy_version => $5, p_error => $6::jsonb)',
        ['NON_DETERMINISM', JSON.stringify(exec.mask(evidence)), policyVersion, JSON.stringify(exec.serializeError(halt.error))],
      );
      return;
    }
    case 'infrastructure':
      exec.log('warn', `run ${exec.runId}: released after an infrastructure error`, { error: serializeError(halt.error) });
      await flushPending(exec).catch(() => false);
      await release(exec, RELEASE_DELAY_MS, 'infrastructure', halt.error);
      return;
    case 'fail':
      // A write broke a constraint: not retried as infrastructure, the run fails with the coded error.
      exec.log('error', `run ${exec.runId}: ${halt.error.message}`);
      await flushPending(exec).catch(() => false);
      await failRun(exec, { ...serializeError(halt.error), ...halt.error.details }, policyVersion);
      return;
    case 'shutdown':
      await flushPending(exec);
      await release(exec, 0, 'worker_stopping');
      return;
    case 'unreadable':
      await flushPending(exec).catch(() => false); // the step this execution finished keeps its result
      await releaseUnreadable(exec, halt.error);
      return;
    case 'suspended':
    case 'stopped':
    case 'crashed':
      return;
    case 'cancelled':
      // The step that was in flight when the cancel came keeps its result.
      await flushPending(exec);
      await compensateAndFinish(exec);
      return;
    case 'not_awaited': {
      // The user's bug: the calls left in flight record nothing (the halt stops them at their
      // next checkpoint); the step that finished before keeps its result; the run fails.
      exec.log('error', halt.error.message);
      if (!(await flushPending(exec))) return;
      const failures = await runCompensations(exec);
      const cause = halt.error.cause === undefined ? {} : { cause: serializeError(halt.error.cause) };
      const error = {
        ...serializeError(halt.error),
        calls: halt.error.details?.calls,
        ...cause,
        ...(failures.length > 0 ? { compensationFailures: failures } : {}),
      };
      await finish(exec, 'runledger._fail_run(p_run_id => $1, p_token => $2, p_error => $3::jsonb, p_policy_version => $4)', [
        JSON.stringify(exec.mask(error)),
        policyVersion,
      ]);
      return;
    }
    case 'terminate':
      await flushPending(exec); // the step before the limit finished: its result is kept
      await terminate(exec, halt.reason, halt.evidence);
      return;
  }
}

/** The run fails with this error: its compensations run first (sagas), and their failures join the error. */
async function failRun(exec: Execution, serialized: object, policyVersion: string): Promise<void> {
  const failures = await runCompensations(exec);
  const error = { ...serialized, ...(failures.length > 0 ? { compensationFailures: failures } : {}) };
  await finish(exec, 'runledger._fail_run(p_run_id => $1, p_token => $2, p_error => $3::jsonb, p_policy_version => $4)', [
    JSON.stringify(exec.mask(error)),
    policyVersion,
  ]);
}

/**
 * Success: the output (and the last step's deferred checkpoint) in one transaction, through
 * the group commit when there is one. `output.stored` is written; `output.clear` is what a
 * caller of this process awaiting the run is handed (engine.start's handle).
 */
async function complete(
  exec: Execution,
  output: { clear: string | undefined; stored: string | undefined },
  policyVersion: string,
  last: CheckpointRecord | undefined,
  verificationJson: string | undefined,
): Promise<void> {
  const { commits } = exec.deps;
  // The run ends with this write: whatever is pending goes with it, once (with the last step when there is one).
  const charge = exec.takeCharge();
  const outputText = output.stored;
  if (commits) {
    const item = completeItem({
      runId: exec.runId,
      token: exec.fencingToken.toString(),
      outputText,
      policyVersion,
      charge: charge.json,
      ...(verificationJson === undefined ? {} : { verificationJson }),
      ...(last ? { step: stepItemValues(exec, last, charge) } : {}),
    });
    await fencedWrite(exec, async () => {
      const result = await commits.submit(item, true, exec.trace?.ref);
      if (result.runStatus === 'SUCCEEDED') exec.succeeded = { outputText: output.clear };
    });
  } else if (last) {
    const [, , ...stepValues] = checkpointValues(exec, last, charge);
    await finish(
      exec,
      'runledger._complete_with_checkpoint(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_kind => $5, p_status => $6, p_step_output => $7::jsonb, p_error => $8::jsonb, p_attempts => $9, p_started_ms_ago => $10, p_charge => $11::jsonb, p_output => $12::jsonb, p_policy_version => $13, p_verification => $14::jsonb)',
      [...stepValues, outputText ?? null, policyVersion, verificationJson ?? null],
    );
  } else {
    await finish(
      exec,
      'runledger._complete_run(p_run_id => $1, p_token => $2, p_output => $3::jsonb, p_policy_version => $4, p_charge => $5::jsonb, p_verification => $6::jsonb)',
      [outputText ?? null, policyVersion, charge.json, verificationJson ?? null],
    );
  }
}

/** The error a _fail_run call stores (JSON text), or a dead letter's reason, for the span. */
function failureOf(arg: unknown): unknown {
  if (typeof arg !== 'string' || !arg.startsWith('{')) return String(arg);
  try {
    const error = JSON.parse(arg) as { message?: unknown; name?: unknown };
    return Object.assign(new Error(String(error.message ?? arg)), { name: typeof error.name === 'string' ? error.name : 'Error' });
  } catch {
    return arg;
  }
}

/** A fenced terminal write, retried across lost connections; a commit already made is recognised by the run's status. */
async function finish(exec: Execution, call: string, args: unknown[]): Promise<void> {
  // A failure or a dead letter marks this execution's span ERROR (args[0]: the error as JSON, or the reason).
  if (exec.trace && (call.startsWith('runledger._fail_run') || call.startsWith('runledger._dead_letter_run'))) {
    exec.trace.fail(failureOf(args[0]));
  }
  // The record of how a run ended is always stored: a character PostgreSQL cannot hold in
  // an error or evidence (workflow payloads were refused before this) becomes U+FFFD.
  const stored = args.map((arg) => (typeof arg === 'string' ? storableJson(storableText(arg)) : arg));
  await fencedWrite(exec, async () => {
    await exec.deps.pool.query(`select ${call}`, [exec.runId, exec.fencingToken.toString(), ...stored]);
    exec.deps.metrics?.commit('finish');
  });
}

/** A terminal write: once it returns, the engine's callers awaiting the run are woken at once (no NOTIFY round trip). */
async function fencedWrite(exec: Execution, write: () => Promise<unknown>): Promise<void> {
  // Every chunk written is stored before the run ends (a reader stops at a terminal run); chunks that could not be
  // stored (the execution halted) must not be ended without: the run is given back (executeClaimed) and replayed.
  const flushing = streamsFlushed(exec);
  if (flushing && !(await flushing)) throw new Error(`run ${exec.runId}: stream chunks could not be stored before the run's end`);
  try {
    // How the run ended (a terminal status, or CANCELLING after _terminate_run) is read for the metrics.
    if (await fencedWriteOnce(exec, write)) exec.deps.finishedRuns?.ended(exec.runId);
  } finally {
    exec.deps.finished?.(exec.runId);
  }
}

/** True when this call's write committed. */
async function fencedWriteOnce(exec: Execution, write: () => Promise<unknown>): Promise<boolean> {
  for (let attempt = 1; ; attempt++) {
    try {
      await write();
      return true;
    } catch (error) {
      if (pgCode(error) === SQLSTATE.LEASE_LOST) {
        // Either another worker took over, or our previous try committed before its reply was lost.
        exec.log('warn', `run ${exec.runId}: not finished by this worker: ${(error as Error).message}`);
        return false;
      }
      if (pgCode(error) === SQLSTATE.PAST_DEADLINE) {
        // The deadline passed before the run could finish: that is how it ends.
        await terminate(exec, 'DEADLINE', { message: (error as Error).message });
        return false;
      }
      if (!isConnectionError(error) || attempt >= FINISH_TRIES) throw error;
      await new Promise((resolve) => setTimeout(resolve, 100 * attempt));
    }
  }
}

/**
 * A policy stop by the owner. A run with compensations due comes back CANCELLING (still
 * ours, with the TERMINATED record set aside): its compensations run here, newest first,
 * and it ends TERMINATED. A crash in between leaves it CANCELLING for recovery and the
 * next claim, which finish the same way.
 */
async function terminate(exec: Execution, reason: string, evidence: Record<string, unknown>): Promise<void> {
  let status: string | undefined;
  await fencedWrite(exec, async () => {
    const { rows } = await exec.deps.pool.query(
      'select runledger._terminate_run(p_run_id => $1, p_token => $2, p_reason => $3, p_evidence => $4::jsonb) as status',
      [exec.runId, exec.fencingToken.toString(), reason, storableJson(JSON.stringify(exec.mask(evidence)))],
    );
    status = rows[0].status;
    exec.deps.metrics?.commit('finish');
  });
  if (status === 'CANCELLING') await compensateAndFinish(exec);
}

/** The value as it will be stored (a Date as its ISO string...), for the redact paths; the value itself if it cannot be stored. */
function storedForm(value: unknown): unknown {
  try {
    return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
  } catch {
    return value;
  }
}

/**
 * Gives the run back. `error`, when a failure is why, is kept with the release and, when
 * this release is one too many (max_recovery_attempts), in the dead letter's runs.error.
 */
async function release(exec: Execution, delayMs: number, reason: string, error?: unknown): Promise<void> {
  // Only a graceful stop gives a run back for free; every other release counts a recovery attempt.
  const countsAttempt = reason !== 'worker_stopping';
  await exec.deps.pool.query(
    'select runledger._release_run(p_run_id => $1, p_token => $2, p_delay_ms => $3, p_reason => $4, p_counts_attempt => $5, p_error => $6::jsonb)',
    [exec.runId, exec.fencingToken.toString(), delayMs, reason, countsAttempt, error === undefined ? null : releaseError(exec, error)],
  );
  exec.deps.metrics?.commit('release');
  // Past max_recovery_attempts the release dead-lettered the run.
  if (countsAttempt) exec.deps.finishedRuns?.ended(exec.runId, 'MAX_RECOVERY_ATTEMPTS');
}

/** The error a run is given back for, as stored: class, code, message and the SQLSTATE of a database error. */
function releaseError(exec: Execution, error: unknown): string {
  const sqlstate = pgCode(error);
  const { stack: _stack, ...serialized } = serializeError(error);
  return storableJson(JSON.stringify(exec.mask({ ...serialized, ...(sqlstate === undefined ? {} : { sqlstate }) })));
}
