/**
 * "Database with history": what a database that has been in use holds, loaded into each
 * system's own tables by set-based SQL (one statement per table, no ANALYZE afterwards),
 * while the system's worker runs. The shapes were copied from rows each system wrote
 * itself on a real database (columns, JSON encodings, timestamps); where a system writes
 * a value we cannot predict (runledger's policy_version, DBOS's application_version) it is
 * copied from a row the warm-up wrote.
 *
 * - runledger: `finished` SUCCEEDED runs of the benchmark's workflow over the last 7 days,
 *   each with 3 SUCCEEDED steps and 3 events (created, claimed, completed); `waiting`
 *   WAITING runs of another workflow, half on a signal, half on a timer a day away, each
 *   with its first step done, its wait step and 3 events (created, claimed, wait_started).
 * - DBOS: `finished` SUCCESS rows in dbos.workflow_status with their workflow_input,
 *   workflow_output and 3 operation_outputs; `waiting` half DELAYED on the benchmark queue
 *   (delay_until a day ahead, as DBOSClient.enqueue with delaySeconds writes them), half
 *   PENDING outside any queue on another executor (a workflow blocked in DBOS.recv there).
 * - graphile-worker deletes completed jobs: its history is `waiting` jobs of the benchmark
 *   task scheduled a day ahead (run_at in the future, added by graphile_worker.add_jobs), and
 *   nothing else (it keeps no finished job).
 * - pg-boss 10 keeps completed jobs in pgboss.job until archiveCompletedAfterSeconds (12 h)
 *   and then in pgboss.archive (7 days): `finished` completed jobs of the benchmark queue
 *   spread over the last 24 hours, those of the last 12 hours in pgboss.job, the older ones
 *   in pgboss.archive (so its maintenance has nothing to move during the measurement); and
 *   `waiting` jobs with start_after a day ahead.
 */
import { config } from './config.js';
import { withAdmin } from './db.js';
import { perSecond } from './stats.js';

export type Family = 'runledger' | 'dbos' | 'graphile-worker' | 'pg-boss';

export function familyOf(systemId: string): Family {
  if (systemId.startsWith('dbos')) return 'dbos';
  if (systemId.startsWith('graphile-worker')) return 'graphile-worker';
  if (systemId.startsWith('pg-boss')) return 'pg-boss';
  return 'runledger';
}

export const HISTORY_DESCRIPTION: Record<Family, string> = {
  runledger: `${config.historyFinished.toLocaleString('en')} SUCCEEDED runs of the benchmark workflow over the last 7 days, each with 3 steps and 3 events; ${config.historyWaiting.toLocaleString('en')} WAITING runs of another workflow (half on a signal, half on a timer a day away), each with 2 steps and 3 events`,
  dbos: `${config.historyFinished.toLocaleString('en')} SUCCESS rows in dbos.workflow_status with workflow_input, workflow_output and 3 operation_outputs each; ${config.historyWaiting.toLocaleString('en')} not runnable now: half DELAYED on the benchmark queue a day ahead, half PENDING (blocked in recv) on another executor`,
  'graphile-worker': `${config.historyWaiting.toLocaleString('en')} jobs of the benchmark task with run_at a day ahead (graphile-worker deletes completed jobs, so that is all it keeps)`,
  'pg-boss': `${config.historyFinished.toLocaleString('en')} completed jobs of the benchmark queue over the last 24 hours (the last 12 hours in pgboss.job, older ones in pgboss.archive, as v10 keeps them); ${config.historyWaiting.toLocaleString('en')} jobs with start_after a day ahead`,
};

const FINISHED = () => config.historyFinished;
const WAITING = () => config.historyWaiting;

function runledgerSql(): string[] {
  const n = FINISHED();
  const w = WAITING();
  return [
    `create temp table tpl as
       select coalesce((select policy_version from runledger.runs where workflow_name = 'bench' and policy_version is not null limit 1), 'limits:3bd1691f4204') as policy,
              coalesce((select version_manifest from runledger.runs where workflow_name = 'bench' limit 1), '{"runtime": "runledger@0.1.0", "checkpointSchema": 1}'::jsonb) as manifest`,
    `insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts, limits)
       values ('bench_hist_wait', '1', 'default', 10, '{}') on conflict do nothing`,
    // finished runs, ids that sort before the ones runledger makes now (as older ULIDs do)
    `create temp table hf as
       select i, '00F' || lpad(i::text, 23, '0') as id, now() - interval '7 days' + i * (interval '7 days' / ${n}) as t
       from generate_series(1, ${n}) i`,
    `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input, output, created_at, updated_at,
                                 started_at, finished_at, fencing_token, version_manifest, termination_reason, termination_evidence,
                                 terminated_at, policy_version)
       select id, 'bench', '1', 'default', 'SUCCEEDED', jsonb_build_object('n', i), 'null'::jsonb, t, t + interval '30 ms',
              t + interval '10 ms', t + interval '30 ms', 1, tpl.manifest, 'COMPLETED', '{"steps": 3, "budget_spent": 0}', t + interval '30 ms', tpl.policy
       from hf, tpl order by i`,
    `insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
       select id, s, chr(97 + s), 'step', 'SUCCEEDED', 'null'::jsonb, 1, t + (12 + 6 * s) * interval '1 ms', t + (13 + 6 * s) * interval '1 ms', 1
       from hf, generate_series(0, 2) s order by i, s`,
    `insert into runledger.events (run_id, at, kind, detail, fencing_token)
       select id, t + e.off * interval '1 ms', e.kind, e.detail, e.token
       from hf, (values (0, 0, 'created', '{"queue": "default", "version": "1", "workflow": "bench"}'::jsonb, null::bigint),
                        (1, 10, 'claimed', '{"worker": "history-worker"}'::jsonb, 1::bigint),
                        (2, 30, 'completed', '{"reason": "COMPLETED", "status": "SUCCEEDED", "evidence": {"steps": 3, "budget_spent": 0}}'::jsonb, 1::bigint))
            as e(k, off, kind, detail, token)
       order by i, e.k`,
    // waiting runs: odd on a signal, even on a timer a day away
    `create temp table hw as
       select i, '00W' || lpad(i::text, 23, '0') as id, now() - interval '1 hour' + i * (interval '1 hour' / ${w}) as t, i % 2 = 1 as on_signal
       from generate_series(1, ${w}) i`,
    `insert into runledger.runs (run_id, workflow_name, workflow_version, queue_name, status, input, created_at, updated_at, started_at,
                                 wake_at, wait_kind, wait_key, fencing_token, version_manifest, policy_version)
       select id, 'bench_hist_wait', '1', 'default', 'WAITING', jsonb_build_object('n', i), t, t + interval '20 ms', t + interval '5 ms',
              case when on_signal then null else now() + interval '1 day' end, case when on_signal then 'signal' else 'timer' end,
              case when on_signal then 'go' end, 1, tpl.manifest, tpl.policy
       from hw, tpl order by i`,
    `insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
       select id, 0, 'a', 'step', 'SUCCEEDED', 'null'::jsonb, 1, t + interval '10 ms', t + interval '11 ms', 1 from hw
       union all
       select id, 1, case when on_signal then 'go' else 'nap' end, case when on_signal then 'signal' else 'sleep' end, 'WAITING',
              case when on_signal then '{"spec": {"topic": "go"}}'::jsonb
                   else jsonb_build_object('spec', jsonb_build_object('timeout_ms', 86400000), 'wake_at', now() + interval '1 day') end,
              1, t + interval '20 ms', t + interval '20 ms', 1 from hw`,
    `insert into runledger.events (run_id, at, kind, detail, fencing_token)
       select id, t, 'created', '{"queue": "default", "version": "1", "workflow": "bench_hist_wait"}'::jsonb, null from hw
       union all select id, t + interval '5 ms', 'claimed', '{"worker": "history-worker"}'::jsonb, 1 from hw
       union all select id, t + interval '20 ms', 'wait_started',
              jsonb_build_object('seq', 1, 'kind', case when on_signal then 'signal' else 'sleep' end, 'name', case when on_signal then 'go' else 'nap' end,
                                 'wake_at', case when on_signal then null else now() + interval '1 day' end), 1 from hw`,
  ];
}

function dbosSql(): string[] {
  const n = FINISHED();
  const w = WAITING();
  const ms = `(extract(epoch from now()) * 1000)::bigint`;
  return [
    `create temp table tpl as
       select coalesce((select application_version from dbos.workflow_status where status = 'SUCCESS' limit 1), '') as app_version`,
    `create temp table hf as
       select i, gen_random_uuid()::text as id, ${ms} - 7 * 86400000::bigint + (i::bigint * 7 * 86400000 / ${n}) as t
       from generate_series(1, ${n}) i`,
    `insert into dbos.workflow_status (workflow_uuid, status, name, authenticated_user, assumed_role, authenticated_roles, executor_id,
                                       created_at, updated_at, application_version, application_id, class_name, config_name, recovery_attempts,
                                       queue_name, started_at_epoch_ms, priority, serialization, completed_at, application_name, creator_xid)
       select id, 'SUCCESS', 'bench', '', '', '[]', 'local', t, t + 40, tpl.app_version, '', '', '', 1, 'bench', t + 20, 0, 'js_superjson', t + 40,
              'bench', gen_random_uuid()::text
       from hf, tpl order by i`,
    `insert into dbos.workflow_input (workflow_uuid, inputs, retention_timestamp)
       select id, '{"json":[' || i || '],"__dbos_serializer":"superjson"}', t from hf order by i`,
    `insert into dbos.workflow_output (workflow_uuid, output, error, retention_timestamp)
       select id, '{"json":null,"__dbos_serializer":"superjson"}', null, t + 40 from hf order by i`,
    `insert into dbos.operation_outputs (workflow_uuid, function_id, function_name, output, started_at_epoch_ms, completed_at_epoch_ms,
                                         serialization, application_name, retention_timestamp)
       select id, f, chr(97 + f), '{"json":null,"meta":{"values":["undefined"]},"__dbos_serializer":"superjson"}', t + 20 + 6 * f, t + 24 + 6 * f,
              'js_superjson', 'bench', t + 25 + 6 * f
       from hf, generate_series(0, 2) f order by i, f`,
    // not runnable now: odd DELAYED on the queue a day ahead, even PENDING in recv on another executor
    `create temp table hw as
       select i, 'history-' || gen_random_uuid()::text as id, ${ms} - 3600000 + (i::bigint * 3600000 / ${w}) as t, i % 2 = 1 as delayed
       from generate_series(1, ${w}) i`,
    `insert into dbos.workflow_status (workflow_uuid, status, name, authenticated_user, assumed_role, authenticated_roles, executor_id,
                                       created_at, updated_at, application_version, application_id, class_name, config_name, recovery_attempts,
                                       queue_name, started_at_epoch_ms, priority, serialization, delay_until_epoch_ms, application_name, creator_xid)
       select id, case when delayed then 'DELAYED' else 'PENDING' end, case when delayed then 'bench' else 'bench_hist_wait' end,
              '', '', '[]', case when delayed then '' else 'history-executor' end, t, t + 20,
              case when delayed then '' else tpl.app_version end, '', '', '', case when delayed then 0 else 1 end,
              case when delayed then 'bench' end, case when delayed then null else t + 5 end, 0, 'js_superjson',
              case when delayed then ${ms} + 86400000 end, 'bench', gen_random_uuid()::text
       from hw, tpl order by i`,
    `insert into dbos.workflow_input (workflow_uuid, inputs, retention_timestamp)
       select id, '{"json":[' || i || '],"__dbos_serializer":"superjson"}', t from hw order by i`,
    `insert into dbos.operation_outputs (workflow_uuid, function_id, function_name, output, started_at_epoch_ms, completed_at_epoch_ms,
                                         serialization, application_name, retention_timestamp)
       select id, 0, 'a', '{"json":null,"meta":{"values":["undefined"]},"__dbos_serializer":"superjson"}', t + 8, t + 10, 'js_superjson', 'bench', t + 11
       from hw where not delayed order by i`,
  ];
}

function graphileSql(): string[] {
  const w = WAITING();
  return [
    `select count(*) from graphile_worker.add_jobs(array(
       select row('bench', json_build_object('n', i, 's', 0), null, now() + interval '1 day' + i * interval '1 ms', null, null, null, null)::graphile_worker.job_spec
       from generate_series(1, ${w}) i))`,
  ];
}

function pgBossSql(): string[] {
  const n = FINISHED();
  const w = WAITING();
  const cols = `id, name, priority, data, state, retry_limit, retry_count, retry_delay, retry_backoff, start_after, started_on, expire_in,
                created_on, completed_on, keep_until, policy`;
  const select = `gen_random_uuid(), 'bench', 0, jsonb_build_object('n', i, 's', i % 3), 'completed', 2, 0, 0, false, t, t + interval '10 ms',
                  interval '15 minutes', t, t + interval '20 ms', t + interval '14 days', 'standard'`;
  return [
    `create temp table hf as select i, now() - interval '24 hours' + i * (interval '24 hours' / ${n}) as t from generate_series(1, ${n}) i`,
    `insert into pgboss.archive (${cols}, archived_on)
       select ${select}, t + interval '12 hours' from hf where t < now() - interval '12 hours' order by i`,
    `insert into pgboss.job (${cols}) select ${select} from hf where t >= now() - interval '12 hours' order by i`,
    `insert into pgboss.job (name, data, start_after, policy)
       select 'bench', jsonb_build_object('n', i, 's', 0), now() + interval '1 day', 'standard' from generate_series(1, ${w}) i`,
  ];
}

const SQL: Record<Family, () => string[]> = {
  runledger: runledgerSql,
  dbos: dbosSql,
  'graphile-worker': graphileSql,
  'pg-boss': pgBossSql,
};

/** SQL counting the history's waiting rows that are still waiting (they must all be, after the measurement). */
export const WAITING_SQL: Record<Family, string> = {
  runledger: `select count(*)::int from runledger.runs where workflow_name = 'bench_hist_wait' and status = 'WAITING'`,
  dbos: `select count(*)::int from dbos.workflow_status where workflow_uuid like 'history-%' and status in ('DELAYED', 'PENDING')`,
  'graphile-worker': `select count(*)::int from graphile_worker._private_jobs where run_at > now() + interval '12 hours'`,
  'pg-boss': `select count(*)::int from pgboss.job where name = 'bench' and state = 'created' and start_after > now() + interval '12 hours'`,
};

/** Autovacuum and autoanalyze runs finished so far on the database's tables (pg_stat_user_tables). */
export const AUTOVACUUM_SQL = 'select coalesce(sum(autovacuum_count + autoanalyze_count), 0)::int from pg_stat_user_tables';

/** The tables each system's history goes into (for BENCH_HISTORY_AUTOVACUUM=off). */
const TABLES: Record<Family, string[]> = {
  runledger: ['runledger.runs', 'runledger.steps', 'runledger.events'],
  dbos: ['dbos.workflow_status', 'dbos.workflow_input', 'dbos.workflow_output', 'dbos.operation_outputs'],
  'graphile-worker': ['graphile_worker._private_jobs'],
  'pg-boss': ['pgboss.archive'],
};

export interface HistoryLoad {
  historyLoadSeconds: number;
  historyRowsPerSec: number;
  historyBytes: number;
}

/** Loads the history of `systemId` into `url` (its schema installed). Statistics are left as they are. */
export async function loadHistory(systemId: string, url: string): Promise<HistoryLoad> {
  const family = familyOf(systemId);
  return withAdmin(url, async (c) => {
    const size = async () => Number((await c.query('select pg_database_size(current_database())::bigint as n')).rows[0].n);
    const before = await size();
    // BENCH_HISTORY_AUTOVACUUM=off: a storage parameter of the benchmark database's own tables, so that no autoanalyze
    // replans the sessions' cached plans and no autovacuum competes with the drain (pg-boss's job partitions are left on)
    if (!config.historyAutovacuum) for (const table of TABLES[family]) await c.query(`alter table ${table} set (autovacuum_enabled = off)`);
    const t0 = performance.now();
    let rows = 0;
    for (const sql of SQL[family]()) {
      const r = await c.query(sql);
      rows +=
        r.command === 'INSERT' ? (r.rowCount ?? 0) : r.command === 'SELECT' && r.rows[0]?.count !== undefined ? Number(r.rows[0].count) : 0;
    }
    const ms = performance.now() - t0;
    const waiting = Number((await c.query(WAITING_SQL[family])).rows[0].count);
    if (waiting !== WAITING()) throw new Error(`history: ${waiting} waiting rows after the load, expected ${WAITING()}`);
    return { historyLoadSeconds: ms / 1000, historyRowsPerSec: perSecond(rows, ms), historyBytes: (await size()) - before };
  });
}
