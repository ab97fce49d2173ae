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
 * dead letters and operations whose outcome is unknown. Exit 0 when all is well, 1 when a
 * check warns, so it can gate a deploy step.
 */
export const doctor: Command = {
  summary: 'check the schema, workers, stranded runs, pending migrations, dead letters and unknown operations; exit 1 on a warning',
  usage: 'runledger doctor [--json]',
  examples: ['runledger doctor', "runledger doctor --json | jq '.[] | select(.ok | not)'", 'runledger doctor && ./deploy.sh'],
  async run(args) {
    const parsed = parse(doctor, args, {
      json: { type: 'boolean', help: 'print one JSON document: an array of {check, ok, detail, hint}' },
    });
    if (!parsed) return;
    const findings = await withPool(parsed.values, (pool) => examine(pool));
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

async function examine(pool: pg.Pool): Promise<Finding[]> {
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
  return findings;
}
