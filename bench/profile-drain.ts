/**
 * Where a drain's time goes, for working on the hot path (not part of `npm start`).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres N=20000 npx tsx profile-drain.ts
 *
 * Enqueues N one-step runs into a fresh database `rl_profile` on that server, drains
 * them with one worker at concurrency 16, and prints enqueue and drain rates, the
 * worker's CPU per run and, when the server runs on this machine and POSTMASTER_PID
 * names its postmaster, the server's CPU per run (all its processes, from /proc).
 * TRACK_FUNCTIONS=1 also prints pg_stat_user_functions (calls and time per function;
 * it slows the server a little). Run it with `perf record -p <backend pids>` beside it
 * for a profile of the server.
 */
import pg from 'pg';
import { createEngine } from 'runledger';
import { freshProfileDatabase, profileSettings } from './lib/profile-db.js';
import { serverCpuTicks } from './lib/server-cpu.js';

const { url, count: runs, postmaster } = profileSettings(10_000);
const serverTicks = () => (postmaster === undefined ? 0 : serverCpuTicks(postmaster));
const dbUrl = await freshProfileDatabase(url, 'rl_profile');

const engine = createEngine({ connectionString: dbUrl, poolMax: 20, log: () => {} });
await engine.migrate();
const workflow = engine.workflow({ name: 'profile' }, async (ctx, input: { n: number }) => {
  await ctx.step('only', async () => input.n);
  return null;
});

const enqueueStart = performance.now();
let next = 0;
await Promise.all(
  Array.from({ length: 16 }, async () => {
    while (next < runs) {
      next++;
      await engine.start(workflow, { n: next });
    }
  }),
);
const enqueueSeconds = (performance.now() - enqueueStart) / 1000;

const probe = new pg.Pool({ connectionString: dbUrl, max: 1 });
const cpuBefore = process.cpuUsage();
const ticksBefore = serverTicks();
const drainStart = performance.now();
const worker = await engine.runWorker({ concurrency: 16 });
for (;;) {
  const left = await probe.query(`select count(*)::int as n from runledger.runs where status <> 'SUCCEEDED'`);
  if (left.rows[0].n === 0) break;
  await new Promise((resolve) => setTimeout(resolve, 50));
}
const drainSeconds = (performance.now() - drainStart) / 1000;
const cpu = process.cpuUsage(cpuBefore);
const serverMs = (serverTicks() - ticksBefore) * 10;

console.log(`enqueue: ${(runs / enqueueSeconds).toFixed(0)} runs/s`);
console.log(`drain:   ${(runs / drainSeconds).toFixed(0)} runs/s (${((drainSeconds * 1000) / runs).toFixed(3)} ms of wall time per run)`);
console.log(`worker CPU: ${((cpu.user + cpu.system) / 1000 / runs).toFixed(3)} ms per run`);
if (postmaster !== undefined) console.log(`server CPU: ${(serverMs / runs).toFixed(3)} ms per run`);
if (process.env.TRACK_FUNCTIONS === '1') {
  const functions = await probe.query(
    `select funcname, calls, round(total_time::numeric, 1) as total_ms, round(self_time::numeric, 1) as self_ms
       from pg_stat_user_functions order by total_time desc limit 15`,
  );
  console.table(functions.rows);
}
await worker.stop();
await probe.end();
await engine.close();
