import { print } from '../format.js';
import { resolveOperation } from '../../engine/client/operator.js';
import { CliError, cliPayloads, jsonArgument, parse, requiredOption, withPool, type Command } from '../shared.js';

/**
 * Through runledger.resolve_operation: an operator settles an external operation
 * whose outcome is UNKNOWN (runledger unknown lists them), after checking the
 * outside system. SUCCEEDED takes the operation's result; FAILED takes the error.
 */
export const resolve: Command = {
  summary: 'settle an UNKNOWN operation as SUCCEEDED or FAILED; wakes its run',
  usage: 'runledger resolve OPERATION_ID --status SUCCEEDED|FAILED [--result JSON|@FILE|-] [--by NAME]',
  args: [['OPERATION_ID', 'an operation listed by `runledger unknown`']],
  examples: [
    'runledger resolve 01J9Z3M0AB12CD34EF56GH78JK --status succeeded --result \'{"id":"T-1"}\' --by oncall',
    'runledger resolve 01J9Z3M0AB12CD34EF56GH78JK --status failed --by oncall',
  ],
  async run(args) {
    const parsed = parse(
      resolve,
      args,
      {
        status: { type: 'string', value: 'S', help: 'SUCCEEDED (it happened) or FAILED (it did not), case-insensitive (required)' },
        result: {
          type: 'string',
          value: 'JSON',
          help: "with SUCCEEDED, the operation's result (the workflow receives it); @FILE reads a file, - reads stdin",
        },
        by: { type: 'string', value: 'NAME', help: 'who settled it, kept on the operation and in the audit log' },
      },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const operationId = parsed.positionals[0]!;
    const status = requiredOption(resolve, parsed.values, 'status').toUpperCase();
    if (status !== 'SUCCEEDED' && status !== 'FAILED') {
      throw new CliError('USAGE', `--status must be SUCCEEDED or FAILED, got ${JSON.stringify(parsed.values.status)}`);
    }
    const result = (await jsonArgument(parsed.values.result as string | undefined, '--result'))?.value;
    const by = parsed.values.by as string | undefined;
    const payloads = cliPayloads();
    const settled = await withPool(parsed.values, (pool) =>
      resolveOperation(pool, operationId, { status, result, ...(by === undefined ? {} : { resolvedBy: by }) }, payloads),
    );
    print(`operation ${operationId} resolved as ${settled}`);
    print('the run waiting on it is woken; its workflow continues with this outcome');
  },
};
