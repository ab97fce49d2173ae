import { afterAll, expect, it } from 'vitest';
import { useTestEngine } from './helpers/test-engine.js';
import { waitFor } from './helpers/database.js';
import { BlackholeProxy } from './helpers/blackhole-proxy.js';
import { spawnWorker, type WorkerProcess } from './helpers/worker-process.js';

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
