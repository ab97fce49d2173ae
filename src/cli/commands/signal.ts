import { newId } from '../../engine/core/ids.js';
import { print } from '../format.js';
import { sendSignal } from '../../engine/client/operator.js';
import { cliPayloads, jsonArgument, parse, withPool, type Command } from '../shared.js';

/**
 * Through runledger.send_signal. The signal id deduplicates: sending the same id
 * again changes nothing, so a script may repeat the command safely. Without --id a
 * new one is generated and printed, so it can be repeated by hand too.
 */
export const signal: Command = {
  summary: 'deliver a signal to a run (deduplicated by signal id)',
  usage: 'runledger signal RUN_ID TOPIC [JSON_PAYLOAD|@FILE|-] [--id SIGNAL_ID]',
  args: [
    ['RUN_ID', 'the run to signal'],
    ['TOPIC', 'what its ctx.waitForSignal waits on'],
    ['JSON_PAYLOAD', 'the value the wait returns (default null); @FILE reads it from a file, - from stdin'],
  ],
  examples: [
    'runledger signal 01J9Z3K4X8Q2W5E7R1T6Y0U3IO reply \'{"ok":true}\'',
    'runledger signal 01J9Z3K4X8Q2W5E7R1T6Y0U3IO documents @scan.json --id scan-7',
  ],
  async run(args) {
    const parsed = parse(
      signal,
      args,
      {
        id: {
          type: 'string',
          value: 'SIGNAL_ID',
          help: 'the deduplication id: the same id sent again changes nothing (default: a new one)',
        },
      },
      { min: 2, max: 3 },
    );
    if (!parsed) return;
    const [runId, topic, json] = parsed.positionals as [string, string, string | undefined];
    const payload = (await jsonArgument(json, 'JSON_PAYLOAD'))?.value;
    const signalId = (parsed.values.id as string | undefined) ?? newId();
    const payloads = cliPayloads();
    const accepted = await withPool(parsed.values, (pool) => sendSignal(pool, runId, topic, payload, signalId, payloads));
    if (accepted) {
      print(`signal ${signalId} (${topic}) accepted by run ${runId}`);
      print('a wait on that topic consumes it; if none is waiting yet, it stays in the inbox until one does');
    } else {
      print(`signal ${signalId} had already been accepted by run ${runId}: nothing changed`);
    }
  },
};
