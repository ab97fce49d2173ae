import { ago, print, renderTable } from '../format.js';
import { parse, withPool, type Command } from '../shared.js';

interface WorkerRow {
  worker_id: string;
  queues: string[];
  workflows: string[];
  concurrency: number;
  lease_ms: number;
  last_heartbeat_at: Date;
  stopped_at: Date | null;
  silent: boolean;
}

/**
 * Worker rows with a state a person can act on: `live`, `stopped`, or `silent`
 * (no heartbeat for longer than its lease: dead, its runs are being recovered).
 */
export const workers: Command = {
  summary: 'worker processes: what they serve and when they were last heard from',
  usage: 'runledger workers [--all (include stopped workers)]',
  async run(args) {
    const parsed = parse(workers, args, { all: { type: 'boolean' } });
    if (!parsed) return;
    const all = Boolean(parsed.values.all);
    const rows = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<WorkerRow>(
        `select w.*, w.last_heartbeat_at < runledger.now() - make_interval(secs => w.lease_ms / 1000.0) as silent
           from runledger.workers w
          where $1 or w.stopped_at is null
          order by w.stopped_at is null desc, w.last_heartbeat_at desc
          limit 100`,
        [all],
      );
      return result.rows;
    });
    if (rows.length === 0) {
      print(all ? 'no workers have registered yet' : 'no live workers (runledger workers --all shows stopped ones)');
      return;
    }
    const table = rows.map((w) => [
      w.worker_id,
      w.stopped_at ? 'stopped' : w.silent ? 'silent' : 'live',
      ago(w.stopped_at ?? w.last_heartbeat_at),
      String(w.concurrency),
      w.queues.join(','),
      w.workflows.join(','),
    ]);
    // The id is left whole (it is what you grep logs for); it already holds host and pid.
    print(renderTable(['WORKER', 'STATE', 'SEEN', 'CONC', 'QUEUES', 'SERVES'], table, { shrink: [5, 4], right: [3] }));
    const stranded = await withPool(parsed.values, async (pool) => {
      const result = await pool.query<{ version: string; n: string }>(
        `select workflow_name || '@' || workflow_version as version, count(*) as n
           from runledger.stranded_runs group by 1 order by 1`,
      );
      return result.rows;
    });
    for (const row of stranded) {
      print(`warning: ${row.n} run(s) of ${row.version} wait for a worker: no live worker serves that version (runledger runs --stranded)`);
    }
  },
};
