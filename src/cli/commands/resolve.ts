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
  usage: 'runledger resolve OPERATION_ID --status SUCCEEDED|FAILED [--result JSON] [--by NAME]',
  async run(args) {
    const parsed = parse(
      resolve,
      args,
      { status: { type: 'string' }, result: { type: 'string' }, by: { type: 'string' } },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const operationId = parsed.positionals[0]!;
    const status = requiredOption(resolve, parsed.values, 'status').toUpperCase();
    if (status !== 'SUCCEEDED' && status !== 'FAILED') {
      throw new CliError('USAGE', `--status must be SUCCEEDED or FAILED, got ${JSON.stringify(parsed.values.status)}`);
    }
    const result = jsonArgument(parsed.values.result as string | undefined, '--result');
    const by = parsed.values.by as string | undefined;
    const payloads = cliPayloads();
    const settled = await withPool(parsed.values, (pool) =>
      resolveOperation(pool, operationId, { status, result, ...(by === undefined ? {} : { resolvedBy: by }) }, payloads),
    );
    print(`operation ${operationId} resolved as ${settled}`);
    print('the run waiting on it is woken; its workflow continues with this outcome');
  },
};
