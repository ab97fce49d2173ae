import { WORKER_STATE_SQL } from '../../engine/client/reads.js';
import { ago, print, printJson, renderTable } from '../format.js';
import { JSON_OPTION, parse, withPool, type Command } from '../shared.js';

export type WorkerState = 'live' | 'lost' | 'stopped';

interface WorkerRow {
  worker_id: string;
  host: string;
  pid: number;
  queues: string[];
  workflows: string[];
  migrations: string[];
  concurrency: number;
  lease_ms: number;
  started_at: Date;
  last_heartbeat_at: Date;
  stopped_at: Date | null;
  state: WorkerState;
}

/** Worker rows with a state a person can act on: live, lost (dead without stopping) or stopped. */
export const workers: Command = {
  summary: 'worker processes: live, lost (silent past their lease, never stopped) or stopped; what they serve',
  usage: 'runledger workers [--all] [--json]',
  details:
    'live: heard from within its lease. lost: silent for longer than its lease and never stopped (killed, crashed, cut off);\n' +
    'other workers recover its runs. stopped: stopped gracefully (Ctrl-C, SIGTERM, running.stop()). Without --all,\n' +
    'stopped workers are left out. `runledger prune` deletes the rows of workers stopped (or marked stopped by the sweep) before its cutoff.',
  examples: [
    'runledger workers',
    'runledger workers --all',
    'runledger workers --json | jq -r \'.[] | select(.state == "lost") | .worker_id\'',
  ],
  async run(args) {
    const parsed = parse(workers, args, {
      all: { type: 'boolean', help: 'include the workers that stopped gracefully' },
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const all = Boolean(parsed.values.all);
    const { rows, stranded } = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<WorkerRow>(
        `select * from (
           select w.worker_id, w.host, w.pid, w.queues, w.workflows, w.migrations, w.concurrency, w.lease_ms,
                  w.started_at, w.last_heartbeat_at, w.stopped_at, ${WORKER_STATE_SQL} as state
             from runledger.workers w) w
          where $1 or w.state <> 'stopped'
          order by case w.state when 'live' then 0 when 'lost' then 1 else 2 end, w.last_heartbeat_at desc, w.worker_id
          limit 100`,
        [all],
      );
      const strandedRuns = await pool.query<{ version: string; n: string }>(
        `select workflow_name || '@' || workflow_version as version, count(*) as n
           from runledger.stranded_runs group by 1 order by 1`,
      );
      return { rows: result.rows, stranded: strandedRuns.rows };
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print(all ? 'no workers have registered yet' : 'no live workers (runledger workers --all shows stopped ones)');
    } else {
      const table = rows.map((w) => [
        w.worker_id,
        w.state,
        // A stopped worker was last seen when it stopped; a lost one at its last heartbeat (the sweep's stopped_at is not a sighting).
        ago(w.state === 'stopped' ? (w.stopped_at ?? w.last_heartbeat_at) : w.last_heartbeat_at),
        String(w.concurrency),
        w.queues.join(','),
        w.workflows.join(','),
      ]);
      // The id is left whole (it is what you grep logs for); it already holds host and pid.
      print(renderTable(['WORKER', 'STATE', 'SEEN', 'CONC', 'QUEUES', 'SERVES'], table, { shrink: [5, 4], right: [3] }));
      const lost = rows.filter((w) => w.state === 'lost').length;
      if (lost > 0)
        print(`\n${lost} lost: silent past their lease without stopping (killed or crashed); their runs are recovered by live workers`);
    }
    for (const row of stranded) {
      print(`warning: ${row.n} run(s) of ${row.version} wait for a worker: no live worker serves that version (runledger runs --stranded)`);
    }
  },
};
