import { print, printJson, renderTable, shortJson, timestamp } from '../format.js';
import { JSON_OPTION, intOption, limitOption, parse, withPool, type Command } from '../shared.js';

interface AuditRow {
  audit_id: string;
  at: Date;
  action: string;
  run_id: string | null;
  target: string | null;
  asserted_by: string | null;
  db_user: string;
  db_role: string;
  arguments: Record<string, unknown>;
  result: unknown;
}

/** runledger.audit_log: who did what to which run, newest last. */
export const audit: Command = {
  summary: 'the audit log: every operator action, who did it (login, role, the name given), on what, and its result',
  usage: 'runledger audit [--run RUN_ID] [--action ACTION] [--limit N (default 50)] [--json]',
  examples: ['runledger audit --run 01J9Z3K4X8Q2W5E7R1T6Y0U3IO', 'runledger audit --action cancel_run --limit 200 --json'],
  async run(args) {
    const parsed = parse(audit, args, {
      run: { type: 'string', value: 'RUN_ID', help: "only this run's actions" },
      action: { type: 'string', value: 'ACTION', help: 'only this action (the SQL function: cancel_run, decide_approval, ...)' },
      limit: limitOption(50, 'actions, the newest'),
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const limit = intOption(parsed.values, 'limit', 1) ?? 50;
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<AuditRow>(
        `select * from (
           select * from runledger.audit_log a
            where ($1::text is null or a.run_id = $1) and ($2::text is null or a.action = $2)
            order by a.audit_id desc limit $3) newest
          order by audit_id`,
        [parsed.values.run ?? null, parsed.values.action ?? null, limit],
      );
      return result.rows;
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print('no operator actions recorded');
      return;
    }
    const table = rows.map((r) => [
      timestamp(r.at),
      r.action,
      r.run_id ?? '-',
      r.target ?? '-',
      r.asserted_by ? `${r.asserted_by} (${r.db_user}${r.db_role !== r.db_user ? ` as ${r.db_role}` : ''})` : r.db_user,
      shortJson(r.arguments, 200),
      shortJson(r.result, 200),
    ]);
    print(renderTable(['AT', 'ACTION', 'RUN', 'TARGET', 'BY', 'ARGUMENTS', 'RESULT'], table, { shrink: [5, 6] }));
  },
};
