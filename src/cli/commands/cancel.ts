import { TERMINAL_STATES, type RunStatus } from '../../engine/core/states.js';
import { print } from '../format.js';
import { cancelRun } from '../../engine/client/operator.js';
import { parse, withPool, type Command } from '../shared.js';

/** Through runledger.cancel_run, which is safe to repeat: a finished run is left as it is. */
export const cancel: Command = {
  summary: 'cancel a run (its children too); a finished run is left as it is',
  usage: 'runledger cancel RUN_ID [--reason TEXT]',
  args: [['RUN_ID', 'the run to cancel']],
  details:
    'A WAITING or PENDING run ends CANCELLED at once; a RUNNING one is CANCELLING until its worker runs the compensations of what it did.',
  examples: ['runledger cancel 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --reason "customer withdrew the order"'],
  async run(args) {
    const parsed = parse(
      cancel,
      args,
      { reason: { type: 'string', value: 'TEXT', help: "why, kept in the run's termination evidence and the audit log" } },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const runId = parsed.positionals[0]!;
    const reason = parsed.values.reason as string | undefined;
    const { before, status } = await withPool(parsed.values, async (pool) => {
      // Read first only to word the answer: cancel_run itself decides, under the run's row lock.
      const row = await pool.query<{ status: RunStatus }>('select status from runledger.runs where run_id = $1', [runId]);
      return { before: row.rows[0]?.status, status: await cancelRun(pool, runId, reason) };
    });
    if (before !== undefined && TERMINAL_STATES.has(before)) {
      print(`run ${runId} had already finished (${before}): nothing to cancel`);
      return;
    }
    switch (status) {
      case 'CANCELLED':
        print(`run ${runId} is CANCELLED`);
        return;
      case 'CANCELLING':
        print(`run ${runId} is CANCELLING: its worker lets the step in flight record its result,`);
        print('runs the compensations of what it already did, then ends it CANCELLED (runledger show RUN_ID)');
        return;
      default:
        print(`run ${runId} had already finished (${status}): nothing to cancel`);
    }
  },
};
