import { RUN_STATES, type RunStatus } from '../../engine/core/states.js';
import { ago, print, renderTable } from '../format.js';
import { CliError, intOption, parse, withEngine, withPool, type Command } from '../shared.js';

export const runs: Command = {
  summary: 'list runs, newest first',
  usage:
    'runledger runs [--status S[,S...]] [--workflow W] [--limit N (default 20)] [--stranded (PENDING or WAITING runs no live worker serves)]',
  async run(args) {
    const parsed = parse(runs, args, {
      status: { type: 'string' },
      workflow: { type: 'string' },
      limit: { type: 'string' },
      stranded: { type: 'boolean' },
    });
    if (!parsed) return;
    const { values } = parsed;
    const limit = intOption(values, 'limit', 1) ?? 20;
    if (values.stranded) return printStranded(values, limit);
    const statuses = parseStatuses(values.status as string | undefined);
    const list = await withEngine(values, (engine) =>
      engine.listRuns({ status: statuses, workflow: values.workflow as string | undefined, limit: Math.min(limit, 10_000) }),
    );
    if (list.length === 0) {
      print('no runs');
      return;
    }
    const rows = list.map((run) => [
      run.runId,
      `${run.workflowName}@${run.workflowVersion}`,
      run.status,
      run.terminationReason ?? (run.waitKind ? `waits: ${run.waitKind}` : '-'),
      ago(run.createdAt),
    ]);
    print(renderTable(['RUN ID', 'WORKFLOW', 'STATUS', 'REASON', 'CREATED'], rows, { shrink: [1, 3] }));
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
