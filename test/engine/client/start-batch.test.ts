/**
 * engine.start calls made while another start is in flight go together in one statement
 * and one commit (client/start-batch.ts, runledger._start_many), whether the process's own
 * worker takes their runs or not, and each still gets its own answer.
 */
import { afterAll, describe, expect, it } from 'vitest';
import pg from 'pg';
import { createEngine, type Engine } from '../../../src/index.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';

const t = useTestEngine({ engine: false });
const { db } = t;
const { workers } = stoppedAfterEach();

const engines: Engine[] = [];
afterAll(async () => {
  for (const engine of engines) await engine.close();
});

/** The names of the start statements this engine's sessions sent, in order. */
const sent: string[] = [];
class CountingClient extends pg.Client {
  override query(...args: any[]): any {
    const name = args[0]?.name;
    if (typeof name === 'string' && /^runledger_start_(claimed|many|run)$/.test(name)) sent.push(name);
    return (super.query as (...a: unknown[]) => unknown)(...args);
  }
}

function engineFor(name: string) {
  const engine = createEngine({ pool: new pg.Pool({ connectionString: db.url, Client: CountingClient, max: 8 }), log: () => {} });
  engines.push(engine);
  let bodies = 0;
  const wf = engine.workflow({ name, queue: name }, async (ctx, input: { n: number }) => {
    await ctx.step('counted', () => ++bodies);
    return input.n * 2;
  });
  return { engine, wf, bodies: () => bodies };
}

/** How many transactions wrote the runs' created events (events are never updated, so xmin is the start's). */
async function startTransactions(runIds: string[]): Promise<number> {
  const { rows } = await db.pool.query(
    `select count(distinct xmin::text)::int as n from runledger.events where run_id = any($1) and kind = 'created'`,
    [runIds],
  );
  return rows[0].n;
}

describe('starts made together', () => {
  it('share statements and commits, and each run is claimed once and runs once', async () => {
    const { engine, wf, bodies } = engineFor('batched-starts');
    workers.push(await engine.runWorker({ concurrency: 32, pollIntervalMs: 600_000 }));
    sent.length = 0;
    const handles = await Promise.all(Array.from({ length: 24 }, (_, n) => engine.start(wf, { n })));
    const results = await Promise.all(handles.map((h) => h.result({ timeoutMs: 10_000 })));
    expect(results).toEqual(Array.from({ length: 24 }, (_, n) => n * 2));

    const runIds = handles.map((h) => h.runId);
    expect(new Set(runIds).size).toBe(24);
    // Made in one turn of the event loop, they went together: one statement, one commit.
    expect(sent).toEqual(['runledger_start_many']);
    expect(await startTransactions(runIds)).toBe(sent.length);
    const claims = await db.pool.query(
      `select count(*) filter (where kind = 'claimed')::int as claimed, count(distinct run_id)::int as runs
         from runledger.events where run_id = any($1)`,
      [runIds],
    );
    expect(claims.rows[0]).toEqual({ claimed: 24, runs: 24 });
    expect(bodies()).toBe(24);
  });

  it('without a worker in the process: the runs are started PENDING and announced once per batch; a worker elsewhere runs each once', async () => {
    const { engine, wf } = engineFor('batched-plain');
    const elsewhere = engineFor('batched-plain');
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    const heard: string[] = [];
    listener.on('notification', (n) => heard.push(n.payload ?? ''));
    await listener.query('listen runledger_runnable');
    try {
      sent.length = 0;
      const handles = await Promise.all(Array.from({ length: 12 }, (_, n) => engine.start(wf, { n })));
      const runIds = handles.map((h) => h.runId);
      expect(sent).toEqual(['runledger_start_many']);
      expect(await startTransactions(runIds)).toBe(sent.length);
      const pending = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'PENDING'`, [
        runIds,
      ]);
      expect(pending.rows[0].n).toBe(12);
      // One notification per statement: identical notifications of one transaction are sent once.
      await expect.poll(() => heard.length).toBe(sent.length);
      expect(new Set(heard)).toEqual(new Set(['batched-plain']));

      workers.push(await elsewhere.engine.runWorker({ concurrency: 4, pollIntervalMs: 100 }));
      const results = await Promise.all(handles.map((h) => h.result({ timeoutMs: 10_000 })));
      expect(results).toEqual(Array.from({ length: 12 }, (_, n) => n * 2));
      expect(elsewhere.bodies()).toBe(12);
    } finally {
      await listener.end();
    }
  });

  it('a batch that fails on one start is undone and each start sent again alone: the others run, that one gets its error', async () => {
    const { engine, wf, bodies } = engineFor('batched-refused');
    const other = engineFor('batched-other');
    // A run id that belongs to another workflow: starting it again under this one is refused (RL005).
    const taken = (await other.engine.start(other.wf, { n: 0 })).runId;
    workers.push(await engine.runWorker({ concurrency: 32, pollIntervalMs: 600_000 }));
    sent.length = 0;
    const starts = [
      ...Array.from({ length: 4 }, (_, n) => engine.start(wf, { n: n + 1 })),
      engine.start(wf, { n: 99 }, { runId: taken }),
      ...Array.from({ length: 3 }, (_, n) => engine.start(wf, { n: n + 5 })),
    ];
    const settled = await Promise.allSettled(starts);
    const refused = settled[4]!;
    expect(refused.status).toBe('rejected');
    expect((refused as PromiseRejectedResult).reason).toMatchObject({ code: 'INVALID_STATE' });
    expect(String((refused as PromiseRejectedResult).reason.message)).toMatch(/already belongs to workflow 'batched-other'/);

    const started = settled.filter((s): s is PromiseFulfilledResult<Awaited<(typeof starts)[number]>> => s.status === 'fulfilled');
    expect(started).toHaveLength(7);
    const results = await Promise.all(started.map((s) => s.value.result({ timeoutMs: 10_000 })));
    expect(results).toEqual([2, 4, 6, 8, 10, 12, 14]);
    expect(bodies()).toBe(7);
    // One batch of all eight (undone), then each of them alone (the refused one too).
    expect(sent).toEqual(['runledger_start_many', ...Array(8).fill('runledger_start_claimed')]);
    const runIds = started.map((s) => s.value.runId);
    const claims = await db.pool.query(`select count(*)::int as n from runledger.events where run_id = any($1) and kind = 'claimed'`, [
      runIds,
    ]);
    expect(claims.rows[0].n).toBe(7);
    // The refused start changed nothing of the run it named.
    const kept = await db.pool.query(`select workflow_name, input from runledger.runs where run_id = $1`, [taken]);
    expect(kept.rows[0]).toEqual({ workflow_name: 'batched-other', input: { n: 0 } });
  });
});
