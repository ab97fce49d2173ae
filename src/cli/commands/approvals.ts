import { ago, print, printJson, screenWidth, shortJson, timestamp, wrap } from '../format.js';
import { JSON_OPTION, cliPayloads, intOption, limitOption, parse, withPool, type Command } from '../shared.js';

interface InboxRow {
  request_id: string;
  run_id: string;
  workflow_name: string;
  name: string;
  action: string;
  evidence: unknown;
  approvers: string[] | null;
  requested_at: Date;
  expires_at: Date | null;
}

/**
 * Reads the runledger.approval_inbox view. One block per request rather than a
 * table: the evidence is what an approver decides on, so it is shown, not cut.
 */
export const approvals: Command = {
  summary: 'pending approval requests: action, evidence, who may decide, until when',
  usage: 'runledger approvals [--run RUN_ID] [--limit N (default 50)] [--json]',
  examples: [
    'runledger approvals',
    'runledger approvals --run 01J9Z3K4X8Q2W5E7R1T6Y0U3IO',
    "runledger approvals --json | jq -r '.[].request_id'",
  ],
  async run(args) {
    const parsed = parse(approvals, args, {
      run: { type: 'string', value: 'RUN_ID', help: "only this run's pending requests" },
      limit: limitOption(50, 'requests, the oldest first'),
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const limit = intOption(parsed.values, 'limit', 1) ?? 50;
    const payloads = cliPayloads();
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<InboxRow>(
        `select * from runledger.approval_inbox where $1::text is null or run_id = $1
          order by requested_at, request_id limit $2`,
        [parsed.values.run ?? null, limit],
      );
      // The action and evidence stored encrypted are shown decrypted with RUNLEDGER_KEYS, as the envelope without.
      return result.rows.map((row) => ({ ...row, action: payloads.decodeNote(row.action), evidence: payloads.decode(row.evidence) }));
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print('no pending approval requests');
      return;
    }
    for (const r of rows) {
      print(`request ${r.request_id}  ${r.action}`);
      print(`  run        ${r.run_id} (${r.workflow_name}, step ${r.name})`);
      print(`  approvers  ${r.approvers && r.approvers.length > 0 ? r.approvers.join(', ') : 'anyone'}`);
      print(`  requested  ${timestamp(r.requested_at)} (${ago(r.requested_at)})${r.expires_at ? `, expires ${ago(r.expires_at)}` : ''}`);
      wrap(shortJson(r.evidence, Infinity), screenWidth() - 13, 6).forEach((part, i) =>
        print(`  ${(i === 0 ? 'evidence' : '').padEnd(11)}${part}`),
      );
      print();
    }
    print('decide: runledger approve REQUEST_ID --by NAME [--reject] [--note TEXT]   (or --run RUN_ID for a run with one request)');
  },
};
