import { ago, print, printJson, renderTable } from '../format.js';
import { JSON_OPTION, parse, withPool, type Command } from '../shared.js';

interface VersionRow {
  workflow_name: string;
  workflow_version: string;
  runtime: string | null;
  runs: string;
  active: string;
  statuses: Record<string, number>;
  oldest_waiting_since: Date | null;
  live_workers: string;
}

/** runledger.version_stats: which versions still have runs, and whether a live worker serves them. */
export const versions: Command = {
  summary: 'runs per workflow version and runtime: active, per status, oldest waiting, live workers',
  usage: 'runledger versions [--workflow W] [--json]',
  examples: ['runledger versions', 'runledger versions --workflow order --json'],
  async run(args) {
    const parsed = parse(versions, args, {
      workflow: { type: 'string', value: 'W', help: 'only the versions of this workflow' },
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<VersionRow>(
        `select * from runledger.version_stats where $1::text is null or workflow_name = $1
          order by workflow_name, workflow_version, runtime`,
        [parsed.values.workflow ?? null],
      );
      return result.rows;
    });
    if (parsed.values.json) {
      printJson(rows.map((r) => ({ ...r, runs: Number(r.runs), active: Number(r.active), live_workers: Number(r.live_workers) })));
      return;
    }
    if (rows.length === 0) {
      print('no runs yet');
      return;
    }
    const table = rows.map((r) => [
      `${r.workflow_name}@${r.workflow_version}`,
      r.runtime ?? '-',
      r.runs,
      r.active,
      Object.entries(r.statuses)
        .map(([status, n]) => `${status.toLowerCase()} ${n}`)
        .join(', '),
      r.oldest_waiting_since ? ago(r.oldest_waiting_since) : '-',
      Number(r.live_workers) === 0 && Number(r.active) > 0 ? '0 (stranded)' : r.live_workers,
    ]);
    print(
      renderTable(['VERSION', 'RUNTIME', 'RUNS', 'ACTIVE', 'BY STATUS', 'OLDEST WAITING', 'LIVE WORKERS'], table, {
        shrink: [4],
        right: [2, 3],
      }),
    );
  },
};
