import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { useTestEngine } from '../../helpers/test-engine.js';

const t = useTestEngine({ fixtures: true, worker: { concurrency: 4, leaseMs: 2_000, pollIntervalMs: 100 } });
const { db } = t;

const executions = async (runId: string) =>
  Object.fromEntries(
    (await db.pool.query('select step, count(*)::int as n from step_executions where run_id = $1 group by 1', [runId])).rows.map((r) => [
      r.step,
      r.n,
    ]),
  );

describe('runledger.fork_run', () => {
  it('a fork reuses the checkpoints before from_step and runs the rest', async () => {
    const source = await t.engine.start(t.fixtures.order, { item: 'lamp', amount: 2 });
    await source.result();
    const forkId = (await db.pool.query(`select runledger.fork_run($1, 2) as id`, [source.runId])).rows[0].id as string;
    const fork = await t.engine.getRun(forkId);
    expect(fork).toMatchObject({
      status: expect.stringMatching(/PENDING|RUNNING|SUCCEEDED/),
      versionManifest: expect.objectContaining({ forked_from: source.runId, from_step: 2 }),
    });
    const { awaitResult } = await import('../../../src/engine/client/start.js');
    await expect(awaitResult({ getRun: (id: string) => t.engine.getRun(id) } as never, forkId)).resolves.toEqual({ charged: 200 });
    expect(await executions(forkId)).toEqual({ charge: 1, ship: 1 }); // load and reserve were reused
    const forkOrders = await db.pool.query('select item from orders where run_id = $1 order by item', [forkId]);
    expect(forkOrders.rows).toEqual([{ item: 'lamp:shipped' }]); // the reused transaction step did not write again
    const events = await db.pool.query(`select kind, detail from runledger.events where run_id = $1 and kind = 'forked'`, [source.runId]);
    expect(events.rows).toEqual([{ kind: 'forked', detail: { fork: forkId, from_step: 2, version: '1' } }]);
  });

  it('engine.fork from step 0 starts over; a from_step past the checkpoints is RL003', async () => {
    const source = await t.engine.start(t.fixtures.noop, { n: 7 });
    await source.result();
    const fork = await t.engine.fork<number>(source.runId, { fromStep: 0 });
    await expect(fork.result()).resolves.toBe(7);
    expect(await executions(fork.runId)).toEqual({ only: 1 });
    await expect(t.engine.fork(source.runId, { fromStep: 5 })).rejects.toMatchObject({ code: 'INVALID_INPUT' });
    await expect(t.engine.fork('missing', { fromStep: 0 })).rejects.toMatchObject({ code: 'NOT_FOUND' });
  });
});

describe('runledger.prune', () => {
  it('deletes finished runs older than the interval with all they own, and nothing else', async () => {
    const finished = await t.engine.start(t.fixtures.noop, { n: 1 });
    await finished.result();
    const waiting = t.engine.workflow({ name: 'stays', queue: 'default' }, async (ctx) => ctx.waitForSignal('never'));
    const live = await t.engine.start(waiting, undefined);

    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      await client.query(`select set_config('runledger.fake_now', $1, false)`, [new Date(Date.now() + 3 * 86_400_000).toISOString()]);
      const removed = (await client.query(`select runledger.prune('2 days') as n`)).rows[0].n;
      expect(Number(removed)).toBeGreaterThanOrEqual(1);
    } finally {
      await client.end();
    }
    expect(await t.engine.getRun(finished.runId)).toBeUndefined();
    const leftovers = await db.pool.query(
      `select (select count(*) from runledger.steps where run_id = $1) + (select count(*) from runledger.events where run_id = $1) as n`,
      [finished.runId],
    );
    expect(Number(leftovers.rows[0].n)).toBe(0);
    expect((await t.engine.getRun(live.runId))?.status).toMatch(/PENDING|RUNNING|WAITING/);
    await expect(db.pool.query(`select runledger.prune('-1 day')`)).rejects.toMatchObject({ code: 'RL003' });
  });
});
