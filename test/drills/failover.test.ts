import { mkdirSync, writeFileSync } from 'node:fs';
import pg from 'pg';
import { afterAll, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../helpers/database.js';
import { TicketService } from '../helpers/ticket-service.js';
import type { WorkerProcess } from '../helpers/worker-process.js';
import {
  checkInvariants,
  clientEngine,
  drillWorker,
  logLines,
  prepareServer,
  progress,
  signalSender,
  timeToRecover,
  unfinished,
} from './drill.js';
import { debianBinaries, DEBIAN_BIN, PgServer } from './pg-server.js';

/**
 * Drill: a primary and its streaming replica (pg_basebackup, synchronous so an
 * acknowledged commit is on both), both started here with Debian's PostgreSQL 15
 * binaries. Under load the primary is killed (`pg_ctl stop -m immediate`) and the
 * replica promoted; the workers, given `host=a,b target_session_attrs=read-write`,
 * carry on against the new primary, LISTEN included, and the tables show every run
 * SUCCEEDED with each effect exactly once.
 */
const RUNS = 1000;
const LINES_PER_OUTAGE = 120;
const bin = debianBinaries();
const missing = !bin;
if (missing) {
  const why = `failover drill: ${DEBIAN_BIN}/pg_basebackup is missing (apt-get install postgresql-15; .ci/run does it)`;
  if (process.env.CI === 'true') throw new Error(`${why}, and CI=true requires it`);
  console.log(`${why}: skipped`);
}

let primary: PgServer;
let replica: PgServer;
let service: TicketService;
const workers: WorkerProcess[] = [];
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function query<T extends pg.QueryResultRow>(url: string, text: string): Promise<T[]> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    return (await client.query<T>(text)).rows;
  } finally {
    await client.end();
  }
}

beforeAll(async () => {
  if (missing) return;
  primary = await PgServer.create(bin);
  await prepareServer(primary.url());
  replica = await PgServer.replicaOf(primary);
  // Synchronous: a commit the primary acknowledged is on the replica, so the failover loses none (set after the base backup,
  // or the promoted replica would wait for a standby of its own).
  await query(primary.url(), `alter system set synchronous_standby_names = '*'`);
  await query(primary.url(), `select pg_reload_conf()`);
  await waitFor('the replica to stream synchronously', async () => {
    const rows = await query<{ sync_state: string }>(primary.url(), `select sync_state from pg_stat_replication`);
    return rows[0]?.sync_state === 'sync';
  });
  service = await TicketService.start();
}, 180_000);

afterAll(async () => {
  for (const w of workers) w.kill('SIGKILL');
  await service?.stop();
  primary?.destroy();
  replica?.destroy();
});

describe.skipIf(missing)('failover: primary killed, streaming replica promoted', () => {
  it('workers on a multi-host connection string carry on against the new primary; 1,000 runs end SUCCEEDED, every effect once', async () => {
    const url = `postgres://postgres@127.0.0.1:${primary.port},127.0.0.1:${replica.port}/postgres?target_session_attrs=read-write`;
    workers.push(await drillWorker(url), await drillWorker(url));
    onTestFailed(() => {
      mkdirSync('.runledger', { recursive: true });
      for (const w of workers) writeFileSync(`.runledger/drill-failover-worker-${w.pid}.log`, w.output());
      console.error(`worker output in .runledger/drill-failover-worker-{${workers.map((w) => w.pid).join(',')}}.log`);
    });
    const { engine, drill } = clientEngine(url);
    const handles = await engine.startMany(
      drill,
      Array.from({ length: RUNS }, () => ({ service: service.url, napMs: 300 })),
    );
    const runIds = handles.map((h) => h.runId);
    const sender = signalSender(engine, runIds, 25);
    const started = Date.now();

    // Under load: a third of the runs done, then the primary dies.
    await waitFor('a third of the runs to finish', async () => (await unfinished(primary.url(), runIds)) <= (RUNS * 2) / 3, 120_000);
    primary.stopImmediate();
    const detectMs = 1000; // what a failover manager takes to notice and decide
    await sleep(detectMs);
    replica.promote();
    const recoverMs = await timeToRecover(replica.url(), await progress(replica.url()));

    // LISTEN re-established on the new primary: each worker's listener connection is there again.
    await waitFor('every worker listening on the new primary', async () => {
      const rows = await query<{ n: number }>(
        replica.url(),
        `select count(distinct pid)::int as n from pg_stat_activity where backend_type = 'client backend' and query ilike 'listen runledger%'`,
      );
      return rows[0]!.n >= workers.length;
    });

    await sender.done;
    await waitFor('all runs finished', async () => (await unfinished(replica.url(), runIds)) === 0, 180_000);
    const elapsed = Date.now() - started;
    const facts = await checkInvariants(replica.url(), runIds, service);
    const reclaimed = await query<{ n: number }>(
      replica.url(),
      `select count(*)::int as n from runledger.events where kind = 'lease_expired'`,
    );
    await engine.close();

    const lines = workers.map(logLines);
    for (const w of workers) expect(w.child.exitCode, `worker ${w.pid} still running`).toBeNull();
    for (const w of workers) w.kill('SIGTERM');
    for (const w of workers) expect((await w.exited).code).toBe(0);
    for (const n of lines) expect(n).toBeLessThanOrEqual(LINES_PER_OUTAGE);

    console.log(
      `drill failover: runs=${facts.runs} faults=1 (primary stopped -m immediate, replica promoted after ${detectMs} ms); ` +
        `time to recover (promotion to first claim/commit)=${recoverMs} ms; lease_expired=${reclaimed[0]!.n}; ` +
        `lost=${facts.lost} duplicated=${facts.duplicated}; ticket calls=${service.totalCalls()} for ${service.tickets.size} tickets; ` +
        `log lines per worker=${lines.join(',')}; elapsed=${Math.round(elapsed / 1000)} s`,
    );
  }, 600_000);
});
