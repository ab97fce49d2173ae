import { ago, print, printJson, renderTable } from '../format.js';
import { JSON_OPTION, intOption, limitOption, parse, withPool, type Command } from '../shared.js';

interface DeadRow {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  termination_reason: string | null;
  terminated_at: Date | null;
  recovery_attempts: number;
  max_recovery_attempts: number;
  compensations_due: boolean;
}

/** Reads the runledger.dead_letter view, the same rows an operator sees in psql. */
export const deadLetter: Command = {
  summary: 'runs parked out of the automatic path, with why',
  usage: 'runledger dead-letter [--limit N (default 50)] [--json]',
  examples: [
    'runledger dead-letter',
    'runledger dead-letter --json | jq -r \'.[] | select(.termination_reason == "NON_DETERMINISM") | .run_id\'',
  ],
  async run(args) {
    const parsed = parse(deadLetter, args, { limit: limitOption(50, 'runs, the most recent first'), json: JSON_OPTION });
    if (!parsed) return;
    const limit = intOption(parsed.values, 'limit', 1) ?? 50;
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<DeadRow>(
        'select * from runledger.dead_letter order by terminated_at desc nulls last, run_id desc limit $1',
        [limit],
      );
      return result.rows;
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print('no dead-lettered runs');
      return;
    }
    const table = rows.map((r) => [
      r.run_id,
      `${r.workflow_name}@${r.workflow_version}`,
      r.termination_reason ?? '-',
      `${r.recovery_attempts}/${r.max_recovery_attempts}`,
      r.compensations_due ? 'not undone' : '-',
      ago(r.terminated_at),
    ]);
    // Evidence is JSON of any length: it does not fit a row on 80 columns, `show` prints it whole.
    print(renderTable(['RUN ID', 'WORKFLOW', 'REASON', 'RECOVERIES', 'EFFECTS', 'WHEN'], table, { shrink: [1], right: [3] }));
    print('\nevidence and history: runledger show RUN_ID    bring one back: runledger retry RUN_ID');
    print('undo what one did (its compensations): runledger compensate RUN_ID');
  },
};
