import { CliError, type Command } from '../shared.js';

/**
 * Commands of the documented CLI whose engine support has not landed. They exist
 * so that `runledger --help` shows the whole contract and a script gets a clear,
 * distinct exit code (2) instead of "unknown command".
 */
function unavailable(name: string, usage: string, summary: string, missing: string): Command {
  return {
    summary: `${summary} (not available yet)`,
    usage,
    async run() {
      throw new CliError('NOT_AVAILABLE', `runledger ${name} is not available yet: this engine version has no ${missing}`);
    },
  };
}

export const signal = unavailable('signal', 'runledger signal RUN_ID TOPIC [JSON] [--id SIGNAL_ID]', 'deliver a signal to a run', 'signals');
export const approve = unavailable('approve', 'runledger approve REQUEST_ID --by NAME [--reject] [--note TEXT]', 'decide an approval request', 'approvals');
export const cancel = unavailable('cancel', 'runledger cancel RUN_ID', 'cancel a run', 'cancellation');
export const fork = unavailable('fork', 'runledger fork RUN_ID --from STEP', 'new run from a run\'s checkpoints', 'fork_run');
export const dev = unavailable('dev', 'runledger dev', 'embedded Postgres + worker + examples', 'dev mode (for a tour, run `npm run demo` in the runledger repository)');
