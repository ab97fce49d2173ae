import type { RunStatus } from '../../engine/core/states.js';
import { print } from '../format.js';
import { compensateRun } from '../../engine/client/operator.js';
import { parse, withPool, type Command } from '../shared.js';

/** Through runledger.compensate_run: safe to repeat (a run being compensated, or with nothing left to undo, is left as it is). */
export const compensate: Command = {
  summary: "run a finished run's compensations that are not done (a failed one again)",
  usage: 'runledger compensate RUN_ID [--reason TEXT]',
  args: [['RUN_ID', 'a finished run (FAILED, DEAD_LETTER, TERMINATED ...) whose compensations are not all done']],
  examples: ['runledger compensate 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --reason "order withdrawn"'],
  async run(args) {
    const parsed = parse(
      compensate,
      args,
      { reason: { type: 'string', value: 'TEXT', help: 'why, kept in the audit log' } },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const runId = parsed.positionals[0]!;
    const reason = parsed.values.reason as string | undefined;
    const { before, status } = await withPool(parsed.values, async (pool) => {
      // Read first only to word the answer: compensate_run decides, under the run's row lock.
      const row = await pool.query<{ status: RunStatus }>('select status from runledger.runs where run_id = $1', [runId]);
      return { before: row.rows[0]?.status, status: await compensateRun(pool, runId, reason) };
    });
    if (status === 'CANCELLING' && before === 'CANCELLING') {
      print(`run ${runId} is already CANCELLING: its compensations are being run`);
    } else if (status === 'CANCELLING') {
      print(`run ${runId} is CANCELLING: a worker serving its workflow version runs the compensations not done,`);
      print(`then the run ends ${before} again (runledger show RUN_ID)`);
    } else {
      print(`run ${runId} (${status}) has nothing left to compensate`);
    }
  },
};
