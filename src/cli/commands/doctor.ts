import type pg from 'pg';
import { loadMigrations } from '../../engine/db/migrate.js';
import { print } from '../format.js';
import { CliError, EXIT_FAILED, parse, withPool, type Command } from '../shared.js';

interface Finding {
  check: string;
  ok: boolean;
  detail: string;
  /** What to run about it. */
  hint?: string;
}

/**
 * One pass over what an operator should know about: the schema against this build, live
 * workers, stranded runs (a version no live worker serves), migrations nobody can apply,
 * dead letters, operations whose outcome is unknown, and a transaction held open long
 * enough to stop vacuum (with the dead tuples of runledger's tables). Exit 0 when all is well, 1 when a
 * check warns, so it can gate a deploy step.
 */
export const doctor: Command = {
  summary:
    'check the schema, workers, stranded runs, pending migrations, dead letters, unknown operations and held transactions; exit 1 on a warning',
  usage: 'runledger doctor [--json] [--xmin-age-max SECONDS]',
  examples: ['runledger doctor', "runledger doctor --json | jq '.[] | select(.ok | not)'", 'runledger doctor && ./deploy.sh'],
  async run(args) {
    const parsed = parse(doctor, args, {
      json: { type: 'boolean', help: 'print one JSON document: an array of {check, ok, detail, hint}' },
      'xmin-age-max': {
        type: 'string',
        value: 'SECONDS',
        help: `warn about a session whose snapshot (backend_xmin) is older than this; default ${XMIN_AGE_MAX_DEFAULT_S}`,
      },
    });
    if (!parsed) return;
    const raw = parsed.values['xmin-age-max'];
    const xminAgeMax = raw === undefined ? XMIN_AGE_MAX_DEFAULT_S : Number(raw);
    if (!Number.isFinite(xminAgeMax) || xminAgeMax < 0) throw new CliError('USAGE', '--xmin-age-max must be a number of seconds >= 0');
    const findings = await withPool(parsed.values, (pool) => examine(pool, xminAgeMax));
    if (parsed.values.json) {
      print(JSON.stringify(findings, null, 2));
    } else {
      for (const f of findings) {
        print(`${f.ok ? 'ok     ' : 'warning'}  ${f.check}: ${f.detail}`);
        if (!f.ok && f.hint) print(`         ${f.hint}`);
      }
    }
    const warnings = findings.filter((f) => !f.ok).length;
    if (warnings > 0) throw new CliError('DOCTOR_WARNINGS', `${warnings} check(s) warn`, EXIT_FAILED);
  },
};

/** A snapshot held this long (an idle-in-transaction session, a long report) already costs vacuum a lot on a busy queue. */
const XMIN_AGE_MAX_DEFAULT_S = 300;

async function examine(pool: pg.Pool, xminAgeMax: number): Promise<Finding[]> {
  const findings: Finding[] = [];
  const one = async <T extends object>(text: string) => (await pool.query<T>(text)).rows;

  const known = loadMigrations();
  const applied = await one<{ version: number; name: string }>('select version, name from runledger.migrations order by version');
  const missing = known.filter((m) => !applied.some((a) => a.version === m.version));
  const newer = applied.filter((a) => !known.some((m) => m.version === a.version));
  findings.push({
    check: 'schema',
    ok: missing.length === 0 && newer.length === 0,
    detail:
      missing.length > 0
        ? `${missing.length} migration(s) of this build not applied (${missing.map((m) => m.name).join(', ')})`
        : newer.length > 0
          ? `the database has migration(s) this build does not know (${newer.map((a) => a.name).join(', ')}): a newer runledger migrated it`
          : `${applied.length} migrations applied, as this build expects`,
    hint: missing.length > 0 ? 'runledger migrate' : 'run the build that migrated the database',
  });

  const workers = await one<{ live: string; silent: string }>(
    `select count(*) filter (where w.last_heartbeat_at > runledger.now() - make_interval(secs => w.lease_ms / 1000.0)) as live,
            count(*) filter (where w.last_heartbeat_at <= runledger.now() - make_interval(secs => w.lease_ms / 1000.0)) as silent
       from runledger.workers w where w.stopped_at is null`,
  );
  const live = Number(workers[0]!.live);
  const silent = Number(workers[0]!.silent);
  findings.push({
    check: 'workers',
    ok: live > 0,
    detail: `${live} live${silent > 0 ? `, ${silent} silent past their lease (dead; their runs are recovered)` : ''}`,
    hint: 'start a worker: runledger worker --module ...',
  });

  const stranded = await one<{ version: string; n: string; served: string[] | null }>(
    `select workflow_name || '@' || workflow_version as version, count(*) as n, max(served_versions) as served
       from runledger.stranded_runs group by 1 order by 1`,
  );
  findings.push({
    check: 'stranded runs',
    ok: stranded.length === 0,
    detail:
      stranded.length === 0
        ? 'every PENDING and WAITING run has a live worker of its version'
        : stranded.map((s) => `${s.n} of ${s.version}${s.served?.length ? ` (live workers serve ${s.served.join(', ')})` : ''}`).join('; '),
    hint: 'start a worker of that version, or migrate the runs: runledger runs --stranded; runledger migrate-run ...',
  });

  const unapplied = await one<{ pair: string; n: string }>(
    `select r.workflow_name || '@' || r.workflow_version || '>' || r.migrate_to as pair, count(*) as n
       from runledger.runs r
      where r.migrate_to is not null
        and not exists (select 1 from runledger.live_workers w
                         where (r.workflow_name || '@' || r.workflow_version || '>' || r.migrate_to) = any(w.migrations))
      group by 1 order by 1`,
  );
  findings.push({
    check: 'migrations',
    ok: unapplied.length === 0,
    detail:
      unapplied.length === 0
        ? 'no run waits for a migration that no live worker can apply'
        : unapplied.map((u) => `${u.n} run(s) marked ${u.pair} and no live worker has that migration`).join('; '),
    hint: 'start a worker of the new version with the migration registered',
  });

  const dead = await one<{ reason: string; n: string }>(
    'select termination_reason as reason, count(*) as n from runledger.dead_letter group by 1 order by 1',
  );
  findings.push({
    check: 'dead letter',
    ok: dead.length === 0,
    detail: dead.length === 0 ? 'no dead-lettered runs' : dead.map((d) => `${d.n} ${d.reason}`).join(', '),
    hint: 'runledger dead-letter; runledger show RUN_ID; runledger retry | migrate-run | fork',
  });

  const unknown = await one<{ n: string }>('select count(*) as n from runledger.unknown_operations');
  const unknownCount = Number(unknown[0]!.n);
  findings.push({
    check: 'unknown operations',
    ok: unknownCount === 0,
    detail: unknownCount === 0 ? 'no operation with an unknown outcome' : `${unknownCount} operation(s) with an unknown outcome`,
    hint: 'runledger unknown; runledger resolve OPERATION_ID --status SUCCEEDED|FAILED',
  });

  findings.push(await heldTransactions(pool, xminAgeMax));
  return findings;
}

/**
 * A session holding an old snapshot (backend_xmin) keeps vacuum from removing the row
 * versions every claim, heartbeat and checkpoint leaves behind in runs and steps: claims
 * then scan more and more dead tuples. The oldest holder of this database is named
 * (pid, state, since when) with the dead tuples of runledger's tables. Without
 * pg_read_all_stats, other roles' sessions show no xmin and go unseen.
 */
async function heldTransactions(pool: pg.Pool, xminAgeMax: number): Promise<Finding> {
  const holders = await pool.query<{ pid: number; state: string; xact_age_s: number; xmin_age: number; application: string }>(
    `select pid, coalesce(state, '?') as state, extract(epoch from clock_timestamp() - xact_start)::float8 as xact_age_s,
            age(backend_xmin) as xmin_age, coalesce(application_name, '') as application
       from pg_stat_activity
      where datname = current_database() and backend_xmin is not null and pid <> pg_backend_pid()
        and xact_start < clock_timestamp() - make_interval(secs => $1)
      order by xact_start limit 1`,
    [xminAgeMax],
  );
  const dead = await pool.query<{ relname: string; n_dead_tup: string }>(
    `select relname, n_dead_tup from pg_stat_user_tables where schemaname = 'runledger' and n_dead_tup > 0
      order by n_dead_tup desc limit 3`,
  );
  const deadTuples =
    dead.rows.length === 0 ? 'no dead tuples' : `dead tuples: ${dead.rows.map((d) => `${d.relname} ${d.n_dead_tup}`).join(', ')}`;
  const oldest = holders.rows[0];
  return {
    check: 'held transactions',
    ok: oldest === undefined,
    detail: oldest
      ? `pid ${oldest.pid} (${oldest.state}${oldest.application ? `, ${oldest.application}` : ''}) has held a snapshot for ` +
        `${Math.round(oldest.xact_age_s)} s (${oldest.xmin_age} transactions): vacuum cannot remove dead rows meanwhile; ${deadTuples}`
      : `no snapshot older than ${xminAgeMax} s; ${deadTuples}`,
    hint: `end that transaction, or pg_terminate_backend(${oldest?.pid ?? 'PID'}); set idle_in_transaction_session_timeout`,
  };
}
