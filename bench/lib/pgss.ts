/**
 * Server time by statement, from pg_stat_statements, over one measured window. Only where
 * the server has the library in shared_preload_libraries (the harness never reconfigures a
 * server given by DATABASE_URL; the embedded one is started with it, see run.ts): elsewhere
 * every figure is null and the report says n/a. pg_stat_statements.track is left at `top`,
 * so a statement is what the client sent (a call of an SQL function counts the function's
 * whole time) and nothing is counted twice. The harness's own probe statements are left out.
 */
import { PROBE_TAG, Probe } from './db.js';

export interface StatementShare {
  /** Share of the database's statement execution time taken by its top statement, in %. */
  topSharePct: number | null;
  /** Same for the top three together. */
  top3SharePct: number | null;
  /** The top statements: share %, calls, mean ms, text (shortened). */
  top: string | null;
  /** Total execution time of every statement of the database over the window, ms. */
  totalMs: number | null;
}

const NONE: StatementShare = { topSharePct: null, top3SharePct: null, top: null, totalMs: null };

export class StatementStats {
  private available = false;
  constructor(private readonly probe: Probe) {}

  /** Resets the database's counters; false when pg_stat_statements is not loaded. */
  async begin(): Promise<boolean> {
    try {
      const loaded = await this.probe.scalar(
        `select count(*)::int from unnest(string_to_array(current_setting('shared_preload_libraries'), ',')) l where trim(l) = 'pg_stat_statements'`,
      );
      if (loaded === 0) return (this.available = false);
      await this.probe.query('create extension if not exists pg_stat_statements');
      await this.probe.query('select pg_stat_statements_reset(0, (select oid from pg_database where datname = current_database()), 0)');
      return (this.available = true);
    } catch {
      return (this.available = false);
    }
  }

  async end(): Promise<StatementShare> {
    if (!this.available) return NONE;
    const { rows } = await this.probe.query<{ query: string; calls: string; total: number; mean: number }>(
      `select query, calls, total_exec_time as total, mean_exec_time as mean from pg_stat_statements
        where dbid = (select oid from pg_database where datname = current_database())
          and query not like '%pg_stat_statements%' and query not like $1
        order by total_exec_time desc`,
      [`${PROBE_TAG}%`],
    );
    const total = rows.reduce((sum, r) => sum + Number(r.total), 0);
    if (total <= 0) return NONE;
    const share = (ms: number) => Math.round((ms / total) * 1000) / 10;
    const top = rows.slice(0, 3);
    return {
      topSharePct: share(Number(top[0]!.total)),
      top3SharePct: share(top.reduce((sum, r) => sum + Number(r.total), 0)),
      top: top
        .map((r) => `${share(Number(r.total))}% ×${r.calls} ${Number(r.mean).toFixed(2)} ms: ${r.query.replace(/\s+/g, ' ').slice(0, 140)}`)
        .join(' | '),
      totalMs: Math.round(total),
    };
  }
}

/** Metric rows every measured figure carries. */
export const STATEMENT_METRICS = [
  { key: 'topSharePct', label: 'top statement, % of server time', better: 'lower' as const, digits: 1, noRatio: true },
  { key: 'top3SharePct', label: 'top 3 statements, % of server time', better: 'lower' as const, digits: 1, noRatio: true },
];
