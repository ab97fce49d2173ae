import { CliError, type Command } from '../shared.js';

/**
 * Commands of the documented CLI whose support has not landed. They exist so
 * that `runledger --help` shows the whole contract and a script gets a clear,
 * distinct exit code (2) instead of "unknown command".
 */
function unavailable(name: string, usage: string, summary: string, missing: string): Command {
  return {
    summary: `${summary} (not available yet)`,
    usage,
    examples: [usage],
    async run() {
      throw new CliError('NOT_AVAILABLE', `runledger ${name} is not available yet: this version has no ${missing}`);
    },
  };
}

export const dev = unavailable(
  'dev',
  'runledger dev',
  'embedded Postgres + worker + examples',
  'dev mode (for a tour, run `npm run demo` in the runledger repository)',
);
