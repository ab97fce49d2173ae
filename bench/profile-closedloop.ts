/**
 * Where a closed loop's time goes, for working on the start path (not part of `npm start`).
 *
 *   DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres N=6000 \
 *     POSTMASTER_PID=$(head -1 /var/lib/postgresql/15/main/postmaster.pid) npx tsx profile-closedloop.ts
 *
 * In a fresh database `rl_profile_closedloop` on that server: 16 callers, each in a loop
 * doing `engine.start` of a three-step workflow then `await handle.result()`, with the
 * worker (concurrency 16) in this process, as the closedloop workload does. After a
 * warm-up of N calls, N calls are measured. It prints the rate, the p50 of the whole call
 * and of its two halves (the start, the wait for the result), this process's CPU per
 * workflow and, when POSTMASTER_PID names the server's postmaster on this machine, the
 * server's (all its processes, from /proc); then, per kind of statement the process sent
 * (the start, the group commit), how many, their round trip's p50 and their summed time;
 * and the median number of items per group commit. TRACK_FUNCTIONS=1 also prints
 * pg_stat_user_functions (it slows the server a little). HISTORY=1 loads the closedloop_history
 * workload's history (bench/lib/history.ts: 100,000 finished runs, 10,000 waiting) after the
 * warm-up, while the worker runs, without ANALYZE.
 */
import { createRequire } from 'node:module';
import pg from 'pg';
import { createEngine } from 'runledger';
import { freshProfileDatabase, profileSettings } from './lib/profile-db.js';
import { serverCpuTicks } from './lib/server-cpu.js';
import { loadHistory } from './lib/history.js';

const { url, count: calls, postmaster } = profileSettings(4_000);
const callers = 16;

// runledger queries through its own copy of pg: the round trips are timed on that copy's
// Client, where every pool query ends (by callback or by promise).
const RunledgerPg = createRequire(import.meta.resolve('runledger'))('pg') as typeof pg;
const roundTrips = new Map<string, number[]>();
const batchItems: number[] = [];
const kindOf = (text: string) =>
  text.includes('_commit_and_claim')
    ? 'group commit with a claim'
    : text.includes('_commit_batch')
      ? 'group commit'
      : text.includes('_start_many')
        ? 'starts made together (claimed for this worker)'
        : text.includes('_start_claimed')
          ? 'start (claimed for this worker)'
          : text.slice(0, 48);
const query = RunledgerPg.Client.prototype.query as (...args: unknown[]) => unknown;
RunledgerPg.Client.prototype.query = function (this: unknown, ...args: unknown[]) {
  const config = args[0] as string | { text?: string; values?: unknown[]; callback?: (...r: unknown[]) => unknown };
  const text = typeof config === 'string' ? config : (config?.text ?? '');
  const kind = kindOf(text);
  if (kind.startsWith('group commit') && typeof config === 'object') {
    batchItems.push((JSON.parse(String(config.values?.[0])) as unknown[]).length);
  }
  const started = performance.now();
  const record = () => {
    const list = roundTrips.get(kind) ?? [];
    list.push(performance.now() - started);
    roundTrips.set(kind, list);
  };
  const at = args.findIndex((a) => typeof a === 'function');
  if (at >= 0) {
    const callback = args[at] as (...r: unknown[]) => unknown;
    args[at] = (...r: unknown[]) => (record(), callback(...r));
  } else if (typeof config === 'object' && typeof config.callback === 'function') {
    const callback = config.callback;
    config.callback = (...r: unknown[]) => (record(), callback(...r));
  }
  const result = query.apply(this, args);
  if (at < 0 && result instanceof Promise) result.then(record, () => {});
  return result;
} as typeof RunledgerPg.Client.prototype.query;

const dbUrl = await freshProfileDatabase(url, 'rl_profile_closedloop');

const engine = createEngine({ connectionString: dbUrl, poolMax: 20, log: () => {} });
await engine.migrate();
const workflow = engine.workflow({ name: 'profile-closedloop' }, async (ctx, input: { n: number }) => {
  for (const name of ['a', 'b', 'c']) await ctx.step(name, async () => input.n);
  return null;
});
const worker = await engine.runWorker({ concurrency: 16 });

const whole: number[] = [];
const starts: number[] = [];
const results: number[] = [];
async function loop(): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: callers }, async () => {
      while (next < calls) {
        const n = next++;
        const t0 = performance.now();
        const handle = await engine.start(workflow, { n });
        const t1 = performance.now();
        await handle.result();
        const t2 = performance.now();
        starts.push(t1 - t0);
        results.push(t2 - t1);
        whole.push(t2 - t0);
      }
    }),
  );
}

await loop(); // warm-up: the pool's sessions cache their plans
if (process.env.HISTORY === '1') {
  // The closedloop_history workload's history (lib/history.ts), loaded while the worker runs, not analysed.
  const loaded = await loadHistory('runledger', dbUrl);
  console.log(`history loaded in ${loaded.historyLoadSeconds.toFixed(1)} s (${(loaded.historyBytes / 2 ** 20).toFixed(0)} MiB)`);
}
for (const list of [whole, starts, results, batchItems]) list.length = 0;
roundTrips.clear();
const cpuBefore = process.cpuUsage();
const ticksBefore = postmaster === undefined ? 0 : serverCpuTicks(postmaster);
const began = performance.now();
await loop();
const ms = performance.now() - began;
const cpu = process.cpuUsage(cpuBefore);
const serverMs = postmaster === undefined ? 0 : (serverCpuTicks(postmaster) - ticksBefore) * 10;

const p50 = (list: number[]) => [...list].sort((a, b) => a - b)[Math.floor(list.length / 2)] ?? NaN;
console.log(`closed loop: ${((calls / ms) * 1000).toFixed(0)} workflows/s, ${callers} callers`);
console.log(`p50 (ms): whole call ${p50(whole).toFixed(2)}, start ${p50(starts).toFixed(2)}, result ${p50(results).toFixed(2)}`);
console.log(`this process's CPU: ${((cpu.user + cpu.system) / calls).toFixed(0)} us per workflow`);
if (postmaster !== undefined) {
  console.log(`server CPU: ${((serverMs * 1000) / calls).toFixed(0)} us per workflow (${((serverMs / ms) * 100).toFixed(0)} % of a core)`);
}
console.table(
  [...roundTrips].map(([kind, list]) => ({
    statement: kind,
    count: list.length,
    'round trip p50 (ms)': Number(p50(list).toFixed(2)),
    'summed (ms)': Math.round(list.reduce((a, b) => a + b, 0)),
  })),
);
console.log(`items per group commit, p50: ${p50(batchItems)} (${batchItems.length} group commits)`);
if (process.env.TRACK_FUNCTIONS === '1') {
  const probe = new pg.Client({ connectionString: dbUrl });
  await probe.connect();
  const functions = await probe.query(
    `select funcname, calls, round(total_time::numeric, 1) as total_ms, round(self_time::numeric, 1) as self_ms,
            round((self_time * 1000 / nullif(calls, 0))::numeric) as self_us_per_call
       from pg_stat_user_functions order by self_time desc limit 15`,
  );
  console.table(functions.rows);
  await probe.end();
}
await worker.stop();
await engine.close();
