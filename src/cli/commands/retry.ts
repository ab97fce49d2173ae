import { print } from '../format.js';
import { retryRun } from '../../engine/client/runs.js';
import { parse, withPool, type Command } from '../shared.js';

/** Through runledger.retry_run, so the CLI, TypeScript and psql share one rule for what can be retried. */
export const retry: Command = {
  summary: 'put a FAILED or DEAD_LETTER run back to PENDING (its checkpoints stay)',
  usage: 'runledger retry RUN_ID',
  args: [['RUN_ID', 'a FAILED or DEAD_LETTER run']],
  examples: ['runledger retry 01J9Z3K4X8Q2W5E7R1T6Y0U3IO', "runledger dead-letter --json | jq -r '.[].run_id' | xargs -n1 runledger retry"],
  async run(args) {
    const parsed = parse(retry, args, {}, { min: 1, max: 1 });
    if (!parsed) return;
    const runId = parsed.positionals[0]!;
    const status = await withPool(parsed.values, (pool) => retryRun(pool, runId));
    print(`run ${runId} is ${status} again`);
    print('a worker serving its workflow resumes it from its last successful checkpoint');
  },
};
