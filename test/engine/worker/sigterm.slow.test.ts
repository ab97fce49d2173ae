import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { TicketService } from '../../helpers/ticket-service.js';
import { CLI_SCRIPT, spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { BlackholeProxy } from '../../helpers/blackhole-proxy.js';
import { createSigtermTables, register } from '../../fixtures/sigterm-workflows.js';

/**
 * Drill: SIGTERM to a `runledger worker` process with steps in flight (transaction steps,
 * an operation, slow steps, some deaf to their abort signal, a durable sleep) while a
 * second worker process serves the same queue. The stopped worker must exit within its
 * grace period plus a bound, give back what it still holds (released, not left to lease
 * expiry), and every run must end SUCCEEDED with each effect exactly once. A second
 * signal forces the exit (143 for SIGTERM, 130 for SIGINT); a run held CANCELLING is given
 * back too.
 */
const MODULE = 'test/fixtures/sigterm-workflows.ts';
/** After the grace period: time for the halted runs' releases, _stop_worker and closing the pools. */
const EXIT_BOUND_MS = 5_000;
const TERMINAL = ['SUCCEEDED', 'FAILED', 'DEAD_LETTER', 'CANCELLED', 'TERMINATED'];

let service: TicketService;
const t = useTestEngine({
  prepare: async (db) => {
    await createSigtermTables(db.pool);
    service = await TicketService.start();
    return () => service.stop();
  },
});
const { db } = t;
const { processes: spawned } = stoppedAfterEach();
afterEach(async () => {
  await db.pool.query('truncate sigterm_effects, fault_switch');
});

/** The other worker: serves the 'sigterm' runs (queue default) beside each worker a test stops. */
let other: CliWorker;
beforeAll(async () => {
  other = await cliWorker({ leaseMs: 10_000, queues: ['default'], shared: true });
});
afterAll(async () => {
  other?.kill('SIGKILL');
  await other?.exited;
});

let flows: ReturnType<typeof register> | undefined;
/** The module's workflows, defined once on the test's engine (which starts and cancels the runs). */
const workflows = () => (flows ??= register(t.engine));

interface CliWorker extends WorkerProcess {
  workerId: string;
}

async function cliWorker(options: {
  leaseMs: number;
  graceMs?: number;
  concurrency?: number;
  env?: Record<string, string>;
  url?: string;
  queues?: string[];
  /** Serves every test of the file (killed after them all) instead of being killed after its test. */
  shared?: boolean;
}) {
  const args = ['worker', '--module', MODULE, '--concurrency', String(options.concurrency ?? 16), '--lease-ms', String(options.leaseMs)];
  if (options.graceMs !== undefined) args.push('--grace-ms', String(options.graceMs));
  for (const queue of options.queues ?? []) args.push('--queue', queue);
  const w = await spawnWorker({ DATABASE_URL: options.url ?? db.url, ...options.env }, CLI_SCRIPT, { args, ready: 'stops it gracefully' });
  if (!options.shared) {
    spawned.push(w);
    onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
  }
  const workerId = /^worker (\S+)$/m.exec(w.output())?.[1];
  if (!workerId) throw new Error(`no worker id in ${w.output()}`);
  return { ...w, workerId } as CliWorker;
}

/** The exit of `w` within `ms`, with how long it took; throws if it is still running then. */
async function exitWithin(w: WorkerProcess, ms: number): Promise<{ code: number | null; signal: string | null; tookMs: number }> {
  const from = Date.now();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`worker ${w.pid} still running ${ms} ms after the signal`)), ms);
  });
  try {
    const exit = await Promise.race([w.exited, timeout]);
    return { ...exit, tookMs: Date.now() - from };
  } finally {
    clearTimeout(timer);
  }
}

async function allTerminal(runIds: string[]): Promise<boolean> {
  const result = await db.pool.query(
    `select run_id, status, lease_owner, (select string_agg(kind, ',' order by event_id) from runledger.events e where e.run_id = r.run_id) as history
       from runledger.runs r where run_id = any($1) and status <> all($2)`,
    [runIds, TERMINAL],
  );
  if (result.rowCount === 0) return true;
  throw new Error(`${result.rowCount} unfinished, e.g. ${JSON.stringify(result.rows.slice(0, 3))}`);
}

/** Runs of the drill: a fifth with a 2.5 s step that honours its abort signal, a tenth deaf to it, the rest quick. */
async function startRuns(count: number, queue?: string): Promise<{ runIds: string[]; deaf: string[] }> {
  const { sigterm } = workflows();
  const runIds: string[] = [];
  const deaf: string[] = [];
  for (let i = 0; i < count; i++) {
    const ignoreAbort = i % 10 === 0;
    // A deaf step lasts 2.5 s, so a test can see a worker inside it before the signal (100 ms could slip between two polls).
    const workMs = ignoreAbort || i % 5 === 1 ? 2_500 : 100;
    const handle = await t.engine.start(sigterm, { service: service.url, workMs, ignoreAbort, napMs: 100 }, queue ? { queue } : undefined);
    runIds.push(handle.runId);
    if (ignoreAbort) deaf.push(handle.runId);
  }
  return { runIds, deaf };
}

/** Runs leased to `workerId` right now that are inside their deaf step (past the operation). */
async function deafHeldBy(workerId: string, deaf: string[]): Promise<number> {
  const result = await db.pool.query(
    `select count(*)::int as n from runledger.runs r
      where r.lease_owner = $1 and r.run_id = any($2)
        and exists (select 1 from runledger.steps s where s.run_id = r.run_id and s.name = 'ticket')`,
    [workerId, deaf],
  );
  return result.rows[0].n;
}

/** Every run SUCCEEDED, both transaction effects exactly once, one ticket per run under its key. */
async function checkInvariants(runIds: string[]): Promise<{ lost: number; duplicated: number }> {
  const statuses = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [runIds]);
  expect(statuses.rows).toEqual([{ status: 'SUCCEEDED', n: runIds.length }]);
  const effects = await db.pool.query(
    `select r.run_id, count(*) filter (where e.step = 'reserve')::int as reserve, count(*) filter (where e.step = 'ship')::int as ship
       from unnest($1::text[]) r(run_id) left join sigterm_effects e on e.run_id = r.run_id group by r.run_id`,
    [runIds],
  );
  const lost = effects.rows.filter((row) => row.reserve === 0 || row.ship === 0);
  const duplicated = effects.rows.filter((row) => row.reserve > 1 || row.ship > 1);
  expect(lost, 'runs missing a transaction-step effect').toEqual([]);
  expect(duplicated, 'runs with a transaction-step effect twice').toEqual([]);
  const outputs = await db.pool.query(`select run_id, output from runledger.runs where run_id = any($1)`, [runIds]);
  const wrongTicket = outputs.rows.filter((row) => row.output?.ticket !== service.tickets.get(`sigterm-${row.run_id}`));
  expect(wrongTicket, 'runs whose output is not the ticket of their key').toEqual([]);
  expect(runIds.filter((id) => service.tickets.has(`sigterm-${id}`)).length).toBe(runIds.length);
  return { lost: lost.length, duplicated: duplicated.length };
}

/** The releases of runs that `workerId` held (events under one of its claims' tokens), each with when another worker claimed it next. */
async function releasesOf(workerId: string) {
  const result = await db.pool.query(
    `select rel.run_id, rel.detail->>'reason' as reason, rel.at,
            (select min(c.at) from runledger.events c
              where c.run_id = rel.run_id and c.kind = 'claimed' and c.event_id > rel.event_id and c.detail->>'worker' <> $1) as reclaimed_at
       from runledger.events rel
      where rel.kind = 'released'
        and exists (select 1 from runledger.events c where c.run_id = rel.run_id and c.kind = 'claimed'
                     and c.fencing_token = rel.fencing_token and c.detail->>'worker' = $1)`,
    [workerId],
  );
  return result.rows as Array<{ run_id: string; reason: string; at: Date; reclaimed_at: Date | null }>;
}

const leaseExpiries = async (runIds: string[]) =>
  (await db.pool.query(`select count(*)::int as n from runledger.events where kind = 'lease_expired' and run_id = any($1)`, [runIds]))
    .rows[0].n as number;

describe('SIGTERM drain drill', () => {
  it('the stopped worker finishes or releases everything within its grace period; the other worker takes the rest at once', async () => {
    const RUNS = 300;
    const GRACE_MS = 1_500;
    const LEASE_MS = 10_000;
    // In the stopped worker the deaf steps hang far past the grace period.
    const stopped = await cliWorker({ leaseMs: LEASE_MS, graceMs: GRACE_MS, queues: ['default'], env: { SIGTERM_HANG_MS: '60000' } });
    const { runIds, deaf } = await startRuns(RUNS);
    await waitFor('the worker to hold deaf steps in flight', async () => (await deafHeldBy(stopped.workerId, deaf)) >= 2);
    const held = (await db.pool.query('select count(*)::int as n from runledger.runs where lease_owner = $1', [stopped.workerId])).rows[0]
      .n as number;

    stopped.kill('SIGTERM');
    const exit = await exitWithin(stopped, GRACE_MS + EXIT_BOUND_MS);
    expect(exit).toMatchObject({ code: 0, signal: null });
    expect(stopped.output()).toContain('stopped');

    // From the tables, at once: marked stopped, nothing leased to it any more.
    const row = (await db.pool.query('select stopped_at from runledger.workers where worker_id = $1', [stopped.workerId])).rows[0];
    expect(row.stopped_at).not.toBeNull();
    const stillLeased = await db.pool.query('select run_id, status from runledger.runs where lease_owner = $1', [stopped.workerId]);
    expect(stillLeased.rows).toEqual([]);

    await waitFor('every run to end', () => allTerminal(runIds), 50_000);
    const facts = await checkInvariants(runIds);
    const releases = await releasesOf(stopped.workerId);
    // The deaf steps could not finish: their runs were given back, and the other worker took them without waiting for a lease.
    expect(releases.length).toBeGreaterThanOrEqual(2);
    expect(releases.filter((r) => r.reclaimed_at === null)).toEqual([]);
    const reclaimMs = Math.max(...releases.map((r) => r.reclaimed_at!.getTime() - r.at.getTime()));
    expect(reclaimMs).toBeLessThan(LEASE_MS);
    expect(await leaseExpiries(runIds)).toBe(0);
    const live = (await db.pool.query('select stopped_at from runledger.workers where worker_id = $1', [other.workerId])).rows[0];
    expect(live.stopped_at).toBeNull();
    console.log(
      `SIGTERM drain: ${RUNS} runs, ${held} held by the stopped worker, grace ${GRACE_MS} ms, exit 0 after ${exit.tookMs} ms, ` +
        `released ${releases.length} (${[...new Set(releases.map((r) => r.reason))].join(', ')}), re-claimed within ${reclaimMs} ms, ` +
        `lease expiries 0, lost ${facts.lost}, duplicated ${facts.duplicated}`,
    );
  }, 60_000);

  it('a SIGINT sent the moment the worker says it is ready stops it gracefully (exit 0)', async () => {
    // The worker listens before it prints the line spawnWorker waits for: a signal sent on
    // reading it must find a listener, or it kills the process (code null, signal SIGINT).
    const w = await cliWorker({ leaseMs: 3_000, queues: ['sigterm-at-ready'] });
    w.kill('SIGINT');
    const exit = await exitWithin(w, 10_000);
    expect(exit).toMatchObject({ code: 0, signal: null });
    expect(w.output()).toContain('stopping (SIGINT)');
  }, 30_000);

  it.each([
    ['SIGTERM', 143],
    ['SIGINT', 130],
  ] as const)(
    'a second %s during the drain forces the exit (%i) promptly; no effect is done twice',
    async (signal, code) => {
      const RUNS = 40;
      const LEASE_MS = 3_000;
      // A grace period far longer than the test: only the second signal ends the drain.
      // A queue of this test's own, which the shared worker does not serve: the worker to be forced takes the
      // first runs (deaf ones among them); the one that takes over starts only once it holds a deaf step.
      const queue = `sigterm-forced-${signal.toLowerCase()}`;
      const forced = await cliWorker({ leaseMs: LEASE_MS, graceMs: 60_000, queues: [queue], env: { SIGTERM_HANG_MS: '60000' } });
      const { runIds, deaf } = await startRuns(RUNS, queue);
      await waitFor('the worker to hold a deaf step in flight', async () => (await deafHeldBy(forced.workerId, deaf)) >= 1);
      await cliWorker({ leaseMs: LEASE_MS, queues: [queue] });

      forced.kill(signal);
      await waitFor('the drain to begin', async () => forced.output().includes('stopping ('));
      forced.kill(signal);
      const exit = await exitWithin(forced, 5_000);
      expect(exit).toMatchObject({ code, signal: null });

      await waitFor('every run to end', () => allTerminal(runIds), 40_000);
      const facts = await checkInvariants(runIds);
      const releases = await releasesOf(forced.workerId);
      console.log(
        `forced stop (${signal} twice): ${RUNS} runs, exit ${exit.code} ${exit.tookMs} ms after the second signal, ` +
          `released ${releases.length}, lease expiries ${await leaseExpiries(runIds)}, lost ${facts.lost}, duplicated ${facts.duplicated}`,
      );
    },
    60_000,
  );

  it('a run the stopping worker holds CANCELLING (its compensation deaf to the abort) is released, and another worker finishes the cancel', async () => {
    const LEASE_MS = 30_000;
    const GRACE_MS = 500;
    const { comp } = workflows();
    await db.pool.query(`insert into fault_switch values ('comp-hang', true)`);
    const stopping = await cliWorker({ leaseMs: LEASE_MS, graceMs: GRACE_MS, concurrency: 2, queues: ['sigterm-comp'] });
    const handle = await t.engine.start(comp, undefined);
    await waitFor('the run to wait', async () => (await t.engine.getRun(handle.runId))?.status === 'WAITING');
    expect(await t.engine.cancel(handle.runId)).toBe('CANCELLING');
    // The stopping worker claims the cancelled run and is stuck in its compensation.
    await waitFor(
      'the compensation to start',
      async () =>
        (await db.pool.query(`select 1 from sigterm_effects where run_id = $1 and step = 'undo-started'`, [handle.runId])).rowCount,
    );
    const held = (await db.pool.query('select status, lease_owner from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(held).toEqual({ status: 'CANCELLING', lease_owner: stopping.workerId });
    const taker = await cliWorker({ leaseMs: LEASE_MS, concurrency: 2, queues: ['sigterm-comp'] });

    stopping.kill('SIGTERM');
    const exit = await exitWithin(stopping, GRACE_MS + EXIT_BOUND_MS);
    expect(exit).toMatchObject({ code: 0, signal: null });
    const after = (await db.pool.query('select status, lease_owner from runledger.runs where run_id = $1', [handle.runId])).rows[0];
    expect(after.lease_owner).not.toBe(stopping.workerId);
    expect(after.status).toBe('CANCELLING'); // still to be compensated, by someone else
    const exitedAt = Date.now();

    await db.pool.query(`update fault_switch set on_ = false where name = 'comp-hang'`);
    await waitFor('the cancel to complete', async () => (await t.engine.getRun(handle.runId))?.status === 'CANCELLED', 20_000);
    expect(Date.now() - exitedAt).toBeLessThan(LEASE_MS);
    const releases = await releasesOf(stopping.workerId);
    expect(releases).toHaveLength(1);
    expect(releases[0]).toMatchObject({ run_id: handle.runId, reason: 'worker_stopped' });
    const claimedBy = await db.pool.query(
      `select detail->>'worker' as worker from runledger.events where run_id = $1 and kind = 'claimed' order by event_id desc limit 1`,
      [handle.runId],
    );
    expect(claimedBy.rows[0].worker).toBe(taker.workerId);
    expect(await leaseExpiries([handle.runId])).toBe(0);
    const undone = await db.pool.query(`select count(*)::int as n from sigterm_effects where run_id = $1 and step = 'undo'`, [
      handle.runId,
    ]);
    expect(undone.rows[0].n).toBe(1);
  }, 60_000);

  it('with the database unreachable during the stop, the worker still exits after its grace period; the leases expire for the other worker', async () => {
    const LEASE_MS = 3_000;
    const GRACE_MS = 1_000;
    const RUNS = 20;
    const target = new URL(db.url);
    const proxy = await BlackholeProxy.start({ host: target.hostname, port: Number(target.port || 5432) });
    try {
      const viaProxy = new URL(db.url);
      viaProxy.hostname = '127.0.0.1';
      viaProxy.port = String(proxy.port);
      // A queue of its own, as in the forced cases: the shared worker could take every deaf run first.
      const queue = 'sigterm-unreachable';
      const cut = await cliWorker({
        leaseMs: LEASE_MS,
        graceMs: GRACE_MS,
        url: viaProxy.toString(),
        queues: [queue],
        env: { SIGTERM_HANG_MS: '60000' },
      });
      const { runIds, deaf } = await startRuns(RUNS, queue);
      await waitFor('the worker to hold a deaf step in flight', async () => (await deafHeldBy(cut.workerId, deaf)) >= 1);
      // The worker the leases expire for.
      await cliWorker({ leaseMs: LEASE_MS, queues: [queue] });

      proxy.blackhole(); // no answer, no error: every query of the stop waits
      cut.kill('SIGTERM');
      const exit = await exitWithin(cut, GRACE_MS + 12_000);
      expect(exit).toMatchObject({ code: 0, signal: null });
      expect(cut.output()).toContain('their leases will expire');

      await waitFor('every run to end', () => allTerminal(runIds), 40_000);
      const facts = await checkInvariants(runIds);
      expect(await leaseExpiries(runIds)).toBeGreaterThanOrEqual(1);
      console.log(
        `SIGTERM with the database unreachable: ${RUNS} runs, exit 0 after ${exit.tookMs} ms (grace ${GRACE_MS} ms), ` +
          `lease expiries ${await leaseExpiries(runIds)}, lost ${facts.lost}, duplicated ${facts.duplicated}`,
      );
    } finally {
      await proxy.stop();
    }
  }, 60_000);
});
