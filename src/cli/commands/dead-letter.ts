import { ago, print, renderTable, shortJson } from '../format.js';
import { intOption, parse, withEngine, type Command } from '../shared.js';

interface DeadRow {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  termination_reason: string | null;
  termination_evidence: unknown;
  terminated_at: Date | null;
  recovery_attempts: number;
  max_recovery_attempts: number;
  steps_done: string;
}

/** Reads the runledger.dead_letter view, the same rows an operator sees in psql. */
export const deadLetter: Command = {
  summary: 'runs parked out of the automatic path, with why',
  usage: 'runledger dead-letter [--limit N (default 50)]',
  async run(args) {
    const parsed = parse(deadLetter, args, { limit: { type: 'string' } });
    if (!parsed) return;
    const limit = intOption(parsed.values, 'limit', 1) ?? 50;
    const rows = await withEngine(parsed.values, async (engine) => {
      const result = await engine.pool.query<DeadRow>(
        'select * from runledger.dead_letter order by terminated_at desc nulls last, run_id desc limit $1',
        [limit],
      );
      return result.rows;
    });
    if (rows.length === 0) {
      print('no dead-lettered runs');
      return;
    }
    const table = rows.map((r) => [
      r.run_id,
      `${r.workflow_name}@${r.workflow_version}`,
      r.termination_reason ?? '-',
      `${r.recovery_attempts}/${r.max_recovery_attempts}`,
      String(r.steps_done),
      ago(r.terminated_at),
      shortJson(r.termination_evidence, 300),
    ]);
    print(renderTable(['RUN ID', 'WORKFLOW', 'REASON', 'RECOV', 'STEPS', 'WHEN', 'EVIDENCE'], table, { shrink: [6, 1], right: [3, 4] }));
    print(`\nbring one back with: runledger retry RUN_ID`);
  },
};
