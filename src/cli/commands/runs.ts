import { RUN_STATES, type RunStatus } from '../../engine/core/states.js';
import { ago, print, printJson, renderTable } from '../format.js';
import { CliError, JSON_OPTION, intOption, limitOption, parse, withPool, type Command, cliIo } from '../shared.js';

/** How far `runs` counts the runs that match beyond the page: a bounded count, never a full one. */
export const COUNT_BEYOND = 1000;

interface RunRow {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  status: string;
  termination_reason: string | null;
  wait_kind: string | null;
  queue_name: string;
  idempotency_key: string | null;
  parent_run_id: string | null;
  tenant_id: string | null;
  created_at: Date;
  started_at: Date | null;
  finished_at: Date | null;
}

export const runs: Command = {
  summary: 'list runs, newest first',
  usage: 'runledger runs [--status S[,S...]] [--workflow W] [--limit N (default 20)] [--stranded] [--json]',
  details:
    'When more runs match than --limit, a last line says how many: "showing 20 of 23 runs", counted up to\n' +
    `--limit + ${COUNT_BEYOND} ("of more than ..." beyond that), so it stays cheap on a large table. With --json it goes to stderr.`,
  examples: [
    'runledger runs',
    'runledger runs --status failed,dead_letter --limit 100',
    'runledger runs --workflow order --json | jq -r \'.[] | select(.status == "WAITING") | .run_id\'',
    'runledger runs --stranded',
  ],
  async run(args) {
    const parsed = parse(runs, args, {
      status: {
        type: 'string',
        value: 'S[,S...]',
        help: `only runs in these statuses, comma-separated, any case: ${RUN_STATES.join(', ')}`,
      },
      workflow: { type: 'string', value: 'W', help: 'only runs of this workflow' },
      limit: limitOption(20, 'runs, up to 10000'),
      stranded: { type: 'boolean', help: 'PENDING or WAITING runs whose version no live worker serves (runledger.stranded_runs)' },
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const { values } = parsed;
    const limit = Math.min(intOption(values, 'limit', 1) ?? 20, 10_000);
    if (values.stranded) return printStranded(values, limit);
    const statuses = parseStatuses(values.status as string | undefined) ?? null;
    const workflow = (values.workflow as string | undefined) ?? null;
    const { list, matching } = await withPool(values, async (pool) => {
      const filter = '($1::runledger.run_status[] is null or status = any($1)) and ($2::text is null or workflow_name = $2)';
      const page = await pool.query<RunRow>(
        `select run_id, workflow_name, workflow_version, status, termination_reason, wait_kind, queue_name,
                idempotency_key, parent_run_id, tenant_id, created_at, started_at, finished_at
           from runledger.runs where ${filter}
          order by created_at desc, run_id desc limit $3`,
        [statuses, workflow, limit],
      );
      if (page.rows.length < limit) return { list: page.rows, matching: page.rows.length };
      // A full page: count what else matches, reading at most COUNT_BEYOND more rows.
      const counted = await pool.query<{ n: number }>(
        `select count(*)::int as n from (select 1 from runledger.runs where ${filter} limit $3) matching`,
        [statuses, workflow, limit + COUNT_BEYOND + 1],
      );
      return { list: page.rows, matching: counted.rows[0]!.n };
    });
    const more =
      matching > list.length
        ? `showing ${list.length} of ${matching > limit + COUNT_BEYOND ? `more than ${limit + COUNT_BEYOND}` : matching} runs; --limit N for more`
        : undefined;
    if (values.json) {
      printJson(list);
      if (more) cliIo().stderr.write(`${more}\n`);
      return;
    }
    if (list.length === 0) {
      print('no runs');
      return;
    }
    const rows = list.map((run) => [
      run.run_id,
      `${run.workflow_name}@${run.workflow_version}`,
      run.status,
      run.termination_reason ?? (run.wait_kind ? `waits: ${run.wait_kind}` : '-'),
      ago(run.created_at),
    ]);
    print(renderTable(['RUN ID', 'WORKFLOW', 'STATUS', 'REASON', 'CREATED'], rows, { shrink: [1, 3] }));
    if (more) print(more);
  },
};

interface StrandedRow {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  status: string;
  wait_kind: string | null;
  created_at: Date;
  served_versions: string[] | null;
}

/** runledger.stranded_runs: runs that wait for a worker of their version, with the versions that are served. */
async function printStranded(values: Record<string, string | boolean | string[] | boolean[] | undefined>, limit: number): Promise<void> {
  const rows = await withPool(values, async (pool) => {
    const result = await pool.query<StrandedRow>(
      `select run_id, workflow_name, workflow_version, status, wait_kind, created_at, served_versions
         from runledger.stranded_runs where $1::text is null or workflow_name = $1
        order by created_at limit $2`,
      [values.workflow ?? null, Math.min(limit, 10_000)],
    );
    return result.rows;
  });
  if (values.json) {
    printJson(rows);
    return;
  }
  if (rows.length === 0) {
    print('no stranded runs: every PENDING or WAITING run has a live worker of its version');
    return;
  }
  const table = rows.map((r) => [
    r.run_id,
    `${r.workflow_name}@${r.workflow_version}`,
    r.wait_kind ? `${r.status} (${r.wait_kind})` : r.status,
    r.served_versions?.join(',') || 'none',
    ago(r.created_at),
  ]);
  print(renderTable(['RUN ID', 'WORKFLOW', 'STATUS', 'LIVE WORKERS SERVE', 'CREATED'], table, { shrink: [1] }));
}

/** Case-insensitive and comma-separated, so `--status failed,dead_letter` works. */
function parseStatuses(raw: string | undefined): RunStatus[] | undefined {
  if (raw === undefined) return undefined;
  const statuses = raw
    .split(',')
    .map((s) => s.trim().toUpperCase())
    .filter(Boolean);
  for (const status of statuses) {
    if (!(RUN_STATES as readonly string[]).includes(status)) {
      throw new CliError('USAGE', `unknown status ${JSON.stringify(status)}; one of ${RUN_STATES.join(', ')}`);
    }
  }
  return statuses as RunStatus[];
}
