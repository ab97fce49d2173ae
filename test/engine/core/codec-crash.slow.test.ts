import { randomBytes } from 'node:crypto';
import { afterAll, describe, expect, it, onTestFailed } from 'vitest';
import { aesGcmCodec, type Engine } from '../../../src/index.js';
import { createTestEngine } from '../../../src/testing/index.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { waitFor } from '../../helpers/database.js';
import { spawnWorker } from '../../helpers/worker-process.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { whereStored } from '../../helpers/where-stored.js';
import { createFixtureTables, defineFixtureWorkflows } from '../../fixtures/workflows.js';

/**
 * The payload codec across a worker process killed with SIGKILL (codec.test.ts has the rest,
 * in-process): the next process replays the encrypted checkpoints and re-runs only the step
 * the crash cut off, and no clear payload is stored anywhere.
 */
const t = useTestEngine({ engine: false });
const { db } = t;
const engines: Engine[] = [];
afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
});
const K1 = randomBytes(32);
const k1Only = () => aesGcmCodec({ keys: { k1: K1 }, activeKey: 'k1' });
const one = async <T = Record<string, unknown>>(text: string, values: unknown[] = []) => (await db.pool.query(text, values)).rows[0] as T;

describe('a worker process SIGKILLed', () => {
  const { processes } = stoppedAfterEach();
  const spawn = async (env: Record<string, string> = {}) => {
    const w = await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '1000', CONCURRENCY: '4', CODEC_KEY: K1.toString('base64'), ...env });
    processes.push(w);
    onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
    return w;
  };

  it('before a checkpoint: the next process replays the encrypted checkpoints and re-runs only that step', async () => {
    await createFixtureTables(db.pool);
    const engine = createTestEngine({ connectionString: db.url, codec: k1Only() });
    engines.push(engine);
    const { order } = defineFixtureWorkflows(engine);
    const runIds: string[] = [];
    for (let i = 1; i <= 3; i++) runIds.push((await engine.start(order, { item: `sealed${i}`, amount: i })).runId);
    const doomed = await spawn({ RUNLEDGER_FAILPOINTS: 'before-checkpoint:charge' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const load = await one<{ n: number; key: string }>(
      `select count(*)::int as n, min(output->>'$enc') as key from runledger.steps where run_id = any($1) and name = 'load'`,
      [runIds],
    );
    expect(load.n).toBeGreaterThan(0);
    expect(load.key).toBe('k1');

    await spawn();
    await waitFor('the orders to finish', async () =>
      (await engine.listRuns({ workflow: 'order' })).every((r) => !runIds.includes(r.runId) || r.status === 'SUCCEEDED'),
    );
    for (const [i, runId] of runIds.entries()) {
      expect(await engine.getRun(runId)).toMatchObject({
        status: 'SUCCEEDED',
        input: { item: `sealed${i + 1}` },
        output: { charged: (i + 1) * 100 },
      });
    }
    // A step checkpointed by the first process (token 1) never ran again; the step the crash cut off did.
    const facts = await db.pool.query<{ name: string; token: number; executions: number }>(
      `select s.name, s.fencing_token::int as token,
              (select count(*)::int from step_executions e where e.run_id = s.run_id and e.step = s.name) as executions
         from runledger.steps s where s.run_id = any($1)`,
      [runIds],
    );
    expect(facts.rows).toHaveLength(3 * 4);
    for (const fact of facts.rows.filter((f) => f.token === 1)) expect(fact).toMatchObject({ executions: 1 });
    expect(facts.rows.filter((f) => f.name === 'charge' && f.executions === 2).length).toBeGreaterThanOrEqual(1);
    expect(await whereStored(db.pool, 'sealed1')).toEqual([]);
  });
});
