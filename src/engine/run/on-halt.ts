import { serializeError } from '../core/errors.js';
import { flushPending } from './checkpoint.js';
import { runCompensations } from './compensate.js';
import type { Execution, Halt } from './execution.js';
import { compensateAndFinish, failRun, finish, release, RELEASE_DELAY_MS, releaseUnreadable, terminate } from './finish.js';

/** Halts that mean this execution no longer holds the run, or must give it back: it writes nothing more. */
const LETTING_GO = new Set<Halt['kind']>(['lease_lost', 'infrastructure', 'shutdown', 'crashed', 'stopped', 'suspended', 'unreadable']);

/**
 * A run claimed CANCELLING: whatever the replay ended with (it stopped at the first step
 * without a checkpoint, returned, threw, or met a step the code no longer has), the
 * compensations it rebuilt run and the run ends: CANCELLED, or with the record of what
 * stopped it (stop_record). Compensations the replay did not reach stay not run; the
 * termination evidence names them.
 */
export async function finishStopping(exec: Execution, outcome: unknown): Promise<void> {
  const halt = exec.haltReason;
  if (halt && LETTING_GO.has(halt.kind)) return handleHalt(exec, halt, '');
  if (halt?.kind === 'non_determinism') {
    exec.log('warn', `run ${exec.runId}: the replay of a stopping run diverged; compensating what it reached: ${halt.error.message}`);
  } else if (outcome && typeof outcome === 'object' && 'kind' in outcome && outcome.kind === 'threw') {
    exec.log('info', `run ${exec.runId}: the replay of a stopping run threw; compensating`);
  }
  await compensateAndFinish(exec);
}

/** What this execution writes for the halt that stopped it (nothing, when it no longer holds the run). */
export async function handleHalt(exec: Execution, halt: Halt, policyVersion: string): Promise<void> {
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
