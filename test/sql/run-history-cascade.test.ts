/**
 * events.run_id and steps.run_id have no foreign key (sql/0002_runs.sql): the
 * statement-level triggers on runs delete a deleted run's events and checkpoints and empty
 * both tables on TRUNCATE, as ON DELETE CASCADE did. The delete reads them by their keys
 * (run_id first) whatever the statistics say.
 */
import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { useTestEngine } from '../helpers/test-engine.js';
import { runHelpers, registerWorkflowW, ULID } from '../helpers/runs.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });
const { startRun, events } = runHelpers(db);

const steps = async (runId: string): Promise<number[]> =>
  (await db.pool.query('select seq from runledger.steps where run_id = $1 order by seq', [runId])).rows.map((r) => r.seq);

const count = async (sql: string, params: unknown[] = []): Promise<number> =>
  Number((await db.pool.query(sql, params)).rows[0].n);

async function finishedRun(): Promise<string> {
  const runId = await startRun();
  await db.pool.query(
    `update runledger.runs set status = 'RUNNING', lease_owner = 'w1', lease_expires_at = now() + interval '1 minute' where run_id = $1`,
    [runId],
  );
  await db.pool.query(
    `update runledger.runs set status = 'SUCCEEDED', finished_at = now(), termination_reason = 'COMPLETED',
            lease_owner = null, lease_expires_at = null where run_id = $1`,
    [runId],
  );
  await db.pool.query(`insert into runledger.events (run_id, kind) values ($1, 'note'), ($1, 'note')`, [runId]);
  await db.pool.query(
    `insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
     select $1, g, 's' || g, 'step', 'SUCCEEDED', to_jsonb(g), 1, now(), now(), 1 from generate_series(0, 1) g`,
    [runId],
  );
  return runId;
}

/** The plans auto_explain reports (nested statements too) while one run is deleted on a connection of its own. */
async function plansOfDeleting(runId: string): Promise<string[]> {
  const plans: string[] = [];
  const client = new pg.Client({ connectionString: db.url });
  client.on('notice', (notice) => {
    if (notice.message?.startsWith('duration:')) plans.push(notice.message);
  });
  await client.connect();
  try {
    await client.query(`load 'auto_explain'`);
    await client.query(`set auto_explain.log_min_duration = 0`);
    await client.query(`set auto_explain.log_nested_statements = on`);
    await client.query(`set auto_explain.log_level = notice`);
    await client.query('delete from runledger.runs where run_id = $1', [runId]);
  } finally {
    await client.end();
  }
  return plans;
}

describe('events and checkpoints go with their runs (no foreign key)', () => {
  it('the foreign keys are gone and both triggers are there', async () => {
    for (const table of ['runledger.events', 'runledger.steps']) {
      expect(await count(`select count(*) as n from pg_constraint where conrelid = $1::regclass and contype = 'f'`, [table])).toBe(0);
    }
    const triggers = await db.pool.query(
      `select tgname from pg_trigger where tgrelid = 'runledger.runs'::regclass and tgname like 'runs_%_history' order by tgname`,
    );
    expect(triggers.rows.map((r) => r.tgname)).toEqual(['runs_delete_history', 'runs_truncate_history']);
  });

  it('a statement deleting runs deletes exactly their events and checkpoints, in that statement', async () => {
    const gone = [await finishedRun(), await finishedRun(), await finishedRun()];
    const kept = await finishedRun();
    expect(await count('select count(*) as n from runledger.events where run_id = any($1)', [gone])).toBe(9);
    expect(await count('select count(*) as n from runledger.steps where run_id = any($1)', [gone])).toBe(6);
    const client = await db.pool.connect();
    try {
      await client.query('begin');
      const deleted = await client.query('delete from runledger.runs where run_id = any($1)', [gone]);
      expect(deleted.rowCount).toBe(3);
      // Inside the deleting transaction, right after the statement: nothing of them is left.
      expect(Number((await client.query('select count(*) as n from runledger.events where run_id = any($1)', [gone])).rows[0].n)).toBe(0);
      expect(Number((await client.query('select count(*) as n from runledger.steps where run_id = any($1)', [gone])).rows[0].n)).toBe(0);
      await client.query('commit');
    } finally {
      client.release();
    }
    expect(await events(kept)).toHaveLength(3);
    expect(await steps(kept)).toEqual([0, 1]);
    expect(await count('select count(*) as n from runledger.events where run_id = any($1)', [gone])).toBe(0);
    expect(await count('select count(*) as n from runledger.steps where run_id = any($1)', [gone])).toBe(0);
  });

  it('a rolled-back delete keeps the runs, their events and their checkpoints', async () => {
    const runId = await finishedRun();
    const client = await db.pool.connect();
    try {
      await client.query('begin');
      await client.query('delete from runledger.runs where run_id = $1', [runId]);
      await client.query('rollback');
    } finally {
      client.release();
    }
    expect(await events(runId)).toHaveLength(3);
    expect(await steps(runId)).toEqual([0, 1]);
  });

  it('prune of finished runs takes their events and checkpoints, with no rule of their own', async () => {
    const runId = await finishedRun();
    await db.pool.query(`update runledger.runs set finished_at = now() - interval '40 days' where run_id = $1`, [runId]);
    await db.pool.query(`select runledger.set_retention('runs', '30 days')`);
    try {
      await db.pool.query('select * from runledger.prune_due()');
      expect(await count('select count(*) as n from runledger.runs where run_id = $1', [runId])).toBe(0);
      expect(await events(runId)).toEqual([]);
      expect(await steps(runId)).toEqual([]);
    } finally {
      await db.pool.query(`select runledger.clear_retention('runs')`);
    }
  });

  it('the delete reads events by events_pkey, not by a scan, on a table whose statistics lag', async () => {
    // 20,000 events of other runs, never analysed: a plan from the statistics of an empty
    // table would be as happy to scan.
    const other = await startRun();
    await db.pool.query(
      `insert into runledger.events (run_id, kind) select $1, 'note' from generate_series(1, 20000)`,
      [other],
    );
    const runId = await finishedRun();
    const plans = await plansOfDeleting(runId);
    const nested = plans.filter((plan) => plan.includes('delete from runledger.events'));
    expect(nested, plans.join('\n---\n')).toHaveLength(1);
    expect(nested[0]).toMatch(/(Index|Index Only|Bitmap Index) Scan (using|on) events_pkey/);
    expect(nested[0]).not.toMatch(/Seq Scan on events/);
    expect(await events(runId)).toEqual([]);
    expect(await events(other)).toHaveLength(20_001);
  });

  it('the delete reads steps by steps_pkey, not by a scan, on a table whose statistics lag', async () => {
    const other = await startRun();
    await db.pool.query(
      `insert into runledger.steps (run_id, seq, name, kind, status, attempts, started_at, finished_at, fencing_token)
       select $1, g, 's', 'step', 'SUCCEEDED', 1, now(), now(), 1 from generate_series(0, 19999) g`,
      [other],
    );
    const runId = await finishedRun();
    const plans = await plansOfDeleting(runId);
    const nested = plans.filter((plan) => plan.includes('delete from runledger.steps'));
    expect(nested, plans.join('\n---\n')).toHaveLength(1);
    expect(nested[0]).toMatch(/(Index|Index Only|Bitmap Index) Scan (using|on) steps_pkey/);
    expect(nested[0]).not.toMatch(/Seq Scan on steps/);
    expect(await steps(runId)).toEqual([]);
    expect(await count('select count(*) as n from runledger.steps where run_id = $1', [other])).toBe(20_000);
  });

  it('TRUNCATE of runs (with CASCADE, which the other tables need) empties events and steps', async () => {
    await finishedRun();
    expect(await count('select count(*) as n from runledger.events')).toBeGreaterThan(0);
    expect(await count('select count(*) as n from runledger.steps')).toBeGreaterThan(0);
    await db.pool.query('truncate runledger.runs cascade');
    expect(await count('select count(*) as n from runledger.events')).toBe(0);
    expect(await count('select count(*) as n from runledger.steps')).toBe(0);
  });
});

describe('ids made in SQL', () => {
  it('start_run without a run_id makes distinct ULIDs whose first 10 characters are the milliseconds', async () => {
    const before = Date.now();
    const ids = await Promise.all(Array.from({ length: 50 }, () => startRun()));
    const after = Date.now();
    expect(new Set(ids).size).toBe(50);
    const decode = (id: string): number =>
      [...id.slice(0, 10)].reduce((ms, char) => ms * 32 + '0123456789ABCDEFGHJKMNPQRSTVWXYZ'.indexOf(char), 0);
    for (const id of ids) {
      expect(id).toMatch(ULID);
      expect(decode(id)).toBeGreaterThanOrEqual(before - 5_000);
      expect(decode(id)).toBeLessThanOrEqual(after + 5_000);
    }
    // 16 characters of randomness: no two share them.
    expect(new Set(ids.map((id) => id.slice(10))).size).toBe(50);
  });

  it('start_runs makes ULIDs that sort in input order, and two calls share none', async () => {
    const inputs = Array.from({ length: 1_200 }, (_, n) => ({ n }));
    const call = async (): Promise<string[]> =>
      (await db.pool.query(`select runledger.start_runs('w', $1::jsonb) as ids`, [JSON.stringify(inputs)])).rows[0].ids;
    const [first, second] = [await call(), await call()];
    for (const ids of [first, second]) {
      expect(ids).toHaveLength(1_200);
      for (const id of ids) expect(id).toMatch(ULID);
      expect([...ids].sort()).toEqual(ids);
      // One prefix per call (milliseconds and random bits), then the position in 9 digits.
      expect(new Set(ids.map((id) => id.slice(0, 17))).size).toBe(1);
      ids.forEach((id, k) => expect(id.slice(17)).toBe(String(k).padStart(9, '0')));
    }
    expect(new Set([...first, ...second]).size).toBe(2_400);
  });
});
