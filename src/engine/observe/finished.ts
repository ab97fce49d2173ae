import type pg from 'pg';
import { TERMINAL_STATUSES, type EngineMetrics, type FinishedRun } from './metrics.js';

/** The columns a FinishedRun is read with, from runledger.runs aliased r. */
export const FINISHED_RUN_COLUMNS =
  'r.run_id, r.workflow_name, r.workflow_version, r.status, r.termination_reason, ' +
  'extract(epoch from r.finished_at - r.created_at)::float8 as duration_s, ' +
  "r.version_manifest->>'runtime' as runtime, r.version_manifest->'manifest' as manifest, " +
  "(r.budget_used->>'cost_usd')::float8 as cost_usd, (r.budget_used->>'tokens')::float8 as tokens, " +
  "coalesce(r.termination_evidence ? 'verification', false) as verified";

const LOOKUP_SQL =
  `select ${FINISHED_RUN_COLUMNS} from runledger.runs r where r.run_id = any($1::text[]) ` +
  `and r.status in (${TERMINAL_STATUSES.map((s) => `'${s}'`).join(', ')})`;

/**
 * How the runs a worker's terminal writes ended, for runledger.runs.finished: the final
 * status and reason are the database's (a charge over budget or a stop_record can change
 * what the write asked for), read by primary key after the write committed, many runs per
 * query and never in the execution's way: at most one lookup in flight, the runs ended
 * meanwhile go in the next. A lookup that fails loses those runs' counts, nothing else.
 */
export class FinishedLookup {
  private queued = new Map<string, string | undefined>();
  private running: Promise<void> | undefined;

  constructor(
    private readonly pool: pg.Pool,
    private readonly metrics: EngineMetrics,
  ) {}

  /** The run's terminal write committed; `onlyReason`: count it only if it ended with this reason. */
  ended(runId: string, onlyReason?: string): void {
    this.queued.set(runId, onlyReason);
    this.running ??= this.drain().finally(() => (this.running = undefined));
  }

  /** Waits for the lookups under way (a worker's stop, before the pool ends). */
  async settled(): Promise<void> {
    while (this.running) await this.running;
  }

  private async drain(): Promise<void> {
    // One turn later: the runs that end in the same turn share the query.
    await new Promise<void>((resolve) => setImmediate(resolve));
    while (this.queued.size > 0) {
      const batch = this.queued;
      this.queued = new Map();
      try {
        const { rows } = await this.pool.query<FinishedRun & { run_id: string }>(LOOKUP_SQL, [[...batch.keys()]]);
        for (const row of rows) {
          const onlyReason = batch.get(row.run_id);
          if (onlyReason === undefined || row.termination_reason === onlyReason) this.metrics.runFinished(row);
        }
      } catch {
        // Metrics never fail a run; the pool's own guard logs a lost connection.
      }
    }
  }
}
