import { ago, print, printJson, timestamp } from '../format.js';
import { JSON_OPTION, intOption, limitOption, parse, withPool, type Command } from '../shared.js';

interface UnknownRow {
  operation_id: string;
  run_id: string;
  workflow_name: string;
  name: string;
  idempotency_key: string;
  attempts: number;
  started_at: Date;
  unknown_since: Date;
  run_status: string;
  wait_kind: string | null;
}

/**
 * Reads the runledger.unknown_operations view: external calls that may or may not
 * have happened (the worker died between the call and recording its outcome). Ask
 * the outside system with the idempotency key, then settle with `runledger resolve`.
 */
export const unknown: Command = {
  summary: 'external operations whose outcome is UNKNOWN, waiting for reconcile or an operator',
  usage: 'runledger unknown [--limit N (default 50)] [--json]',
  examples: ['runledger unknown', "runledger unknown --json | jq -r '.[] | [.operation_id, .idempotency_key] | @tsv'"],
  async run(args) {
    const parsed = parse(unknown, args, { limit: limitOption(50, 'operations, the oldest first'), json: JSON_OPTION });
    if (!parsed) return;
    const limit = intOption(parsed.values, 'limit', 1) ?? 50;
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<UnknownRow>(
        'select * from runledger.unknown_operations order by unknown_since, operation_id limit $1',
        [limit],
      );
      return result.rows;
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print('no operations with an unknown outcome');
      return;
    }
    for (const r of rows) {
      print(`operation ${r.operation_id}  ${r.name}  UNKNOWN since ${ago(r.unknown_since)}`);
      print(`  run        ${r.run_id} (${r.workflow_name}, ${r.run_status}${r.wait_kind ? `, waiting for ${r.wait_kind}` : ''})`);
      print(`  key        ${r.idempotency_key}`);
      print(`  attempts   ${r.attempts}, first started ${timestamp(r.started_at)}`);
      print();
    }
    print('check the outside system with the key, then: runledger resolve OPERATION_ID --status SUCCEEDED|FAILED [--result JSON]');
  },
};
