import { ago, print, printJson, renderTable } from '../format.js';
import { CliError, JSON_OPTION, intOption, limitOption, parse, withPool, type Command } from '../shared.js';
import { WAIT_KINDS } from '../../engine/core/states.js';

interface WaitingRow {
  run_id: string;
  workflow_name: string;
  wait_kind: string;
  waiting_for: string;
  step_name: string | null;
  since: Date | null;
  until: Date | null;
}

/** Reads the runledger.waiting view: runs that wait holding no worker, and what would wake them. */
export const waiting: Command = {
  summary: 'runs waiting (timer, signal, approval, child, retry, reconcile), holding no worker',
  usage: `runledger waiting [--kind ${WAIT_KINDS.join('|')}] [--limit N (default 50)] [--json]`,
  examples: [
    'runledger waiting',
    'runledger waiting --kind approval',
    "runledger waiting --json | jq 'group_by(.wait_kind) | map({(.[0].wait_kind): length}) | add'",
  ],
  async run(args) {
    const parsed = parse(waiting, args, {
      kind: { type: 'string', value: 'K', help: `only runs waiting for this: ${WAIT_KINDS.join(', ')}` },
      limit: limitOption(50, 'runs, the longest waiting first'),
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const limit = intOption(parsed.values, 'limit', 1) ?? 50;
    const kind = parsed.values.kind as string | undefined;
    if (kind !== undefined && !(WAIT_KINDS as readonly string[]).includes(kind))
      throw new CliError('USAGE', `--kind must be one of ${WAIT_KINDS.join(', ')}, got ${JSON.stringify(kind)}`);
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<WaitingRow>(
        `select run_id, workflow_name, wait_kind, waiting_for, step_name, since, until
           from runledger.waiting where $1::text is null or wait_kind = $1
          order by since nulls last, run_id limit $2`,
        [kind ?? null, limit],
      );
      return result.rows;
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print(kind ? `no runs waiting for ${kind}` : 'no runs waiting');
      return;
    }
    const table = rows.map((r) => [
      r.run_id,
      r.workflow_name,
      r.waiting_for,
      r.step_name ?? '-',
      ago(r.since),
      r.until ? ago(r.until) : 'no timeout',
    ]);
    print(renderTable(['RUN ID', 'WORKFLOW', 'WAITING FOR', 'STEP', 'SINCE', 'UNTIL'], table, { shrink: [3, 1] }));
    print('\nsignal: runledger signal RUN_ID TOPIC [JSON]    approval: runledger approvals    cancel: runledger cancel RUN_ID');
  },
};
