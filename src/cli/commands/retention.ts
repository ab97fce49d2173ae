import { pgCode } from '../../engine/db/pg-errors.js';
import { PER_WORKFLOW_KINDS, RETENTION_KINDS, type RetentionKind } from '../../engine/core/retention.js';
import { ago, print, printJson, renderTable } from '../format.js';
import { CliError, JSON_OPTION, parse, withPool, type Command } from '../shared.js';

/** PostgreSQL's "that is not an interval" SQLSTATEs: a typo in the interval is a usage error. */
const BAD_INTERVAL = ['22007', '22008', '22P02', '22015'];

interface RuleRow {
  kind: string;
  workflow_name: string | null;
  keep: string | null;
  updated_at: Date;
}

function kindArgument(raw: string | undefined): RetentionKind {
  if (!raw || !(RETENTION_KINDS as readonly string[]).includes(raw)) {
    throw new CliError('USAGE', `KIND must be one of ${RETENTION_KINDS.join(', ')}, got ${JSON.stringify(raw ?? '')}`);
  }
  return raw as RetentionKind;
}

/** runledger.retention: show the rules, set one (runledger.set_retention), clear one (runledger.clear_retention). */
export const retention: Command = {
  summary: 'how long each kind of finished data is kept (runledger.retention): show, set or clear a rule',
  usage:
    'runledger retention [--json]  |  runledger retention set KIND INTERVAL|forever [--workflow NAME]  |  runledger retention clear KIND [--workflow NAME]',
  args: [
    ['KIND', RETENTION_KINDS.join(', ')],
    ['INTERVAL', "a PostgreSQL interval ('30 days', '12h'), or forever"],
  ],
  details: [
    'A rule keeps KIND for INTERVAL after a run finished (session_entries: after the session was last used; audit_log:',
    'after the record was written), for one workflow (--workflow) or as the default for the others. No rule: kept',
    'forever. The workers apply the rules on their own (retentionIntervalMs, default every 10 minutes); runledger prune',
    'applies them now and runledger prune --dry-run shows what they would remove. idempotency: once a key is cleared,',
    'a start with the same key makes a new run. See docs/retention.md.',
  ].join('\n'),
  examples: [
    'runledger retention',
    'runledger retention --json',
    "runledger retention set runs '30 days'",
    "runledger retention set events '7 days'",
    "runledger retention set runs '1 year' --workflow refund",
    'runledger retention set idempotency forever --workflow payments',
    'runledger retention clear runs --workflow refund',
  ],
  async run(args) {
    const parsed = parse(
      retention,
      args,
      {
        workflow: { type: 'string', value: 'NAME', help: 'the workflow the rule is for (default: every workflow without its own rule)' },
        json: JSON_OPTION,
      },
      { max: 3 },
    );
    if (!parsed) return;
    const [action = 'show', ...rest] = parsed.positionals;
    const workflow = (parsed.values.workflow as string | undefined) ?? null;
    if (action === 'show') {
      if (rest.length > 0 || workflow !== null) throw new CliError('USAGE', `show takes no argument\nusage: ${retention.usage}`);
      const rows = await withPool(parsed.values, async (pool) => {
        const result = await pool.query<RuleRow>(
          `select kind, workflow_name, keep::text as keep, updated_at from runledger.retention
            order by array_position($1::text[], kind), workflow_name nulls first`,
          [RETENTION_KINDS],
        );
        return result.rows;
      });
      if (parsed.values.json) {
        printJson(rows);
        return;
      }
      if (rows.length === 0) {
        print('no retention rules: everything is kept forever (runledger retention set KIND INTERVAL)');
        return;
      }
      print(
        renderTable(
          ['KIND', 'WORKFLOW', 'KEEP', 'SET'],
          rows.map((r) => [r.kind, r.workflow_name ?? '(default)', r.keep ?? 'forever', ago(r.updated_at)]),
        ),
      );
      return;
    }
    if (action !== 'set' && action !== 'clear') {
      throw new CliError('USAGE', `unknown action ${JSON.stringify(action)}: show, set or clear\nusage: ${retention.usage}`);
    }
    if (parsed.values.json) throw new CliError('USAGE', '--json applies to the rules shown (runledger retention --json)');
    const kind = kindArgument(rest[0]);
    if (workflow !== null && !PER_WORKFLOW_KINDS.includes(kind)) {
      throw new CliError('USAGE', `${kind} is not kept per workflow: give no --workflow`);
    }
    if (action === 'clear') {
      if (rest.length !== 1) throw new CliError('USAGE', `clear takes KIND only\nusage: ${retention.usage}`);
      const found = await withPool(parsed.values, async (pool) => {
        const result = await pool.query('select runledger.clear_retention(p_kind => $1, p_workflow_name => $2) as found', [kind, workflow]);
        return result.rows[0].found as boolean;
      });
      const whose = workflow ? `workflow ${workflow}` : 'the default';
      print(found ? `cleared the ${kind} rule of ${whose}` : `there was no ${kind} rule for ${whose}: nothing changed`);
      return;
    }
    if (rest.length !== 2) throw new CliError('USAGE', `set takes KIND and INTERVAL (or forever)\nusage: ${retention.usage}`);
    const keep = rest[1] === 'forever' ? null : rest[1]!;
    await withPool(parsed.values, async (pool) => {
      try {
        await pool.query('select runledger.set_retention(p_kind => $1, p_keep => $2::interval, p_workflow_name => $3)', [
          kind,
          keep,
          workflow,
        ]);
      } catch (error) {
        if (BAD_INTERVAL.includes(pgCode(error) ?? '')) {
          throw new CliError('USAGE', `${JSON.stringify(keep)} is not a PostgreSQL interval (e.g. '30 days', '12h') nor forever`);
        }
        throw error;
      }
    });
    print(
      `${kind} of ${workflow ? `workflow ${workflow}` : 'every workflow without its own rule'}: kept ${keep === null ? 'forever' : `for ${keep}`}`,
    );
  },
};
