/**
 * How long one migration takes on a database that holds history (not part of `npm start`).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres MIGRATION=30 \
 *     BENCH_HISTORY_FINISHED=1000000 npx tsx migration-time.ts
 *
 * In a fresh database `rl_migration_time` on that server: the migrations before MIGRATION
 * (default: the newest), then the closedloop_history workload's history (bench/lib/history.ts:
 * BENCH_HISTORY_FINISHED finished runs with 3 steps and 3 events each, BENCH_HISTORY_WAITING
 * waiting ones), then MIGRATION alone, in one transaction as migrate() applies it, timed. The
 * database is dropped at the end.
 */
import pg from 'pg';
import { loadMigrations } from 'runledger';
import { loadHistory } from './lib/history.js';
import { freshProfileDatabase, positiveInteger } from './lib/profile-db.js';

const url = process.env.DATABASE_URL;
if (!url) throw new Error('DATABASE_URL is required (a server you may create databases on)');
const migrations = loadMigrations();
const version = positiveInteger('MIGRATION', process.env.MIGRATION, migrations.at(-1)!.version);
const measured = migrations.find((m) => m.version === version);
if (!measured) throw new Error(`MIGRATION=${version}: no such migration in sql/`);

const dbUrl = await freshProfileDatabase(url, 'rl_migration_time');
const client = new pg.Client({ connectionString: dbUrl });
await client.connect();
const apply = async (text: string) => {
  await client.query('begin');
  await client.query(text);
  await client.query('commit');
};
for (const m of migrations.filter((m) => m.version < version)) await apply(m.text);
await client.query(
  `insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts) values ('bench', '1', 'default', 10)`,
);
const history = await loadHistory('runledger', dbUrl);
const held = (
  await client.query(`select (select count(*) from runledger.runs)::int as runs, (select count(*) from runledger.steps)::int as steps,
                             (select count(*) from runledger.events)::int as events,
                             pg_size_pretty(pg_database_size(current_database())) as size`)
).rows[0];
console.log(
  `history: ${held.runs} runs, ${held.steps} steps, ${held.events} events, ${held.size} (loaded in ${history.historyLoadSeconds.toFixed(1)} s)`,
);
const started = performance.now();
await apply(measured.text);
console.log(`${measured.name}: ${((performance.now() - started) / 1000).toFixed(1)} s`);
await client.end();
const admin = new pg.Client({ connectionString: url });
await admin.connect();
await admin.query('drop database rl_migration_time with (force)');
await admin.end();
