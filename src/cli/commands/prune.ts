import { pgCode } from '../../engine/db/pg-errors.js';
import { print } from '../format.js';
import { CliError, parse, requiredOption, withPool, type Command } from '../shared.js';

/** PostgreSQL's "that is not an interval" SQLSTATEs: a typo in --older-than is a usage error. */
const BAD_INTERVAL = ['22007', '22008', '22P02', '22015'];

/** Through runledger.prune: finished runs only, with everything they own. */
export const prune: Command = {
  summary: 'delete finished runs (and their steps, events, ...) that finished longer ago than INTERVAL',
  usage: "runledger prune --older-than INTERVAL   (a PostgreSQL interval: '30 days', '12h', '1 week')",
  examples: ["runledger prune --older-than '30 days'", 'runledger prune --older-than 12h'],
  async run(args) {
    const parsed = parse(prune, args, {
      'older-than': {
        type: 'string',
        value: 'INTERVAL',
        help: 'delete runs that finished longer ago than this PostgreSQL interval (required)',
      },
    });
    if (!parsed) return;
    const olderThan = requiredOption(prune, parsed.values, 'older-than');
    const removed = await withPool(parsed.values, async (pool) => {
      try {
        const result = await pool.query('select runledger.prune(p_older_than => $1::interval)::int8 as n', [olderThan]);
        return Number(result.rows[0].n);
      } catch (error) {
        if (BAD_INTERVAL.includes(pgCode(error) ?? '')) {
          throw new CliError('USAGE', `--older-than ${JSON.stringify(olderThan)} is not a PostgreSQL interval (e.g. '30 days', '12h')`);
        }
        throw error;
      }
    });
    print(`removed ${removed} finished run(s) older than ${olderThan}, with their steps, events, operations, signals and approvals`);
  },
};
