/**
 * Items of runledger._commit_batch, encoded as JSON text by hand: outputs are spliced
 * in as the JSON text they already are, so a large output is never parsed and
 * re-serialized on the hot path. The worker's group commit sends them; the run layer
 * builds them.
 */
import { storableJson } from '../core/storable.js';

/** One item of runledger._commit_batch, as JSON text. */
export type CommitItem = string;

export interface CommitResult {
  /**
   * The run's status after the item. For a checkpoint: CANCELLING, TERMINATED... tell the
   * worker to stop. For a completion: SUCCEEDED, or the status a charge past the budget
   * ended the run with.
   */
  runStatus: string | undefined;
}

const json = (value: unknown): string => JSON.stringify(value);

/** Item fields shared by a checkpoint and by the last step of a completion. */
function stepFields(
  values: {
    runId: string;
    token: string;
    seq: number;
    name: string;
    kind: string;
    status: string;
    outputText: string | undefined;
    errorJson: string | null;
    attempts: number;
    /** How long ago the step started, in ms on the worker's monotonic clock; SQL stamps started_at = runledger.now() - this. */
    startedMsAgo: number;
    /** The charge as JSON text (runledger._charge), or null for none (the item then has no "charge"). */
    charge: string | null;
  },
  outputKey: string,
): string {
  return (
    `"run_id":${json(values.runId)},"token":${json(values.token)},"seq":${values.seq},"name":${json(values.name)},` +
    `"kind":${json(values.kind)},"status":${json(values.status)},` +
    (values.outputText === undefined ? '' : `${json(outputKey)}:${values.outputText},`) +
    // An error is a diagnostic: kept, with what jsonb cannot hold as U+FFFD (core/storable.ts).
    (values.errorJson === null ? '' : `"error":${storableJson(values.errorJson)},`) +
    `"attempts":${values.attempts},"started_ms_ago":${values.startedMsAgo}` +
    (values.charge === null ? '' : `,"charge":${values.charge}`)
  );
}

export type StepItemValues = Parameters<typeof stepFields>[0];

export function checkpointItem(values: StepItemValues): CommitItem {
  return `{"op":"checkpoint",${stepFields(values, 'output')}}`;
}

/** A completion; with `step`, the run's last step is checkpointed in the same transaction. */
export function completeItem(values: {
  runId: string;
  token: string;
  outputText: string | undefined;
  policyVersion: string;
  charge: string | null;
  /** What the workflow's verify accepted the output with, as JSON text (kept in the termination record). */
  verificationJson?: string;
  step?: StepItemValues;
}): CommitItem {
  const head = values.step
    ? stepFields(values.step, 'step_output')
    : `"run_id":${json(values.runId)},"token":${json(values.token)}` + (values.charge === null ? '' : `,"charge":${values.charge}`);
  return (
    `{"op":"complete",${head},` +
    (values.outputText === undefined ? '' : `"output":${values.outputText},`) +
    (values.verificationJson === undefined ? '' : `"verification":${values.verificationJson},`) +
    `"policy_version":${json(values.policyVersion)}}`
  );
}
