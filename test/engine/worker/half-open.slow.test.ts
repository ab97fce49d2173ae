import { afterAll, expect, it } from 'vitest';
import { useTestEngine } from '../../helpers/test-engine.js';
import { waitFor } from '../../helpers/database.js';
import { BlackholeProxy } from '../../helpers/blackhole-proxy.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';

/**
 * Fault drill (issue 18): a half-open TCP connection. Worker A, a real process, talks to
 * PostgreSQL through a proxy that goes silent without closing anything; its queries get
 * neither an answer nor an error. A must give its runs up within a bound of its lease,
 * worker B (direct) must take them once the leases expire, and nothing A was doing may
 * land after B took over (fencing): every transaction step's effect exists once.
 */
const LEASE_MS = 1_500;
const RUNS = 4;
let proxy: BlackholeProxy;
let workerA: WorkerProcess | undefined;
const t = useTestEngine({
  fixtures: true,
  prepare: async (db) => {
    const target = new URL(db.url);
    proxy = await BlackholeProxy.start({ host: target.hostname, port: Number(target.port || 5432) });
    return () => proxy.stop();
  },
});
const { db } = t;

afterAll(async () => {
  workerA?.kill();
  await workerA?.exited;
});

it('a worker behind a blackholed connection gives its runs up within the lease, and another worker finishes them exactly once', async () => {
  const viaProxy = new URL(db.url);
  viaProxy.hostname = '127.0.0.1';
  viaProxy.port = String(proxy.port);
  workerA = await spawnWorker({ DATABASE_URL: viaProxy.toString(), LEASE_MS: String(LEASE_MS), CONCURRENCY: String(RUNS) });
  const a = workerA;

  // A holds every run in the middle of its transaction step (8 s long) when the network goes silent.
  const runIds: string[] = [];
  for (let i = 0; i < RUNS; i++) runIds.push((await t.engine.start(t.fixtures.slow, { ms: 8_000 })).runId);
  await waitFor('A inside slow-write of every run', async () => {
    const { rows } = await db.pool.query(`select count(*)::int as n from step_executions where step = 'slow-write' and pid = $1`, [a.pid]);
    return rows[0].n === RUNS || undefined;
  });
  proxy.blackhole();
  const blackholedAt = Date.now();

  // A notices on its own: its heartbeat gets no answer, and after the lease its executions halt.
  const gaveUp = () => a.output().split('heartbeat failing for longer than the lease').length - 1;
  await waitFor('A gives its runs up', async () => gaveUp() === RUNS || undefined, 10 * LEASE_MS);
  const gaveUpMs = Date.now() - blackholedAt;

  await t.engine.runWorker({ concurrency: RUNS, leaseMs: LEASE_MS, pollIntervalMs: 100 });
  let tookOverMs: number | undefined;
  await waitFor(
    'B takes and finishes every run',
    async () => {
      const { rows } = await db.pool.query(`select count(*)::int as n from step_executions where step = 'slow-write' and pid = $1`, [
        process.pid,
      ]);
      if (rows[0].n > 0) tookOverMs ??= Date.now() - blackholedAt;
      const done = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'SUCCEEDED'`, [
        runIds,
      ]);
      return done.rows[0].n === RUNS || undefined;
    },
    60_000,
  );

  // Nothing lost, nothing twice: one business row and one checkpoint per transaction step, B's.
  const orders = await db.pool.query(`select run_id, count(*)::int as n from orders where run_id = any($1) group by run_id`, [runIds]);
  expect(orders.rows.map((r) => r.n)).toEqual(Array(RUNS).fill(1));
  const steps = await db.pool.query(
    `select count(*)::int as n, count(distinct run_id)::int as runs from runledger.steps where run_id = any($1) and name = 'slow-write'`,
    [runIds],
  );
  expect(steps.rows[0]).toEqual({ n: RUNS, runs: RUNS });
  const last = await db.pool.query(`select distinct pid from step_executions where run_id = any($1) and step = 'last'`, [runIds]);
  expect(last.rows).toEqual([{ pid: process.pid }]);

  // Bounds: A halted within the lease plus a heartbeat's deadline and interval (and scheduling slack);
  // B took over once the leases ran out; A wrote a bounded number of log lines meanwhile.
  expect(gaveUpMs).toBeLessThan(LEASE_MS * 3);
  expect(tookOverMs).toBeLessThan(gaveUpMs + LEASE_MS * 4);
  const lines = a.output().trim().split('\n').length;
  expect(lines).toBeLessThan(200);
  console.log(
    `half-open drill: ${RUNS} runs, 1 blackhole (${proxy.connections} connections through the proxy, ${proxy.bytesDropped} bytes dropped); ` +
      `A gave up after ${gaveUpMs} ms, B took over after ${tookOverMs} ms; A logged ${lines} lines; lost 0, duplicated 0`,
  );
}, 120_000);

it('every query of the engine has a deadline: on a half-open connection it fails after queryTimeoutMs instead of waiting forever', async () => {
  const silent = await BlackholeProxy.start({ host: new URL(db.url).hostname, port: Number(new URL(db.url).port || 5432) });
  try {
    const viaProxy = new URL(db.url);
    viaProxy.hostname = '127.0.0.1';
    viaProxy.port = String(silent.port);
    const engine = t.newEngine({ connectionString: viaProxy.toString(), queryTimeoutMs: 500 });
    await expect(engine.pool.query('select 1 as one')).resolves.toMatchObject({ rows: [{ one: 1 }] });
    silent.blackhole();
    // The pooled connection is established (query_timeout), a new one never gets its startup answer (connectionTimeoutMillis).
    for (const what of ['established connection', 'new connection']) {
      const sentAt = Date.now();
      await expect(engine.pool.query('select 1'), what).rejects.toThrow(/timeout/i);
      expect(Date.now() - sentAt, what).toBeLessThan(5_000);
    }
  } finally {
    await silent.stop();
  }
});

it('a host cut off and back: its transactions from before the cut get their late statements and end without a trace, and the host carries on with new runs', async () => {
  const cut = await BlackholeProxy.start({ host: new URL(db.url).hostname, port: Number(new URL(db.url).port || 5432) });
  const viaProxy = new URL(db.url);
  viaProxy.hostname = '127.0.0.1';
  viaProxy.port = String(cut.port);
  const hostA = await spawnWorker({
    DATABASE_URL: viaProxy.toString(),
    LEASE_MS: String(LEASE_MS),
    CONCURRENCY: String(RUNS),
    PGAPPNAME: 'cut-host',
    RUNLEDGER_HOST: 'cut-host',
    QUEUES: 'partition', // its own queue: the first test's worker B (in this process) serves the default one
  });
  let b: Awaited<ReturnType<typeof t.engine.runWorker>> | undefined;
  try {
    // Host A is inside every run's transaction step (the business row is written after the cut) when the partition starts.
    const runIds: string[] = [];
    for (let i = 0; i < RUNS; i++) runIds.push((await t.engine.start(t.fixtures.slow, { ms: 4_000 }, { queue: 'partition' })).runId);
    await waitFor('A inside slow-write of every run', async () => {
      const { rows } = await db.pool.query(
        `select count(*)::int as n from step_executions where step = 'slow-write' and pid = $1 and run_id = any($2)`,
        [hostA.pid, runIds],
      );
      return rows[0].n === RUNS || undefined;
    });
    cut.blackhole({ hold: true });

    // B takes the runs over once A's leases expire and finishes them while A is cut off.
    b = await t.engine.runWorker({ concurrency: RUNS, leaseMs: LEASE_MS, pollIntervalMs: 100, queues: ['partition'] });
    await waitFor(
      'B finishes every run',
      async () => {
        const done = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'SUCCEEDED'`, [
          runIds,
        ]);
        return done.rows[0].n === RUNS || undefined;
      },
      60_000,
    );
    await b.stop();
    b = undefined;
    // A's transactions are still open on the server (BEGIN came before the cut); its step functions have
    // returned meanwhile, so their INSERTs (and whatever followed) wait in the partition.
    const openBefore = await db.pool.query(
      `select count(*)::int as n from pg_stat_activity where application_name = 'cut-host' and state like 'idle in transaction%'`,
    );
    expect(openBefore.rows[0].n).toBeGreaterThanOrEqual(RUNS);
    cut.heal();

    // The late statements reach the server (each INSERT meets B's row, and A, which knows it lost the
    // lease, rolls back; a checkpoint would meet the fence in _checkpoint); every transaction A had open ends.
    await waitFor(
      "A's transactions from before the cut to end",
      async () => {
        const open = await db.pool.query(
          `select count(*)::int as n from pg_stat_activity where application_name = 'cut-host' and xact_start < now() - interval '1 second' and state <> 'idle'`,
        );
        return open.rows[0].n === 0 || undefined;
      },
      90_000,
    );
    const orders = await db.pool.query(`select run_id, count(*)::int as n from orders where run_id = any($1) group by run_id`, [runIds]);
    expect(orders.rows.map((r) => r.n)).toEqual(Array(RUNS).fill(1));
    const steps = await db.pool.query(`select count(*)::int as n from runledger.steps where run_id = any($1) and name = 'slow-write'`, [
      runIds,
    ]);
    expect(steps.rows[0].n).toBe(RUNS);
    const runs = await db.pool.query(`select status, lease_owner from runledger.runs where run_id = any($1)`, [runIds]);
    expect(runs.rows).toEqual(Array(RUNS).fill({ status: 'SUCCEEDED', lease_owner: null }));

    // A is back: alone now, it takes and finishes a new run.
    const fresh = await t.engine.start(t.fixtures.slow, { ms: 10 }, { queue: 'partition' });
    await waitFor(
      'A finishes a new run',
      async () => {
        const done = await db.pool.query(`select status from runledger.runs where run_id = $1`, [fresh.runId]);
        return done.rows[0].status === 'SUCCEEDED' || undefined;
      },
      60_000,
    );
    const ranBy = await db.pool.query(`select distinct pid from step_executions where run_id = $1`, [fresh.runId]);
    expect(ranBy.rows).toEqual([{ pid: hostA.pid }]);
    expect(hostA.child.exitCode).toBeNull();
    console.log(
      `partition drill: ${RUNS} runs, A cut off and healed (${cut.connections} connections through the proxy); B finished them; ` +
        `A's ${openBefore.rows[0].n} open transactions got their late statements and rolled back (one business row and one checkpoint per run), A then ran a new run; lost 0, duplicated 0`,
    );
  } finally {
    await b?.stop();
    hostA.kill();
    await hostA.exited;
    await cut.stop();
  }
}, 150_000);
