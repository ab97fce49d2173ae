/**
 * runledger._admit reads each key's head and only the later runs that could still place
 * in the round. Checked here against the rule it implements, written out as one plain
 * query over every waiting run: in random queues (limits, keys, priorities, delayed
 * runs, runs already holding slots), a round admits exactly the runs the rule picks, in
 * the rule's order.
 */
import { describe, expect, it } from 'vitest';
import pg from 'pg';
import { useTestEngine } from '../helpers/test-engine.js';
import { newRunId, registerWorkflowW } from '../helpers/runs.js';

const { db } = useTestEngine({ engine: false, prepare: registerWorkflowW });

/** A small seeded generator (mulberry32), so a failing case can be replayed from its seed. */
function random(seed: number): () => number {
  let a = seed;
  return () => {
    a = (a + 0x6d2b79f5) | 0;
    let t = Math.imul(a ^ (a >>> 15), 1 | a);
    t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

/**
 * The rule: every due waiting run gets a turn (its place among its key's due waiting runs
 * by priority, age and id, after the runs its key already has in slots); those within the
 * per-key limit are taken by priority, turn, age and id, as many as the queue has free.
 */
const RULE_SQL = `
  with active as (
    select coalesce(r.concurrency_key, '') as k, count(*) as n from runledger.runs r
     where r.queue_name = $1 and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted))
     group by 1),
  turns as (
    select r.run_id, r.priority, r.created_at,
           row_number() over (partition by coalesce(r.concurrency_key, '') order by r.priority, r.created_at, r.run_id)
             + coalesce(a.n, 0) as turn
      from runledger.runs r left join active a on a.k = coalesce(r.concurrency_key, '')
     where r.queue_name = $1 and r.status = 'PENDING' and not r.admitted
       and (r.not_before is null or r.not_before <= runledger.now()))
  select run_id from turns
   where $2::int is null or turn <= $2
   order by priority, turn, created_at, run_id
   limit greatest(0, least(1000, coalesce($3::int - (select coalesce(sum(n), 0) from active)::int, 1000)))`;

interface Case {
  expected: string[];
  admitted: string[];
  /** What runledger._admit_first_turns answered for the round (null: it left the round to the full read). */
  shortcut: string[] | null;
}

async function oneCase(client: pg.Client, seed: number): Promise<Case> {
  const rnd = random(seed);
  const pick = <T>(xs: readonly T[]): T => xs[Math.floor(rnd() * xs.length)]!;
  const queue = newRunId('rounds');
  const concurrency = pick([null, 2, 5, 12, 40]);
  const perKey = concurrency === null ? pick([1, 2, 4]) : pick([null, 1, 2, 4]); // a queue with no limit has no admission
  const keys = pick([1, 3, 8, 30]);
  const runs = pick([0, 5, 40, 150, 150]);
  await client.query(`select runledger.set_queue($1, jsonb_strip_nulls($2::jsonb))`, [
    queue,
    JSON.stringify({ concurrency, per_key_concurrency: perKey }),
  ]);
  const rows = Array.from({ length: runs }, () => ({
    key: rnd() < 0.1 ? null : `k${Math.floor(rnd() * keys)}`,
    priority: pick([0, 0, 0, -1, 2]),
    delayed: rnd() < 0.1,
  }));
  await client.query(
    `select runledger.start_run('w', '{}', jsonb_strip_nulls(jsonb_build_object('queue', $1::text, 'concurrency_key', r.key,
              'priority', r.priority, 'run_in_ms', case when r.delayed then 3600000 end)))
       from jsonb_to_recordset($2::jsonb) as r(key text, priority int, delayed boolean)`,
    [queue, JSON.stringify(rows)],
  );
  // Start over from nothing admitted, then put some runs in slots: some RUNNING, some
  // admitted and not yet claimed (both occupy a slot of their key).
  await client.query(`update runledger.runs set admitted = false, admitted_at = null where queue_name = $1 and status = 'PENDING'`, [queue]);
  const ids = (await client.query(`select run_id from runledger.runs where queue_name = $1 and not_before is null order by run_id`, [queue]))
    .rows.map((r) => r.run_id as string);
  // Fewer than the queue's concurrency, so a round usually has free slots.
  const occupied = ids.filter(() => rnd() < Math.floor(rnd() * (concurrency ?? 10)) / Math.max(ids.length, 1));
  const running = occupied.filter((_, i) => i % 3 !== 2);
  const held = occupied.filter((_, i) => i % 3 === 2);
  await client.query(
    `update runledger.runs set status = 'RUNNING', fencing_token = 1, lease_owner = 'wk-rounds',
            lease_expires_at = runledger.now() + interval '1 hour', started_at = runledger.now()
      where run_id = any($1)`,
    [running],
  );
  await client.query(`update runledger.runs set admitted = true, admitted_at = runledger.now() where run_id = any($1)`, [held]);

  const expected = (await client.query(RULE_SQL, [queue, perKey, concurrency])).rows.map((r) => r.run_id as string);
  const shortcut = await firstTurns(client, queue, concurrency);
  await client.query(`select runledger._admit($1)`, [queue]);
  const admitted = (
    await client.query(
      `select run_id from runledger.runs where queue_name = $1 and status = 'PENDING' and admitted and not (run_id = any($2))
        order by admitted_at, run_id`,
      [queue, held],
    )
  ).rows.map((r) => r.run_id as string);
  return { expected, admitted, shortcut };
}

/** runledger._admit_first_turns for the round _admit would run now: as many slots as the queue has free (1,000 without a limit). */
async function firstTurns(client: pg.Client, queue: string, concurrency: number | null): Promise<string[] | null> {
  const { rows } = await client.query(
    `select runledger._admit_first_turns($1, least(1000, coalesce($2::int - (
              select count(*) from runledger.runs r
               where r.queue_name = $1 and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted)))::int, 1000)),
            runledger.now()) as ids`,
    [queue, concurrency],
  );
  return rows[0].ids as string[] | null;
}

describe('runledger._admit', () => {
  it('admits exactly the runs the fair-turn rule picks, in its order, in 60 random queues', async () => {
    const client = new pg.Client({ connectionString: db.url });
    await client.connect();
    try {
      let rounds = 0;
      let shortcuts = 0;
      for (let seed = 1; seed <= 60; seed++) {
        await client.query('begin');
        try {
          const { expected, admitted, shortcut } = await oneCase(client, seed);
          expect({ seed, admitted }).toEqual({ seed, admitted: expected });
          if (expected.length > 0) rounds++;
          // The shortcut answers only when it has the whole answer, and then the rule's.
          if (shortcut !== null) {
            expect({ seed, shortcut }).toEqual({ seed, shortcut: expected });
            shortcuts++;
          }
        } finally {
          await client.query('rollback');
        }
      }
      // The cases are not vacuous: most rounds admit something.
      expect(rounds).toBeGreaterThan(30);
      // ...and the shortcut settles some of them (11 of 35 when written), so it is checked too.
      expect(shortcuts).toBeGreaterThan(5);
    } finally {
      await client.end();
    }
  });
});
