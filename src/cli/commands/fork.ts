import { print } from '../format.js';
import { forkRun } from '../../engine/client/operator.js';
import { forkKeyWarnings, forkKeyWarningText } from '../../engine/client/fork-keys.js';
import { intOption, parse, requiredOption, withPool, type Command, cliIo } from '../shared.js';

/**
 * Through runledger.fork_run. Prints only the new run's id, like `start`, so
 * scripts can write NEW=$(runledger fork ...). A warning (on stderr, as fork_run's
 * NOTICE says it) lists the operations the fork runs again whose key holds the source's
 * run id: made from ctx.runId, each makes a second effect.
 */
export const fork: Command = {
  summary: "start a new run that reuses a run's checkpoints before step --from; prints its run id",
  usage:
    'runledger fork RUN_ID --from STEP [--version V]   (STEP: the position in `runledger show`; 0 starts over; V: run the fork on that version)',
  args: [['RUN_ID', 'the source run']],
  examples: ['NEW=$(runledger fork 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --from 3)', 'runledger fork 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --from 0 --version 2'],
  async run(args) {
    const parsed = parse(
      fork,
      args,
      {
        from: {
          type: 'string',
          value: 'STEP',
          help: 'the first step position to run again (the # column of `runledger show`); 0 starts over (required)',
        },
        version: { type: 'string', value: 'V', help: "run the fork on this version of the workflow (default: the source's)" },
      },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const runId = parsed.positionals[0]!;
    requiredOption(fork, parsed.values, 'from');
    const fromStep = intOption(parsed.values, 'from', 0)!;
    const { fork: forked, warning } = await withPool(parsed.values, async (pool) => {
      const fork = await forkRun(pool, runId, fromStep, parsed.values.version as string | undefined);
      return { fork, warning: forkKeyWarningText(fork, runId, await forkKeyWarnings(pool, runId, fromStep)) };
    });
    if (warning) cliIo().stderr.write(`warning: ${warning}\n`);
    print(forked);
  },
};
