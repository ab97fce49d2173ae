import { InvalidInputError, NonDeterminismError, serializeError, StepNotAwaitedError, UnverifiedError } from '../core/errors.js';
import { checkPayloadSize, toJsonText } from '../core/json.js';
import type { Verdict, VerifyFunction, Workflow } from '../core/workflow.js';
import type { WorkflowContext } from '../core/workflow-context.js';
import { flushPending } from './checkpoint.js';
import { runCompensations } from './compensate.js';
import type { Execution, Halt } from './execution.js';
import { complete, failRun, finish, release, RELEASE_DELAY_MS } from './finish.js';
import { finishStopping, handleHalt } from './on-halt.js';
import { establishEnvironment } from './environment.js';

/**
 * The ctx a workflow function receives for one execution, and its verify run through that
 * ctx as the step `@verify`. The worker provides them (agents/context.ts, steps/verify.ts):
 * run/ declares what it needs, the layers above implement it.
 */
export interface RunContext {
  ctx: WorkflowContext;
  verify(verify: VerifyFunction<any>, output: unknown, input: unknown): Promise<Verdict>;
}
export type OpenContext = (exec: Execution) => RunContext;

/**
 * The claimed run's workflow replayed from its checkpoints and run on, and how it ended
 * recorded (completed, failed, dead-lettered, terminated, cancelled, or given back).
 * `run` is what the claim said beyond the Execution: the decoded input, and whether the
 * run was claimed CANCELLING.
 */
export async function runWorkflow(
  exec: Execution,
  run: { input: unknown; cancelRequested: boolean },
  workflow: Workflow<any, any> | undefined,
  open: OpenContext,
): Promise<void> {
  const { deps } = exec;
  const runId = exec.runId;
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

  const { ctx, verify: verifyThrough } = open(exec);
  exec.policy = workflow.policy;
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
  const environment = workflow.environment;
  // The environment is made (or rebuilt here) before the function: its step is the run's first.
  const fn = environment
    ? async () => {
        await establishEnvironment(exec, ctx, environment, input);
        return workflow.fn(ctx, input);
      }
    : () => workflow.fn(ctx, input);
  const started = exec.trace ? exec.trace.within(fn) : fn();
  const settled = started.then((value) => {
    // The output's redacted values are known before verify builds its evidence from it.
    exec.observe({ root: 'output' }, storedForm(value));
    return verify ? verifyThrough(verify, value, input).then((verdict) => returned(value, verdict), threw) : returned(value);
  }, threw);
  const outcome = await Promise.race([settled, exec.halted]);
  if (run.cancelRequested) {
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
        `run ${runId}: the workflow returned after ${exec.stepsTaken} steps but the history has ${exec.checkpoints.length}`,
        { stepsTaken: exec.stepsTaken, checkpoints: exec.checkpoints.length, firstUnreached: leftover[0]![1] },
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

/** The value as it will be stored (a Date as its ISO string...), for the redact paths; the value itself if it cannot be stored. */
function storedForm(value: unknown): unknown {
  try {
    return value === undefined ? undefined : JSON.parse(JSON.stringify(value));
  } catch {
    return value;
  }
}
