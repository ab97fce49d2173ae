import type pg from 'pg';
import { RunledgerError } from '../../engine/core/errors.js';
import { timestamp, print } from '../format.js';
import { decideApproval } from '../../engine/client/operator.js';
import { CliError, cliPayloads, EXIT_FAILED, parse, requiredOption, withPool, type Command } from '../shared.js';

interface Pending {
  request_id: string;
  name: string;
  action: string;
}

/**
 * Through runledger.decide_approval: the first decision wins and stays as audit
 * evidence. Repeating the same decision is not an error (exit 0); a different
 * decision on a request already decided is refused (exit 1, ALREADY_DECIDED).
 *
 * `--run RUN_ID` decides the run's pending request when it has exactly one (several:
 * refused with AMBIGUOUS, listing them). A run id given where a request id is expected
 * is refused (NOT_FOUND, as decide_approval says) with the run's pending requests named:
 * a decision is taken on a request the approver has named, never guessed.
 */
export const approve: Command = {
  summary: 'decide an approval request (approve, or --reject)',
  usage:
    'runledger approve REQUEST_ID --by NAME [--reject] [--note TEXT]\n       runledger approve --run RUN_ID --by NAME [--reject] [--note TEXT]',
  args: [['REQUEST_ID', 'the request (runledger approvals lists them; runledger show RUN_ID too)']],
  examples: [
    "runledger approve 01J9Z3P7QR56ST78UV90WX12YZ --by alice --note 'checked the diff'",
    'runledger approve --run 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --by alice',
    "runledger approve 01J9Z3P7QR56ST78UV90WX12YZ --by bob --reject --note 'too risky on a Friday'",
  ],
  async run(args) {
    const parsed = parse(
      approve,
      args,
      {
        run: { type: 'string', value: 'RUN_ID', help: "decide this run's pending request (refused if it has several)" },
        by: { type: 'string', value: 'NAME', help: "who decides; must be one of the request's approvers, if it names any (required)" },
        reject: { type: 'boolean', help: 'reject instead of approve' },
        note: { type: 'string', value: 'TEXT', help: 'a note kept with the decision; the workflow receives it' },
      },
      { min: 0, max: 1 },
    );
    if (!parsed) return;
    const runOption = parsed.values.run as string | undefined;
    if ((parsed.positionals[0] === undefined) === (runOption === undefined)) {
      throw new CliError(
        'USAGE',
        `give a REQUEST_ID or --run RUN_ID, not ${runOption === undefined ? 'neither' : 'both'}\nusage: ${approve.usage}`,
      );
    }
    const decidedBy = requiredOption(approve, parsed.values, 'by');
    const approved = !parsed.values.reject;
    const note = parsed.values.note as string | undefined;
    const payloads = cliPayloads();
    const { requestId, decision } = await withPool(parsed.values, async (pool) => {
      const id = runOption === undefined ? parsed.positionals[0]! : await onlyPendingRequest(pool, runOption);
      try {
        return {
          requestId: id,
          decision: await decideApproval(pool, id, { approved, decidedBy, ...(note === undefined ? {} : { note }) }, payloads),
        };
      } catch (error) {
        if (runOption === undefined && error instanceof RunledgerError && error.code === 'NOT_FOUND') await refuseRunId(pool, id, error);
        throw error;
      }
    });
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

const pendingOf = async (pool: pg.Pool, runId: string) =>
  (
    await pool.query<Pending>(
      'select request_id, name, action from runledger.approval_inbox where run_id = $1 order by requested_at, request_id',
      [runId],
    )
  ).rows.map((p) => ({ ...p, action: cliPayloads().decodeNote(p.action) })); // an encrypted action, decrypted with RUNLEDGER_KEYS

const list = (pending: Pending[]) => pending.map((p) => `${p.request_id} (${p.action}, step ${p.name})`).join(', ');

/** --run: the run's one pending request; NOT_FOUND without one, AMBIGUOUS with several. */
async function onlyPendingRequest(pool: pg.Pool, runId: string): Promise<string> {
  const pending = await pendingOf(pool, runId);
  if (pending.length === 1) return pending[0]!.request_id;
  if (pending.length > 1) {
    throw new CliError(
      'AMBIGUOUS',
      `run ${runId} has ${pending.length} pending approval requests: ${list(pending)}; decide one: runledger approve REQUEST_ID --by NAME`,
      EXIT_FAILED,
    );
  }
  const run = await pool.query<{ status: string }>('select status from runledger.runs where run_id = $1', [runId]);
  throw new CliError(
    'NOT_FOUND',
    run.rows[0] ? `run ${runId} (${run.rows[0].status}) has no pending approval request` : `run ${runId} not found`,
    EXIT_FAILED,
  );
}

/** A request id that is a run's id: say so, and name the run's pending requests. */
async function refuseRunId(pool: pg.Pool, id: string, notFound: RunledgerError): Promise<void> {
  const run = await pool.query<{ status: string }>('select status from runledger.runs where run_id = $1', [id]);
  if (!run.rows[0]) return;
  const pending = await pendingOf(pool, id);
  const hint =
    pending.length === 0
      ? `it has no pending approval request (${run.rows[0].status})`
      : pending.length === 1
        ? `its pending request is ${list(pending)}: runledger approve ${pending[0]!.request_id} --by NAME, or runledger approve --run ${id} --by NAME`
        : `its pending requests: ${list(pending)}`;
  throw new CliError('NOT_FOUND', `${notFound.message}: ${id} is a run id, not an approval request id; ${hint}`, EXIT_FAILED);
}
