import { timestamp, print } from '../format.js';
import { decideApproval } from '../../engine/client/operator.js';
import { CliError, cliPayloads, EXIT_FAILED, parse, requiredOption, withPool, type Command } from '../shared.js';

/**
 * Through runledger.decide_approval: the first decision wins and stays as audit
 * evidence. Repeating the same decision is not an error (exit 0); a different
 * decision on a request already decided is refused (exit 1, ALREADY_DECIDED).
 */
export const approve: Command = {
  summary: 'decide an approval request (approve, or --reject)',
  usage: 'runledger approve REQUEST_ID --by NAME [--reject] [--note TEXT]',
  async run(args) {
    const parsed = parse(
      approve,
      args,
      { by: { type: 'string' }, reject: { type: 'boolean' }, note: { type: 'string' } },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const requestId = parsed.positionals[0]!;
    const decidedBy = requiredOption(approve, parsed.values, 'by');
    const approved = !parsed.values.reject;
    const note = parsed.values.note as string | undefined;
    const payloads = cliPayloads();
    const decision = await withPool(parsed.values, (pool) =>
      decideApproval(pool, requestId, { approved, decidedBy, ...(note === undefined ? {} : { note }) }, payloads),
    );
    if (decision.approved === null) {
      // A request that needs several approvals, not decided yet.
      const yes = (decision.votes ?? []).filter((v) => v.approved).length;
      print(
        decision.recorded
          ? `request ${requestId}: ${decidedBy}'s approval recorded, ${yes} of ${decision.required} approvals in; the run waits for the rest`
          : `request ${requestId}: ${decidedBy} already decided; ${yes} of ${decision.required} approvals in, nothing changed`,
      );
      return;
    }
    const verdict = `${decision.approved ? 'approved' : 'rejected'} by ${decision.decidedBy} at ${timestamp(new Date(decision.decidedAt!))}`;
    if (decision.recorded) {
      print(`request ${requestId} ${verdict}`);
      print('the waiting run is woken and continues with this decision');
      return;
    }
    if (decision.approved === approved) {
      print(`request ${requestId} was already ${verdict}: nothing changed`);
      return;
    }
    throw new CliError('ALREADY_DECIDED', `request ${requestId} was already ${verdict}; the first decision stands`, EXIT_FAILED);
  },
};
