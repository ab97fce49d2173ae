import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { expect } from 'vitest';
import { createEngine, type Engine } from '../../src/index.js';
import { waitFor } from '../helpers/database.js';
import type { TicketService } from '../helpers/ticket-service.js';
import { spawnWorker, type WorkerProcess } from '../helpers/worker-process.js';
import { createDrillTables, defineDrillWorkflows } from './drill-workflows.js';

export const DRILL_WORKER = fileURLToPath(new URL('./drill-worker.ts', import.meta.url));
const TERMINAL = ['SUCCEEDED', 'FAILED', 'DEAD_LETTER', 'CANCELLED', 'TERMINATED'];

const silent = () => {};

/** Migrates a fresh server and creates the drill's tables (through an engine that is closed again). */
export async function prepareServer(url: string): Promise<void> {
  const engine = createEngine({ connectionString: url, log: silent });
  try {
    await engine.migrate();
    await createDrillTables(engine.pool);
  } finally {
    await engine.close();
  }
}

/** The test's own engine (no worker): starts the runs and sends the signals. */
export function clientEngine(url: string): { engine: Engine } & ReturnType<typeof defineDrillWorkflows> {
  const engine = createEngine({ connectionString: url, log: silent, poolMax: 4 });
  return { engine, ...defineDrillWorkflows(engine) };
}

export async function drillWorker(url: string, env: Record<string, string> = {}): Promise<WorkerProcess> {
  return spawnWorker({ DATABASE_URL: url, CONCURRENCY: '16', LEASE_MS: '3000', ...env }, DRILL_WORKER);
}

/** Retries `fn` until it succeeds (the server may be down): how a real caller behaves during an outage. */
export async function retrying<T>(fn: () => Promise<T>, deadlineMs = 120_000): Promise<{ value: T; tries: number }> {
  const deadline = Date.now() + deadlineMs;
  for (let tries = 1; ; tries++) {
    try {
      return { value: await fn(), tries };
    } catch (error) {
      if (Date.now() > deadline) throw error;
      await new Promise((resolve) => setTimeout(resolve, Math.min(1000, 50 * tries)));
    }
  }
}

/**
 * Sends one 'go' signal per run (signal id go-<run>), `perSecond` a second, each retried
 * until accepted: a repeat after a lost answer is refused as a duplicate by its signal id.
 */
export function signalSender(engine: Engine, runIds: string[], perSecond: number): { done: Promise<{ sent: number; retries: number }> } {
  const done = (async () => {
    let retries = 0;
    const started = Date.now();
    for (let i = 0; i < runIds.length; i++) {
      const due = started + (i * 1000) / perSecond;
      if (due > Date.now()) await new Promise((resolve) => setTimeout(resolve, due - Date.now()));
      const { tries } = await retrying(() => engine.signal(runIds[i]!, 'go', { n: i }, { signalId: `go-${runIds[i]}` }));
      retries += tries - 1;
    }
    return { sent: runIds.length, retries };
  })();
  return { done };
}

/** A counter that grows with every claim, checkpoint and completion: the drill's sign of progress. */
export async function progress(url: string): Promise<number> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
  await client.connect();
  try {
    const result = await client.query(
      `select (select coalesce(max(event_id), 0) from runledger.events)::bigint + (select count(*) from runledger.steps) as n`,
    );
    return Number(result.rows[0].n);
  } finally {
    await client.end();
  }
}

/**
 * Milliseconds from now until progress() grows past `before` (the first claim or commit after a
 * fault). With `finished`: undefined when the work ended before the fault, so that nothing was
 * left to make progress on (the load's last runs finished while the server went down).
 */
export async function timeToRecover(url: string, before: number, finished?: () => Promise<boolean>): Promise<number | undefined> {
  const from = Date.now();
  let idle = false;
  try {
    await waitFor(
      'progress after the fault',
      async () => {
        if ((await progress(url).catch(() => before)) > before) return true;
        idle = (await finished?.().catch(() => false)) ?? false;
        return idle;
      },
      60_000,
    );
    if (idle) return undefined;
  } catch (error) {
    const client = new pg.Client({ connectionString: url });
    await client.connect();
    const state = await client.query(
      `select status, (lease_owner is not null) as leased, count(*)::int as n from runledger.runs group by 1, 2 order by 1, 2`,
    );
    const workers = await client.query(`select worker_id, last_heartbeat_at, stopped_at from runledger.workers`);
    await client.end();
    throw new Error(`${(error as Error).message}; runs: ${JSON.stringify(state.rows)}; workers: ${JSON.stringify(workers.rows)}`, {
      cause: error,
    });
  }
  return Date.now() - from;
}

export async function unfinished(url: string, runIds: string[]): Promise<number> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const result = await client.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status <> all($2)`, [
      runIds,
      TERMINAL,
    ]);
    return result.rows[0].n as number;
  } finally {
    await client.end();
  }
}

export interface DrillFacts {
  runs: number;
  lost: number;
  duplicated: number;
}

/**
 * The invariants, from the tables and the service: every run SUCCEEDED (its signal was
 * sent, so none may still wait), each transaction step's effect exactly once, one ticket
 * per run's key and the run's output naming it, each signal consumed once.
 */
export async function checkInvariants(url: string, runIds: string[], service: TicketService): Promise<DrillFacts> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const statuses = await client.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [
      runIds,
    ]);
    expect(statuses.rows).toEqual([{ status: 'SUCCEEDED', n: runIds.length }]);
    const effects = await client.query(
      `select r.run_id, count(*) filter (where e.step = 'reserve')::int as reserve, count(*) filter (where e.step = 'ship')::int as ship
         from unnest($1::text[]) r(run_id) left join drill_effects e on e.run_id = r.run_id group by r.run_id`,
      [runIds],
    );
    const lostEffects = effects.rows.filter((row) => row.reserve === 0 || row.ship === 0);
    const doubled = effects.rows.filter((row) => row.reserve > 1 || row.ship > 1);
    const outputs = await client.query(`select run_id, output from runledger.runs where run_id = any($1)`, [runIds]);
    const wrongTicket = outputs.rows.filter((row) => row.output?.ticket !== service.tickets.get(`drill-${row.run_id}`));
    const ticketsOfRuns = runIds.filter((id) => service.tickets.has(`drill-${id}`)).length;
    const signals = await client.query(
      `select count(*)::int as n, count(*) filter (where consumed_seq is not null)::int as consumed
         from runledger.signals where run_id = any($1)`,
      [runIds],
    );
    expect(lostEffects, 'runs missing a transaction-step effect').toEqual([]);
    expect(doubled, 'runs with a transaction-step effect twice').toEqual([]);
    expect(wrongTicket, 'runs whose output is not the ticket created under their key').toEqual([]);
    expect(ticketsOfRuns).toBe(runIds.length);
    expect(service.tickets.size, 'tickets created, one per key').toBe(runIds.length);
    expect(signals.rows[0], 'signals accepted and consumed, one per run').toEqual({ n: runIds.length, consumed: runIds.length });
    return { runs: runIds.length, lost: lostEffects.length, duplicated: doubled.length };
  } finally {
    await client.end();
  }
}

/** Runs of drill-hold: each SUCCEEDED with its one effect row, none lost and none written twice. */
export async function checkHoldRuns(url: string, runIds: string[]): Promise<void> {
  const client = new pg.Client({ connectionString: url });
  await client.connect();
  try {
    const rows = await client.query(
      `select r.run_id, r.status, count(e.id)::int as effects
         from runledger.runs r left join drill_effects e on e.run_id = r.run_id and e.step = 'hold-ship'
        where r.run_id = any($1) group by r.run_id, r.status`,
      [runIds],
    );
    expect(rows.rows.length).toBe(runIds.length);
    expect(rows.rows.filter((row) => row.status !== 'SUCCEEDED' || row.effects !== 1)).toEqual([]);
  } finally {
    await client.end();
  }
}

/** Log lines a worker printed: its stderr and stdout (one line each). */
export function logLines(worker: WorkerProcess): number {
  return worker.output().split('\n').filter(Boolean).length;
}
