/**
 * GroupCommit (src/engine/worker/group-commit.ts) against a real database: items submitted while
 * a batch is in flight share the next round trip, and an item's own failure rejects only
 * that item. Runs are started and claimed from SQL (start_run, _claim_batch); items are
 * built with the exported checkpointItem / completeItem helpers, as the worker does.
 */
import { afterEach, describe, expect, it } from 'vitest';
import pg from 'pg';
import { BatchItemError, GroupCommit } from '../../../src/engine/worker/group-commit.js';
import { checkpointItem, completeItem, type StepItemValues } from '../../../src/engine/run/commit-items.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { claimRun } from '../../helpers/claim.js';

const { db } = useTestEngine({
  engine: false,
  prepare: async (db) => {
    await db.pool.query(`select runledger._register_workflow('gc', '1', 'default', 3)`);
  },
});

/** The pool the group commit under test sends through (its query is wrapped to count round trips). */
let pools: pg.Pool[] = [];

afterEach(async () => {
  await Promise.all(pools.map((pool) => pool.end()));
  pools = [];
});

/** A pool whose every query is recorded: the number of items of each _commit_batch call, in call order. */
function countingPool(): { pool: pg.Pool; batches: number[] } {
  const pool = new pg.Pool({ connectionString: db.url, max: 2 });
  pool.on('error', () => {});
  pools.push(pool);
  const batches: number[] = [];
  const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
  (pool as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = (...args: unknown[]) => {
    const config = args[0] as { text?: string; values?: unknown[] };
    expect(config.text).toMatch(/runledger\._commit_batch/);
    // Counted without parsing: an item may be one the server refuses (the tests of a poisoned batch).
    batches.push((String(config.values![0]).match(/\{"op":/g) ?? []).length);
    return query(...args);
  };
  return { pool, batches };
}

/** The end of this turn of the event loop: what the group commit submitted in it has been sent. */
const tick = () => new Promise<void>((resolve) => setImmediate(resolve));

let claiming: Promise<unknown> = Promise.resolve();

/**
 * A started and claimed run, with its fencing token as text (as pg gives a bigint). One
 * at a time: a claim takes the queue's first runnable run, which must be this one.
 */
function claimedRun(label: string): Promise<{ runId: string; token: string }> {
  const turn = claiming.then(() => startAndClaim(label));
  claiming = turn.catch(() => undefined);
  return turn;
}

async function startAndClaim(label: string): Promise<{ runId: string; token: string }> {
  const started = await db.pool.query(`select runledger.start_run('gc', '{}'::jsonb, $1::jsonb) as run_id`, [
    JSON.stringify({ run_id: `${label}-${Math.random().toString(36).slice(2, 10)}` }),
  ]);
  const runId = started.rows[0].run_id as string;
  const claimed = await claimRun(db, runId, { worker: 'wk-gc', leaseMs: 60_000 });
  expect(claimed, `claim of ${runId}`).toHaveLength(1);
  return { runId, token: String(claimed[0]!.fencing_token) };
}

function step(runId: string, token: string, seq: number, extra: Partial<StepItemValues> = {}): StepItemValues {
  return {
    runId,
    token,
    seq,
    name: `s${seq}`,
    kind: 'step',
    status: 'SUCCEEDED',
    outputText: JSON.stringify({ runId, seq }),
    errorJson: null,
    attempts: 1,
    startedMsAgo: 0,
    charge: null,
    ...extra,
  };
}

async function stepRows(runId: string): Promise<Array<{ seq: number; name: string; status: string; output: unknown; token: string }>> {
  const result = await db.pool.query(
    `select seq, name, status, output, fencing_token::text as token from runledger.steps where run_id = $1 order by seq`,
    [runId],
  );
  return result.rows;
}

async function runRow(runId: string): Promise<Record<string, any>> {
  return (await db.pool.query('select * from runledger.runs where run_id = $1', [runId])).rows[0];
}

describe('GroupCommit', () => {
  it('sends items submitted while a batch is in flight together in the next batch: fewer round trips than items, all committed', async () => {
    const { pool, batches } = countingPool();
    const commits = new GroupCommit(pool);
    const runs = await Promise.all(['gc-a', 'gc-b', 'gc-c', 'gc-d', 'gc-e'].map(claimedRun));
    const perRun = 8;

    const items = runs.flatMap(({ runId, token }) => Array.from({ length: perRun }, (_, seq) => checkpointItem(step(runId, token, seq))));
    // The first item is sent at the end of its turn, alone; the rest are submitted while it is in flight.
    const first = commits.submit(items[0]!);
    await tick();
    expect(batches).toEqual([1]);
    const results = [await first, ...(await Promise.all(items.slice(1).map((item) => commits.submit(item))))];

    expect(results).toEqual(items.map(() => ({ runStatus: 'RUNNING' })));
    // They waited for it and went together.
    expect(batches).toEqual([1, items.length - 1]);
    expect(batches.length).toBeLessThan(items.length);
    for (const { runId, token } of runs) {
      expect(await stepRows(runId)).toEqual(
        Array.from({ length: perRun }, (_, seq) => ({ seq, name: `s${seq}`, status: 'SUCCEEDED', output: { runId, seq }, token })),
      );
    }
  });

  it('sends the items submitted in one turn of the event loop as one batch (the runs of a claim reach their commits together)', async () => {
    const { pool, batches } = countingPool();
    const commits = new GroupCommit(pool);
    const runs = await Promise.all(['gc-turn-a', 'gc-turn-b', 'gc-turn-c'].map(claimedRun));
    const items = runs.map(({ runId, token }) =>
      completeItem({ runId, token, outputText: '"done"', policyVersion: 'p/1', charge: null, step: step(runId, token, 0) }),
    );
    const submitted = items.map((item) => commits.submit(item, true));
    // Nothing goes before the turn ends: the first completion does not go alone.
    expect(batches).toEqual([]);
    expect(await Promise.all(submitted)).toEqual(items.map(() => ({ runStatus: 'SUCCEEDED' })));
    expect(batches).toEqual([items.length]);
    for (const { runId } of runs) expect(await runRow(runId)).toMatchObject({ status: 'SUCCEEDED', output: 'done' });
  });

  it('items submitted while a batch is in flight wait for it, then go together; maxBatch caps a batch', async () => {
    const { pool, batches } = countingPool();
    const commits = new GroupCommit(pool, 1, 4);
    const { runId, token } = await claimedRun('gc-cap');

    const first = commits.submit(checkpointItem(step(runId, token, 0)));
    await tick();
    const rest = Array.from({ length: 9 }, (_, i) => commits.submit(checkpointItem(step(runId, token, i + 1))));
    await tick();
    expect(batches).toEqual([1]); // the others wait for the batch in flight
    await first;
    await Promise.all(rest);
    expect(batches).toEqual([1, 4, 4, 1]);
    expect((await stepRows(runId)).map((s) => s.seq)).toEqual([0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);

    // Idle again: the next item is sent at the end of its turn, alone.
    await commits.submit(checkpointItem(step(runId, token, 10)));
    expect(batches).toEqual([1, 4, 4, 1, 1]);
  });

  it('one failing item (stale token) rejects with RL001; the others in the same batch resolve and are committed', async () => {
    const { pool, batches } = countingPool();
    const commits = new GroupCommit(pool);
    const a = await claimedRun('gc-ok-a');
    const b = await claimedRun('gc-ok-b');
    const done = await claimedRun('gc-done');
    const last = await claimedRun('gc-last');
    // A run given back and claimed again: its first token is stale.
    const taken = await claimedRun('gc-taken');
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'test')`, [taken.runId, taken.token]);
    const retaken = await claimRun(db, taken.runId, { worker: 'wk-other', leaseMs: 60_000 });
    expect(String(retaken[0]!.fencing_token)).toBe(String(Number(taken.token) + 1));

    // The first submission goes alone; everything below waits for it and shares one batch.
    const opener = commits.submit(checkpointItem(step(a.runId, a.token, 0)));
    await tick();
    const submitted = [
      commits.submit(checkpointItem(step(a.runId, a.token, 1))),
      commits.submit(checkpointItem(step(taken.runId, taken.token, 0))), // stale token
      commits.submit(checkpointItem(step(b.runId, b.token, 0))),
      commits.submit(completeItem({ runId: done.runId, token: done.token, outputText: '{"total":1}', policyVersion: 'p/1', charge: null })),
      commits.submit(
        completeItem({
          runId: last.runId,
          token: last.token,
          outputText: '"finished"',
          policyVersion: 'p/1',
          charge: null,
          step: step(last.runId, last.token, 0, { name: 'final', outputText: '[1,2]' }),
        }),
      ),
    ];
    await opener;
    const settled = await Promise.allSettled(submitted);
    expect(batches).toEqual([1, 5]);

    const failed = settled[1]!;
    expect(failed.status).toBe('rejected');
    const error = (failed as PromiseRejectedResult).reason;
    expect(error).toBeInstanceOf(BatchItemError);
    expect(error).toMatchObject({ name: 'BatchItemError', code: 'RL001' });
    expect((error as Error).message).toMatch(/lease lost/);

    expect(settled.map((s) => s.status)).toEqual(['fulfilled', 'rejected', 'fulfilled', 'fulfilled', 'fulfilled']);
    expect((settled[0] as PromiseFulfilledResult<unknown>).value).toEqual({ runStatus: 'RUNNING' });
    expect((settled[2] as PromiseFulfilledResult<unknown>).value).toEqual({ runStatus: 'RUNNING' });
    // A completion reports the status it left the run in.
    expect((settled[3] as PromiseFulfilledResult<unknown>).value).toEqual({ runStatus: 'SUCCEEDED' });
    expect((settled[4] as PromiseFulfilledResult<unknown>).value).toEqual({ runStatus: 'SUCCEEDED' });

    // The others committed.
    expect((await stepRows(a.runId)).map((s) => [s.seq, s.token])).toEqual([
      [0, a.token],
      [1, a.token],
    ]);
    expect((await stepRows(b.runId)).map((s) => [s.seq, s.token])).toEqual([[0, b.token]]);
    expect(await runRow(done.runId)).toMatchObject({ status: 'SUCCEEDED', output: { total: 1 }, termination_reason: 'COMPLETED' });
    expect(await runRow(last.runId)).toMatchObject({
      status: 'SUCCEEDED',
      output: 'finished',
      termination_reason: 'COMPLETED',
      termination_evidence: { steps: 1, budget_spent: 0 },
    });
    expect(await stepRows(last.runId)).toEqual([{ seq: 0, name: 'final', status: 'SUCCEEDED', output: [1, 2], token: last.token }]);
    // The stale one wrote nothing; the run stays with its new owner.
    expect(await stepRows(taken.runId)).toEqual([]);
    expect(await runRow(taken.runId)).toMatchObject({ status: 'RUNNING', lease_owner: 'wk-other' });
  });

  it('a batch that fails as a whole rejects every item with its error, and the next batch goes on', async () => {
    const { pool, batches } = countingPool();
    const commits = new GroupCommit(pool);
    const { runId, token } = await claimedRun('gc-lost');
    const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
    const lost = new Error('Connection terminated unexpectedly');
    let failNext = true;
    (pool as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = (...args: unknown[]) => {
      if (failNext) {
        failNext = false;
        batches.push(-1);
        return Promise.reject(lost);
      }
      return query(...args);
    };

    // Settled as it goes (it fails while the second is being submitted).
    const first = Promise.allSettled([commits.submit(checkpointItem(step(runId, token, 0)))]);
    await tick();
    const second = commits.submit(checkpointItem(step(runId, token, 1)));
    const settled = [...(await first), ...(await Promise.allSettled([second]))];
    // The first (alone) failed; the second, submitted while it was in flight, went in the next batch.
    expect(settled[0]).toEqual({ status: 'rejected', reason: lost });
    expect(settled[1]).toEqual({ status: 'fulfilled', value: { runStatus: 'RUNNING' } });
    expect(batches).toEqual([-1, 1]);
    expect((await stepRows(runId)).map((s) => s.seq)).toEqual([1]);
  });

  it('a lost connection rejects every item of a batch with 3+ items at once (no retry in halves: each caller settles its outcome)', async () => {
    const { pool, batches } = countingPool();
    const commits = new GroupCommit(pool);
    const runs = await Promise.all(['gc-lost-a', 'gc-lost-b', 'gc-lost-c'].map(claimedRun));
    const query = pool.query.bind(pool) as (...args: unknown[]) => Promise<unknown>;
    const lost = Object.assign(new Error('terminating connection due to administrator command'), { code: '57P01' });
    (pool as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = () => {
      batches.push(-1);
      (pool as unknown as { query: (...args: unknown[]) => Promise<unknown> }).query = query;
      return Promise.reject(lost);
    };
    const settled = await Promise.allSettled(runs.map(({ runId, token }) => commits.submit(checkpointItem(step(runId, token, 0)))));
    expect(settled.map((s) => s.status)).toEqual(['rejected', 'rejected', 'rejected']);
    expect(batches).toEqual([-1]);
  });

  it.each([
    ['a value jsonb cannot hold (\\u0000, 22P05)', '{"text":"a\\u0000b"}'],
    ['a lone surrogate (22P02)', '["\\ud83d"]'],
    ['an item that is not JSON at all (22P02)', '{"unclosed":'],
  ])(
    'one item that fails the whole statement, %s: the batch goes again in halves, only that item fails, every other commits once',
    async (_what, poisonOutput) => {
      const { pool, batches } = countingPool();
      const commits = new GroupCommit(pool);
      const runs = await Promise.all(Array.from({ length: 9 }, (_, i) => claimedRun(`gc-poison-${i}`)));
      const poisoned = runs[5]!;
      // The first item goes alone; the nine below share the next statement, which the server refuses as a whole.
      const opener = commits.submit(checkpointItem(step(runs[0]!.runId, runs[0]!.token, 0)));
      await tick();
      const submitted = runs.map(({ runId, token }) =>
        commits.submit(checkpointItem(step(runId, token, 1, runId === poisoned.runId ? { outputText: poisonOutput } : {}))),
      );
      await opener;
      const settled = await Promise.allSettled(submitted);

      expect(settled.map((s) => s.status)).toEqual(runs.map((r) => (r === poisoned ? 'rejected' : 'fulfilled')));
      const reason = (settled[5] as PromiseRejectedResult).reason as { code?: string };
      expect(reason.code).toMatch(/^22/);
      // The whole batch, then halves down to the poisoned item alone: each healthy item committed in exactly one of them.
      expect(batches[0]).toBe(1);
      expect(batches[1]).toBe(9);
      expect(batches.length).toBeGreaterThan(3);
      expect(batches.at(-1)).toBeGreaterThanOrEqual(1);
      for (const run of runs) {
        const rows = await stepRows(run.runId);
        const expected = run === poisoned ? [] : [1];
        if (run === runs[0]) expected.unshift(0);
        expect(
          rows.map((s) => s.seq),
          run.runId,
        ).toEqual(expected);
        expect(await runRow(run.runId)).toMatchObject({ status: 'RUNNING', recovery_attempts: 0 });
      }
    },
  );
});
