import { afterEach, describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';

/**
 * Crash claims proven with real processes: a worker process is SIGKILLed (or
 * SIGSTOPped) at a chosen point, another one finishes, and the tables show that
 * nothing was lost or done twice.
 */
const t = useTestEngine({ fixtures: true });
const { db } = t;

afterEach(async () => {
  await db.pool.query('truncate step_executions, orders, fault_switch');
});
// Registered after the truncation above so it runs before it (hooks run in reverse): workers die first.
const { processes: spawned } = stoppedAfterEach();

async function worker(env: Record<string, string> = {}): Promise<WorkerProcess> {
  const w = await spawnWorker({ DATABASE_URL: db.url, LEASE_MS: '1000', CONCURRENCY: '4', ...env });
  spawned.push(w);
  onTestFailed(() => console.error(`--- worker ${w.pid} output ---\n${w.output().slice(-4000)}`));
  return w;
}

/** True when every run is terminal; otherwise throws a description of what is left (shown if waitFor times out). */
async function allFinished(runIds: string[]): Promise<boolean> {
  const result = await db.pool.query(
    `select run_id, status, recovery_attempts, lease_owner, updated_at,
            (select string_agg(kind, ',' order by event_id) from runledger.events e where e.run_id = r.run_id) as history,
            -- What makes it claimable (runledger._claim_batch), or when it will be.
            admitted, not_before, wake_at, lease_expires_at, fencing_token
       from runledger.runs r
      where run_id = any($1) and status not in ('SUCCEEDED','FAILED','DEAD_LETTER','CANCELLED','TERMINATED')`,
    [runIds],
  );
  if (result.rowCount === 0) return true;
  throw new Error(`${result.rowCount} unfinished, e.g. ${JSON.stringify(result.rows.slice(0, 3))}`);
}

/** Per run and step: checkpoint token and how many times the step body ran. */
async function stepFacts(runIds: string[]) {
  const result = await db.pool.query(
    `select s.run_id, s.name, s.fencing_token::int as token,
            (select count(*)::int from step_executions e where e.run_id = s.run_id and e.step = s.name) as executions
       from runledger.steps s where s.run_id = any($1)`,
    [runIds],
  );
  return result.rows as Array<{ run_id: string; name: string; token: number; executions: number }>;
}

async function assertOrdersExactlyOnce(runIds: string[]) {
  const result = await db.pool.query(
    `select r.run_id, count(o.*)::int as n from unnest($1::text[]) r(run_id) left join orders o on o.run_id = r.run_id group by r.run_id`,
    [runIds],
  );
  for (const row of result.rows) expect(row, `business rows of ${row.run_id}`).toEqual({ run_id: row.run_id, n: 2 });
}

async function startOrders(count: number): Promise<string[]> {
  const ids: string[] = [];
  for (let i = 0; i < count; i++) ids.push((await t.engine.start(t.fixtures.order, { item: `item${i}`, amount: i + 1 })).runId);
  return ids;
}

describe('SIGKILL mid-run', () => {
  it('before a step checkpoint: the next worker re-runs only that step; transaction rows exist once', async () => {
    const runIds = await startOrders(6);
    const doomed = await worker({ RUNLEDGER_FAILPOINTS: 'before-checkpoint:charge' });
    expect((await doomed.exited).signal).toBe('SIGKILL');

    await worker();
    await waitFor('all runs finished', () => allFinished(runIds));
    const runs = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [runIds]);
    expect(runs.rows).toEqual([{ status: 'SUCCEEDED', n: 6 }]);

    const facts = await stepFacts(runIds);
    expect(facts).toHaveLength(6 * 4);
    // A step checkpointed by the first worker (token 1) never ran again.
    for (const fact of facts.filter((f) => f.token === 1)) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ executions: 1 });
    // The crash point was really hit: some run executed 'charge' on the first worker, lost it, and ran it again.
    const rerun = facts.filter((f) => f.name === 'charge' && f.executions === 2);
    expect(rerun.length).toBeGreaterThanOrEqual(1);
    for (const fact of rerun) expect(fact.token).toBe(2);
    await assertOrdersExactlyOnce(runIds);
    const recovered = await db.pool.query(
      `select count(*)::int as n from runledger.events where run_id = any($1) and kind = 'lease_expired'`,
      [runIds],
    );
    expect(recovered.rows[0].n).toBeGreaterThanOrEqual(1);
  });

  it('right after a transaction step commits: the step is not run again and its rows exist once', async () => {
    const runIds = await startOrders(6);
    const doomed = await worker({ RUNLEDGER_FAILPOINTS: 'after-commit:reserve' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const committed = await db.pool.query(`select run_id from runledger.steps where run_id = any($1) and name = 'reserve'`, [runIds]);
    expect(committed.rows.length).toBeGreaterThanOrEqual(1);

    await worker();
    await waitFor('all runs finished', () => allFinished(runIds));
    const facts = await stepFacts(runIds);
    for (const row of committed.rows) {
      expect(facts.find((f) => f.run_id === row.run_id && f.name === 'reserve')).toMatchObject({ token: 1, executions: 1 });
    }
    for (const fact of facts.filter((f) => f.token === 1)) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ executions: 1 });
    await assertOrdersExactlyOnce(runIds);
  });
});

describe('SIGKILL after usage was charged with chargeNow, before the step checkpoint', () => {
  it('the charge of the lost attempt stays spent; the re-run charges its own, so both attempts count', async () => {
    const { runId } = await t.engine.start(t.fixtures.metered, undefined);
    const doomed = await worker({ RUNLEDGER_FAILPOINTS: 'before-checkpoint:model-call' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    // Killed after the provider reported usage and before the checkpoint: the usage is already committed.
    const spent = await db.pool.query('select budget_used from runledger.runs where run_id = $1', [runId]);
    expect(spent.rows[0].budget_used).toEqual({ tokens: 120, cost_usd: 0.01 });

    await worker();
    await waitFor('the run finished', () => allFinished([runId]));
    const run = await db.pool.query('select status, budget_used from runledger.runs where run_id = $1', [runId]);
    expect(run.rows[0]).toEqual({ status: 'SUCCEEDED', budget_used: { tokens: 240, cost_usd: 0.02 } });
    const executions = await db.pool.query(`select count(*)::int as n from step_executions where run_id = $1`, [runId]);
    expect(executions.rows[0].n).toBe(2);
  });
});

describe('SIGKILL after a start that claimed its run', () => {
  it('runs the process claimed at their start are recovered by the next worker; their rows exist once', async () => {
    const doomed = await worker({ START_ORDERS: '4', RUNLEDGER_FAILPOINTS: 'before-checkpoint:charge' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const doomedId = /ready (\S+)/.exec(doomed.output())![1]!;
    const runIds = (
      await db.pool.query<{ run_id: string }>(
        `select distinct run_id from runledger.events where kind = 'claimed' and detail->>'worker' = $1`,
        [doomedId],
      )
    ).rows.map((row) => row.run_id);
    expect(runIds.length).toBeGreaterThanOrEqual(1);
    // Claimed at their start: the created and the claimed event were written by one transaction.
    const atStart = await db.pool.query(
      `select count(*)::int as n from runledger.events c
         join runledger.events k on k.run_id = c.run_id and k.kind = 'claimed' and k.xmin = c.xmin
        where c.kind = 'created' and c.run_id = any($1)`,
      [runIds],
    );
    expect(atStart.rows[0].n).toBe(runIds.length);

    await worker();
    await waitFor('all runs finished', () => allFinished(runIds));
    const runs = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [runIds]);
    expect(runs.rows).toEqual([{ status: 'SUCCEEDED', n: runIds.length }]);
    const facts = await stepFacts(runIds);
    for (const fact of facts.filter((f) => f.token === 1)) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ executions: 1 });
    expect(facts.filter((f) => f.name === 'charge' && f.executions === 2).length).toBeGreaterThanOrEqual(1);
    await assertOrdersExactlyOnce(runIds);
    const recovered = await db.pool.query(
      `select count(*)::int as n from runledger.events where run_id = any($1) and kind = 'lease_expired'`,
      [runIds],
    );
    expect(recovered.rows[0].n).toBeGreaterThanOrEqual(1);
  });
});

describe('SIGKILL right after a start that claimed its run', () => {
  it('before the worker ran anything of it: the next worker recovers it and every step runs once', async () => {
    const doomed = await worker({ START_ORDERS: '2', RUNLEDGER_FAILPOINTS: 'after-start-claimed:order' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const doomedId = /ready (\S+)/.exec(doomed.output())![1]!;
    const claimed = await db.pool.query<{ run_id: string; status: string; lease_owner: string | null }>(
      `select r.run_id, r.status, r.lease_owner from runledger.runs r
        where exists (select 1 from runledger.events e where e.run_id = r.run_id and e.kind = 'claimed' and e.detail->>'worker' = $1)`,
      [doomedId],
    );
    // Committed with its claim, then the process died: RUNNING under the dead worker's lease, nothing run.
    expect(claimed.rows).toEqual([{ run_id: claimed.rows[0]!.run_id, status: 'RUNNING', lease_owner: doomedId }]);
    const runIds = claimed.rows.map((row) => row.run_id);
    expect(await stepFacts(runIds)).toEqual([]);

    await worker();
    await waitFor('the run finished', () => allFinished(runIds));
    const runs = await db.pool.query(`select status from runledger.runs where run_id = any($1)`, [runIds]);
    expect(runs.rows).toEqual([{ status: 'SUCCEEDED' }]);
    const facts = await stepFacts(runIds);
    expect(facts).toHaveLength(4);
    for (const fact of facts) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ token: 2, executions: 1 });
    await assertOrdersExactlyOnce(runIds);
  });
});

describe('SIGKILL right after starts that committed together', () => {
  it('before the worker ran any of them: the next worker recovers every one and every step runs once', async () => {
    const doomed = await worker({ START_TOGETHER: '6', CONCURRENCY: '8', RUNLEDGER_FAILPOINTS: 'after-start-claimed:order' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    const doomedId = /ready (\S+)/.exec(doomed.output())![1]!;
    const claimed = await db.pool.query<{ run_id: string; status: string; lease_owner: string | null }>(
      `select r.run_id, r.status, r.lease_owner from runledger.runs r
        where r.workflow_name = 'order'
          and exists (select 1 from runledger.events e where e.run_id = r.run_id and e.kind = 'claimed' and e.detail->>'worker' = $1)`,
      [doomedId],
    );
    // All six committed with their claims, then the process died: RUNNING under the dead
    // worker's lease, nothing of them run.
    expect(claimed.rows).toHaveLength(6);
    for (const row of claimed.rows) expect(row).toMatchObject({ status: 'RUNNING', lease_owner: doomedId });
    const runIds = claimed.rows.map((row) => row.run_id);
    // ...in one transaction (events are never updated: xmin is the start's).
    const starts = await db.pool.query(
      `select count(distinct xmin::text)::int as n from runledger.events where run_id = any($1) and kind in ('created', 'claimed')`,
      [runIds],
    );
    expect(starts.rows[0].n).toBe(1);
    expect(await stepFacts(runIds)).toEqual([]);

    await worker();
    await waitFor('the runs finished', () => allFinished(runIds));
    const runs = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [runIds]);
    expect(runs.rows).toEqual([{ status: 'SUCCEEDED', n: 6 }]);
    const facts = await stepFacts(runIds);
    expect(facts).toHaveLength(6 * 4);
    for (const fact of facts) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ token: 2, executions: 1 });
    await assertOrdersExactlyOnce(runIds);
  });
});

describe('SIGKILL in a group commit', () => {
  it('after a batch of several runs committed, before the worker heard: nothing committed there runs again, nothing is lost', async () => {
    // One-step runs first: the first batches complete some of them.
    const noopIds: string[] = [];
    for (let n = 0; n < 24; n++) noopIds.push((await t.engine.start(t.fixtures.noop, { n })).runId);
    const orderIds = await startOrders(24);
    const runIds = [...orderIds, ...noopIds];
    const doomed = await worker({ RUNLEDGER_FAILPOINTS: 'after-group-commit:batch', CONCURRENCY: '8' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    // The batch it died after did commit: several writes of the first claim (token 1) are there.
    const before = await db.pool.query(
      `select (select count(*)::int from runledger.steps where run_id = any($1) and fencing_token = 1) as checkpoints,
              (select count(*)::int from runledger.runs where run_id = any($1) and status = 'SUCCEEDED') as succeeded`,
      [runIds],
    );
    expect(before.rows[0].checkpoints + before.rows[0].succeeded).toBeGreaterThanOrEqual(2);

    await worker();
    await waitFor('all runs finished', () => allFinished(runIds));
    const statuses = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [
      runIds,
    ]);
    expect(statuses.rows).toEqual([{ status: 'SUCCEEDED', n: 48 }]);
    const facts = await stepFacts(runIds);
    expect(facts).toHaveLength(24 * 4 + 24);
    // Every checkpoint the first worker committed, the last batch's included, ran exactly once.
    const first = facts.filter((f) => f.token === 1);
    expect(first.length).toBeGreaterThanOrEqual(before.rows[0].checkpoints);
    for (const fact of first) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ executions: 1 });
    // The runs the first worker completed (its last batch's included) were not run again.
    const doomedId = /ready (\S+)/.exec(doomed.output())?.[1];
    expect(doomedId).toBeTruthy();
    const completedFirst = await db.pool.query(
      `select e.run_id from runledger.events e
        where e.run_id = any($1) and e.kind = 'completed' and e.fencing_token = 1
          and exists (select 1 from runledger.events c where c.run_id = e.run_id and c.kind = 'claimed' and c.detail->>'worker' = $2)`,
      [noopIds, doomedId],
    );
    expect(completedFirst.rows.length).toBeGreaterThanOrEqual(1);
    for (const row of completedFirst.rows) expect(facts.find((f) => f.run_id === row.run_id)?.executions).toBe(1);
    await assertOrdersExactlyOnce(orderIds);
  });
});

describe('SIGKILL before completion', () => {
  it("the last step's checkpoint commits with the completion: a kill between them re-runs only that step", async () => {
    const noopIds: string[] = [];
    for (let n = 0; n < 3; n++) noopIds.push((await t.engine.start(t.fixtures.noop, { n })).runId);
    const orderIds = await startOrders(3);
    const doomed = await worker({ RUNLEDGER_FAILPOINTS: 'before-complete:noop', CONCURRENCY: '1' });
    expect((await doomed.exited).signal).toBe('SIGKILL');
    // The one-step run the worker died in has no checkpoint: its only step ran, its result was pending.
    const killedIn = await db.pool.query(
      `select r.run_id, r.workflow_name from runledger.runs r where r.run_id = any($1) and r.status = 'RUNNING'`,
      [[...orderIds, ...noopIds]],
    );
    expect(killedIn.rows).toHaveLength(1);

    await worker();
    await waitFor('all runs finished', () => allFinished([...orderIds, ...noopIds]));
    const statuses = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [
      [...orderIds, ...noopIds],
    ]);
    expect(statuses.rows).toEqual([{ status: 'SUCCEEDED', n: 6 }]);
    await assertOrdersExactlyOnce(orderIds); // 'ship', the last step of order, is a transaction step: never deferred
    const facts = await stepFacts([...orderIds, ...noopIds]);
    expect(facts).toHaveLength(3 * 4 + 3);
    for (const fact of facts.filter((f) => f.token === 1)) expect(fact, `${fact.run_id}/${fact.name}`).toMatchObject({ executions: 1 });
    expect(killedIn.rows[0].workflow_name).toBe('noop');
    const rerun = facts.filter((f) => f.executions === 2);
    expect(rerun).toEqual([{ run_id: killedIn.rows[0].run_id, name: 'only', token: 2, executions: 2 }]);
  });
});

describe('zombie worker', () => {
  it('a worker paused past its lease is fenced out: its late transaction commits nothing', async () => {
    const handle = await t.engine.start(t.fixtures.slow, { ms: 2_500 });
    const zombie = await worker({ LEASE_MS: '800' });
    await waitFor('zombie inside the slow transaction', async () => {
      const r = await db.pool.query(`select 1 from step_executions where run_id = $1 and step = 'slow-write' and pid = $2`, [
        handle.runId,
        zombie.pid,
      ]);
      return r.rowCount === 1;
    });
    zombie.kill('SIGSTOP');

    const survivor = await worker({ LEASE_MS: '800' });
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('done');
    zombie.kill('SIGCONT');
    await waitFor('zombie noticed it lost the run', async () => /lease/i.test(zombie.output()));

    const orders = await db.pool.query(`select item from orders where run_id = $1`, [handle.runId]);
    expect(orders.rows).toEqual([{ item: 'slow' }]);
    const steps = await db.pool.query(`select seq, name, fencing_token::int as token from runledger.steps where run_id = $1 order by seq`, [
      handle.runId,
    ]);
    expect(steps.rows).toEqual([
      { seq: 0, name: 'first', token: 1 },
      { seq: 1, name: 'slow-write', token: 2 },
      { seq: 2, name: 'last', token: 2 },
    ]);
    const run = await t.engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED', fencingToken: '2', recoveryAttempts: 1 });
    const last = await db.pool.query(`select pid from step_executions where run_id = $1 and step = 'last'`, [handle.runId]);
    expect(last.rows).toEqual([{ pid: survivor.pid }]);
  });
});

describe('poison run', () => {
  it('dead-letters after maxRecoveryAttempts; retry_run from SQL completes it once the fault is gone', async () => {
    await db.pool.query(`insert into fault_switch values ('boom', true)`);
    const handle = await t.engine.start(t.fixtures.poison, undefined);
    const deadLettered = async () =>
      (await db.pool.query(`select 1 from runledger.dead_letter where run_id = $1`, [handle.runId])).rowCount === 1;
    // Each worker dies in 'boom'; the next one recovers the run after the lease expires.
    for (let i = 0; i < 6 && !(await deadLettered()); i++) {
      const w = await worker();
      await Promise.race([w.exited, waitFor('dead letter', deadLettered)]);
    }
    const run = await t.engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'DEAD_LETTER', terminationReason: 'MAX_RECOVERY_ATTEMPTS', recoveryAttempts: 2 });
    expect(run?.terminationEvidence).toMatchObject({ recovery_attempts: 2, max_recovery_attempts: 2 });
    const before = await db.pool.query(`select step, count(*)::int as n from step_executions where run_id = $1 group by 1 order by 1`, [
      handle.runId,
    ]);
    expect(before.rows).toEqual([
      { step: 'before', n: 1 },
      { step: 'boom', n: 3 },
    ]);

    await db.pool.query(`update fault_switch set on_ = false where name = 'boom'`);
    await expect(db.pool.query(`select runledger.retry_run($1) as status`, [handle.runId])).resolves.toMatchObject({
      rows: [{ status: 'PENDING' }],
    });
    await worker();
    await expect(handle.result({ timeoutMs: 30_000 })).resolves.toBe('survived');
    const after = await db.pool.query(`select step, count(*)::int as n from step_executions where run_id = $1 group by 1 order by 1`, [
      handle.runId,
    ]);
    expect(after.rows).toEqual([
      { step: 'before', n: 1 },
      { step: 'boom', n: 4 },
    ]);
  });
});

describe('a long run that keeps making progress', () => {
  it('survives more worker deaths than maxRecoveryAttempts when each dead worker committed a checkpoint', async () => {
    await db.pool.query(`insert into fault_switch values ('between', true)`);
    const handle = await t.engine.start(t.fixtures.marathon, undefined);
    const finished = async () =>
      (await db.pool.query(`select 1 from runledger.runs where run_id = $1 and runledger.is_terminal(status)`, [handle.runId])).rowCount ===
      1;
    // Legs 2 to 5 each kill the worker that first runs them: four deaths, with max_recovery_attempts 2.
    let deaths = 0;
    for (let i = 0; i < 8 && !(await finished()); i++) {
      const w = await worker();
      const exit = await Promise.race([w.exited, waitFor('run finished', finished).then(() => undefined)]);
      if (exit?.signal === 'SIGKILL') deaths++;
    }
    const run = await t.engine.getRun(handle.runId);
    expect(run).toMatchObject({ status: 'SUCCEEDED', output: 15, recoveryAttempts: 1 });
    expect(deaths).toBe(4);
    const legs = await db.pool.query(`select step, count(*)::int as n from step_executions where run_id = $1 group by 1 order by 1`, [
      handle.runId,
    ]);
    // Each leg after the first ran twice (the death, then the recovery); no recorded leg ran again.
    expect(legs.rows).toEqual([
      { step: 'leg-1', n: 1 },
      { step: 'leg-2', n: 2 },
      { step: 'leg-3', n: 2 },
      { step: 'leg-4', n: 2 },
      { step: 'leg-5', n: 2 },
    ]);
  });
});

describe('many workers racing', () => {
  it('1,200 runs over 3 worker processes: every run completes, every checkpoint is written once', async () => {
    await db.pool.query(`select runledger._register_workflow('noop', '1', 'default', 10)`);
    const started = await db.pool.query(
      `select array_agg(runledger.start_run('noop', jsonb_build_object('n', g))) as ids from generate_series(1, 1100) g`,
    );
    const runIds: string[] = [...started.rows[0].ids, ...(await startOrders(100))];
    // No fault here, so no run may be claimed twice (max_token 1). A lease of 5 s rather than
    // the file's 1 s: on a loaded 2-core machine (three workers, the server and other test
    // files) a heartbeat delayed past 1 s can let a lease expire and another worker take the
    // run back (once in .ci/run: max_token 2), a recovery this test neither injects nor measures.
    const racer = { CONCURRENCY: '8', LEASE_MS: '5000' };
    await Promise.all([worker(racer), worker(racer), worker(racer)]);
    await waitFor('1,200 runs finished', () => allFinished(runIds), 120_000);

    const summary = await db.pool.query(
      `select count(*)::int as runs, count(*) filter (where status = 'SUCCEEDED')::int as succeeded,
              max(fencing_token)::int as max_token, count(distinct lease_owner)::int as owners
         from runledger.runs where run_id = any($1)`,
      [runIds],
    );
    expect(summary.rows[0]).toMatchObject({ runs: 1200, succeeded: 1200, max_token: 1 });
    const steps = await db.pool.query(`select count(*)::int as n from runledger.steps where run_id = any($1)`, [runIds]);
    expect(steps.rows[0].n).toBe(1100 + 100 * 4);
    const twice = await db.pool.query(
      `select run_id, step, count(*) from step_executions where run_id = any($1) group by 1, 2 having count(*) > 1`,
      [runIds],
    );
    expect(twice.rows).toEqual([]);
    const claimedBy = await db.pool.query(
      `select count(distinct detail->>'worker')::int as n from runledger.events where run_id = any($1) and kind = 'claimed'`,
      [runIds],
    );
    expect(claimedBy.rows[0].n).toBe(3);
    await assertOrdersExactlyOnce(runIds.slice(1100));
  });
});

describe('connection faults', () => {
  it('every session of a worker terminated mid-run (LISTEN included): runs finish, nothing lost or duplicated', async () => {
    const appName = `rl-faulty-${process.pid}`;
    const runIds = await startOrders(300);
    // A claim whose reply was lost may have committed: those runs are RUNNING under this
    // worker, which is not executing them, and its next claim takes them back (p_reclaim_except).
    const faulty = await worker({ PGAPPNAME: appName, CONCURRENCY: '8' });
    const killSessions = async () => {
      const killed = await db.pool.query(
        `select count(pg_terminate_backend(pid))::int as n from pg_stat_activity where application_name = $1`,
        [appName],
      );
      return killed.rows[0].n as number;
    };
    await waitFor('some runs done', async () => {
      const r = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'SUCCEEDED'`, [
        runIds,
      ]);
      return r.rows[0].n >= 5;
    });
    expect(await killSessions()).toBeGreaterThanOrEqual(2); // the engine pool and the LISTEN session at least
    await waitFor('worker reconnected', async () => {
      const r = await db.pool.query(`select count(*)::int as n from pg_stat_activity where application_name = $1`, [appName]);
      return r.rows[0].n > 0;
    });
    await waitFor('second round of sessions terminated', killSessions);

    // Runs started after the faults are claimed and run too.
    const later = await startOrders(10);
    await waitFor('all runs finished', () => allFinished([...runIds, ...later]), 50_000);
    expect(faulty.child.exitCode).toBeNull(); // the worker survived its connections dying
    const statuses = await db.pool.query(`select status, count(*)::int as n from runledger.runs where run_id = any($1) group by 1`, [
      [...runIds, ...later],
    ]);
    const failed = await db.pool.query(
      `select r.run_id, r.status, r.error, (select json_agg(json_build_object('kind', e.kind, 'detail', e.detail) order by e.event_id)
                                               from runledger.events e where e.run_id = r.run_id) as events
         from runledger.runs r where r.run_id = any($1) and r.status <> 'SUCCEEDED'`,
      [[...runIds, ...later]],
    );
    if (failed.rows.length > 0) console.error(`runs not SUCCEEDED: ${JSON.stringify(failed.rows, null, 1)}`);
    expect(statuses.rows).toEqual([{ status: 'SUCCEEDED', n: 310 }]);
    await assertOrdersExactlyOnce([...runIds, ...later]);
    const facts = await stepFacts([...runIds, ...later]);
    expect(facts).toHaveLength(310 * 4);
  }, 120_000);
});
