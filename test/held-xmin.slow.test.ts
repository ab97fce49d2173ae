import pg from 'pg';
import { expect, it } from 'vitest';
import { useTestEngine } from './helpers/test-engine.js';
import { waitFor } from './helpers/database.js';
import { runCli } from './helpers/cli.js';

/**
 * Fault drill (issue 18): a held xmin. A session sits idle in a repeatable-read transaction
 * while thousands of one-step runs flow through a worker: vacuum can remove none of the row
 * versions they leave. Claim latency (runs.started_at - created_at) must stay bounded, and
 * `runledger doctor` must warn while the snapshot is held, and not once it ends.
 */
const t = useTestEngine({ fixtures: true, worker: { concurrency: 8, pollIntervalMs: 200 } });
const { db } = t;
const BATCH = 100;

/** Starts BATCH noop runs in one statement, waits until they all succeeded, returns their claim latencies' p99 in ms. */
async function batchP99(): Promise<number> {
  const { rows } = await db.pool.query<{ ids: string[] }>(
    `select runledger.start_runs('noop', (select jsonb_agg(jsonb_build_object('n', i)) from generate_series(1, $1) i)) as ids`,
    [BATCH],
  );
  const ids = rows[0]!.ids;
  await waitFor('batch done', async () => {
    const done = await db.pool.query(`select count(*)::int as n from runledger.runs where run_id = any($1) and status = 'SUCCEEDED'`, [
      ids,
    ]);
    return done.rows[0].n === BATCH || undefined;
  });
  const p99 = await db.pool.query(
    `select percentile_cont(0.99) within group (order by extract(epoch from started_at - created_at) * 1000)::float8 as ms
       from runledger.runs where run_id = any($1)`,
    [ids],
  );
  return Math.round(p99.rows[0].ms);
}

const doctor = async () => {
  const result = await runCli(db.url, ['doctor', '--json', '--xmin-age-max', '1']);
  return JSON.parse(result.stdout).find((f: { check: string }) => f.check === 'held transactions') as { ok: boolean; detail: string };
};

it('an idle-in-transaction session held through 2,000 runs: claim latency stays bounded and doctor warns until it ends', async () => {
  const baseline: number[] = [];
  for (let i = 0; i < 5; i++) baseline.push(await batchP99());
  expect((await doctor()).ok).toBe(true);

  const holder = new pg.Client({ connectionString: db.url, application_name: 'held-xmin-drill' });
  await holder.connect();
  try {
    await holder.query('begin isolation level repeatable read');
    await holder.query('select txid_current()');
    const held: number[] = [];
    for (let i = 0; i < 20; i++) held.push(await batchP99());
    const during = await waitFor('doctor sees the held snapshot', async () => {
      const finding = await doctor();
      return finding.ok ? undefined : finding;
    });
    expect(during.detail).toContain(`pid ${(holder as unknown as { processID: number }).processID} (idle in transaction, held-xmin-drill)`);
    const dead = await db.pool.query(`select sum(n_dead_tup)::int as n from pg_stat_user_tables where schemaname = 'runledger'`);

    // Bounded: the last batches' p99 within a generous multiple of the first held batches' (it grows, but not without bound).
    const first = Math.max(...held.slice(0, 5));
    const last = Math.max(...held.slice(-5));
    expect(last).toBeLessThan(first * 5 + 1_000);
    console.log(
      `held-xmin drill: ${BATCH * (baseline.length + held.length)} runs, 1 held snapshot; claim p99 per batch of ${BATCH}: ` +
        `baseline ${baseline.join('/')} ms, held ${held.join('/')} ms; dead tuples in runledger's tables ${dead.rows[0].n}; doctor: ${during.detail}`,
    );
  } finally {
    await holder.query('rollback').catch(() => undefined);
    await holder.end();
  }
  const after = await doctor();
  expect(after.ok, after.detail).toBe(true);
}, 300_000);
