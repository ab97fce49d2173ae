import { flushPending } from '../engine/run/checkpoint.js';
import { UNREADABLE, type Execution, type StepKind } from '../engine/run/execution.js';
import { haltOnDbError } from '../engine/run/halts.js';
import { streamsFlushed } from './stream.js';
import { toJsonText } from '../engine/core/json.js';

const WAIT_SQL =
  'select done, output from runledger._wait(p_run_id => $1, p_token => $2, p_seq => $3, p_name => $4, p_kind => $5, p_spec => $6::jsonb)';

/**
 * A durable wait at the next step position, in one round trip (runledger._wait).
 * Returns the wait's recorded result once it ended (now or in an earlier
 * execution). Otherwise the run is already parked WAITING in the database: the
 * execution is suspended and this promise never settles, so no user try/catch
 * ever sees the suspension.
 */
export async function runWait(
  exec: Execution,
  name: string,
  kind: StepKind,
  spec: Record<string, unknown>,
): Promise<Record<string, unknown>> {
  // Refused at the call (OUTPUT_NOT_SERIALIZABLE) when it holds a text PostgreSQL cannot store: an approver's name...
  const specText = toJsonText(spec, `ctx.${kind}(${JSON.stringify(name)})`)!;
  const position = exec.takeStep(name, kind);
  if (!position) return exec.suspend();
  if (position.recorded?.[2] === 'SUCCEEDED') return (position.recorded[3] as [Record<string, unknown>])[0];
  if (!(await flushPending(exec))) return exec.suspend();
  if (exec.stopping) return exec.noNewStep();
  // Chunks written before the wait are stored before the run parks (a parked run's writes are refused).
  const flushing = streamsFlushed(exec);
  if (flushing && !(await flushing)) return exec.suspend();
  let result;
  try {
    result = await exec.inStep(() =>
      exec.deps.pool.query({
        name: 'runledger_wait',
        text: WAIT_SQL,
        values: [exec.runId, exec.fencingToken.toString(), position.seq, name, kind, specText],
      }),
    );
  } catch (error) {
    // A lost connection included: replay resolves it, since the wait either committed
    // (parked, or ended with its result) or did not.
    haltOnDbError(exec, error);
    return exec.suspend();
  }
  const row = result.rows[0];
  exec.trace?.event('runledger.wait', {
    'runledger.step': name,
    'runledger.wait_kind': kind,
    'runledger.seq': position.seq,
    'runledger.parked': !row.done,
  });
  if (row.done) {
    // Ended at once (a signal was waiting, the child had ended...): its payload as the codec stored it.
    const output = exec.readable(() => exec.payloads.decodeStepOutput(kind, row.output) as Record<string, unknown>);
    return output === UNREADABLE ? exec.suspend() : output;
  }
  exec.halt({ kind: 'suspended' });
  return exec.suspend();
}
