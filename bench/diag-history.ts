/**
 * Where the time goes in a drain on a database with history, statement by statement,
 * including the statements inside runledger's SQL functions: pg_stat_statements with
 * track = all (set on the scratch database only, so it needs a server that loads the
 * library: the embedded one that run.ts starts does). Runs the queue_history protocol
 * (warm worker, history loaded while it runs, paused, units enqueued, resumed) with and
 * without the load, for one system, and prints the top statements of each drain.
 *   npx tsx diag-history.ts [system] [plan: one|three] [units]      (from bench/)
 *   DATABASE_URL=postgres://... to use another server that loads pg_stat_statements
 */
import { join } from 'node:path';
import { startEmbeddedPostgres } from 'runledger/dev';
import { config } from './lib/config.js';
import { createDatabase, dropDatabase, Probe, withAdmin } from './lib/db.js';
import { inParallel, warmUp } from './lib/drain.js';
import { loadHistory } from './lib/history.js';
import { PLANS } from './lib/plans.js';
import { BENCH_DIR } from './lib/spawn.js';
import { perSecond, sleep } from './lib/stats.js';
import { systemById } from './systems/index.js';

const system = systemById(process.argv[2] ?? 'runledger');
const plan = PLANS[(process.argv[3] ?? 'one') as 'one' | 'three'];
const units = Number(process.argv[4] ?? config.queueJobs);
const embedded = config.databaseUrl ? undefined : await startEmbeddedPostgres({ dataDir: join(BENCH_DIR, '..', '.runledger', 'bench-pg') });
const adminUrl = config.databaseUrl ?? embedded!.connectionString;

try {
  const libraries = await withAdmin(
    adminUrl,
    async (c) => (await c.query(`select current_setting('shared_preload_libraries') as v`)).rows[0].v as string,
  );
  if (!libraries.includes('pg_stat_statements'))
    throw new Error('this server does not load pg_stat_statements (run.ts starts the embedded server with it; run it once first)');
  for (const withHistory of [false, true]) {
    const database = 'bench_diag_history';
    const url = await createDatabase(adminUrl, database);
    await withAdmin(adminUrl, (c) => c.query(`alter database ${database} set pg_stat_statements.track = 'all'`));
    await system.setup(url, plan);
    const probe = new Probe(url);
    await probe.connect();
    await probe.query('create extension if not exists pg_stat_statements');
    let warmDone = 0;
    let done = 0;
    let counting = false;
    const worker = await system.worker(url, plan, {
      concurrency: config.concurrency,
      poolMax: config.poolMax,
      pausable: true,
      hooks: { afterLastStep: () => void (counting ? done++ : warmDone++) },
    });
    const warmer = await system.producer(url, plan, config.poolMax);
    await warmUp(
      system,
      url,
      plan,
      probe,
      (n) => warmer.enqueue(n),
      () => warmDone,
    );
    await warmer.close();
    if (withHistory) await loadHistory(system.id, url);
    await worker.pause!();
    const base = await probe.scalar(system.pendingSql(plan));
    const producer = await system.producer(url, plan, config.poolMax);
    await inParallel(units, config.enqueuers, (n) => producer.enqueue(n));
    await producer.close();
    await probe.query('select pg_stat_statements_reset(0, (select oid from pg_database where datname = current_database()), 0)');
    counting = true;
    const t0 = performance.now();
    await worker.resume!();
    while (done < units || (await probe.scalar(system.pendingSql(plan))) - base > 0) await sleep(10);
    const ms = performance.now() - t0;
    const { rows } = await probe.query(
      `select toplevel, calls, round(total_exec_time::numeric, 1) as total_ms, round(mean_exec_time::numeric, 3) as mean_ms,
              shared_blks_hit + shared_blks_read as blocks, regexp_replace(query, '\\s+', ' ', 'g') as query
         from pg_stat_statements where dbid = (select oid from pg_database where datname = current_database())
          and query not like '/* bench-probe */%' order by total_exec_time desc limit 12`,
    );
    console.log(
      `\n${system.label} ${plan.name}, ${units} units, ${withHistory ? 'WITH history' : 'fresh'}: ${perSecond(units, ms).toFixed(0)} units/s`,
    );
    for (const r of rows)
      console.log(
        `  ${r.toplevel ? 'top ' : 'nest'} ${String(r.calls).padStart(6)} calls ${String(r.total_ms).padStart(9)} ms ${String(r.mean_ms).padStart(8)} ms/call ${String(r.blocks).padStart(8)} blks  ${String(r.query).slice(0, 150)}`,
      );
    await probe.end();
    await worker.stop();
    await dropDatabase(adminUrl, database);
  }
} finally {
  await embedded?.stop();
}
