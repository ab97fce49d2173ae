/**
 * runledger under a user's conditions, not the harness's: a database that already holds
 * history (20,000 finished runs, statistics left to autovacuum), callers that await their
 * results (a web handler's `start` then `await handle.result()`), and a burst started from
 * SQL while the worker runs. Only the public API and SQL, so any build can be measured:
 *   DATABASE_URL=postgres://... npx tsx user-conditions.ts      (from bench/)
 * Prints one JSON line. Never run by `npm test`.
 */
import pg from 'pg';
import { createEngine } from 'runledger';

const adminUrl = process.env.DATABASE_URL;
if (!adminUrl) throw new Error('set DATABASE_URL to a server where a scratch database can be created');
const HISTORY = Number(process.env.UC_HISTORY ?? 20_000);
const CALLERS = Number(process.env.UC_CALLERS ?? 16);
const AWAITED = Number(process.env.UC_AWAITED ?? 1_600);
const BURST = Number(process.env.UC_BURST ?? 20_000);
const DB = 'runledger_user_conditions';

const withDb = (url: string, db: string) => Object.assign(new URL(url), { pathname: `/${db}` }).toString();
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
await admin.query(`drop database if exists ${DB} with (force)`);
await admin.query(`create database ${DB}`);
await admin.end();

const url = withDb(adminUrl, DB);
const engine = createEngine({ connectionString: url, poolMax: 24, log: (level, message) => level === 'error' && console.error(message) });
await engine.migrate();
const one = engine.workflow({ name: 'uc-one' }, async (ctx) => ctx.step('only', () => 1));
const three = engine.workflow({ name: 'uc-three' }, async (ctx) => {
  const a = await ctx.step('a', () => 1);
  const b = await ctx.step('b', () => a + 1);
  return ctx.step('c', () => b + 1);
});
const worker = await engine.runWorker({ concurrency: 16 });
const pool = new pg.Pool({ connectionString: url, max: 4 });
// Register both workflows for start_run from SQL.
await (await engine.start(one, undefined)).result({ timeoutMs: 30_000 });
await (await engine.start(three, undefined)).result({ timeoutMs: 30_000 });

async function drained(workflow: string, expected: number, timeoutMs = 600_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const { rows } = await pool.query(`select count(*)::int as n from runledger.runs where workflow_name = $1 and status = 'SUCCEEDED'`, [
      workflow,
    ]);
    if (rows[0].n >= expected) return;
    if (Date.now() > deadline) throw new Error(`${workflow}: ${rows[0].n} of ${expected} done after ${timeoutMs} ms`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

// History: runs that finished before the measurement, as in a database that has been in use.
let t = performance.now();
await pool.query(`select runledger.start_run('uc-one', '{}'::jsonb) from generate_series(1, $1)`, [HISTORY]);
await drained('uc-one', HISTORY + 1);
const historyPerSec = HISTORY / ((performance.now() - t) / 1000);

// Callers awaiting results.
t = performance.now();
let next = 0;
await Promise.all(
  Array.from({ length: CALLERS }, async () => {
    while (next++ < AWAITED) await (await engine.start(three, undefined)).result({ timeoutMs: 120_000 });
  }),
);
const awaitedPerSec = AWAITED / ((performance.now() - t) / 1000);

// A burst from SQL while the worker runs.
t = performance.now();
await pool.query(`select runledger.start_run('uc-one', '{}'::jsonb) from generate_series(1, $1)`, [BURST]);
const enqueueMs = performance.now() - t;
await drained('uc-one', HISTORY + 1 + BURST);
const burstPerSec = BURST / ((performance.now() - t) / 1000);

await worker.stop();
await pool.end();
await engine.close();
console.log(
  JSON.stringify({
    history: HISTORY,
    historyDrainPerSec: Math.round(historyPerSec),
    callers: CALLERS,
    awaitedWorkflowsPerSec: Math.round(awaitedPerSec),
    burst: BURST,
    burstEnqueuePerSec: Math.round(BURST / (enqueueMs / 1000)),
    burstDrainPerSec: Math.round(burstPerSec),
  }),
);
