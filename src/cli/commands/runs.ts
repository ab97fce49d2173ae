import { RUN_STATES, type RunStatus } from '../../engine/core/states.js';
import { ago, print, renderTable } from '../format.js';
import { CliError, intOption, parse, withEngine, type Command } from '../shared.js';

export const runs: Command = {
  summary: 'list runs, newest first',
  usage: 'runledger runs [--status S[,S...]] [--workflow W] [--limit N (default 20)]',
  async run(args) {
    const parsed = parse(runs, args, { status: { type: 'string' }, workflow: { type: 'string' }, limit: { type: 'string' } });
    if (!parsed) return;
    const { values } = parsed;
    const limit = intOption(values, 'limit', 1) ?? 20;
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
