/**
 * The retry storm (issue 44, the seed's "a provider outage must not become a retry storm"):
 * RUNS runs (default 100) each make one call to a provider that answers 429 with
 * `Retry-After: 1` for OUTAGE_MS (default 5000) from the moment the runs are started, then
 * answers. Each run's step retries with the same backoff policy (up to 30 attempts, 200 ms
 * doubling to 5 s, jitter). Two arrangements, on the same database, one after the other:
 *
 * - per run: each run retries on its own (no shared limit): what a queue gives you;
 * - shared: the step names a rate limit key (20 calls per second), so the first 429 with
 *   Retry-After pauses the key for every run and the calls resume within the limit.
 *
 * For each it counts the calls that reached the provider during the outage and after it, and
 * the time from the end of the outage until the last run finished. One worker, concurrency
 * RUNS (every run holds a slot while it retries in memory; long waits park).
 *
 *   npm run build
 *   cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx retry-storm.ts
 *   cd bench && EMBEDDED=1 npx tsx retry-storm.ts     # embedded PostgreSQL (../.runledger/bench-pg)
 *
 * Imports the build (../dist). Not a test: it prints figures and writes its server's section
 * of the report (REPORT, default results/2026-12-07-retry-storm.md), it asserts nothing.
 */
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { createEngine } from '../dist/index.js';
import { startEmbeddedPostgres } from '../dist/dev/index.js';
import { createDatabase, dropDatabase } from './lib/db.js';

const RUNS = Number(process.env.RUNS ?? 100);
const OUTAGE_MS = Number(process.env.OUTAGE_MS ?? 5_000);
const LIMIT_PER_SECOND = Number(process.env.LIMIT ?? 20);
const REPORT = process.env.REPORT ?? new URL('./results/2026-12-07-retry-storm.md', import.meta.url).pathname;
const here = fileURLToPath(new URL('.', import.meta.url));
const embedded =
  process.env.EMBEDDED === '1' || !process.env.DATABASE_URL
    ? await startEmbeddedPostgres({ dataDir: join(here, '..', '.runledger', 'bench-pg') })
    : undefined;
const adminUrl = embedded?.connectionString ?? process.env.DATABASE_URL!;
const server = embedded ? 'embedded PostgreSQL' : `PostgreSQL at ${new URL(adminUrl).host}`;

interface Outcome {
  arrangement: string;
  callsDuringOutage: number;
  callsAfter: number;
  refused: number;
  recoveryMs: number;
  totalMs: number;
  parked: number;
  timeline: string;
}

const RETRY = { maxAttempts: 30, initialDelayMs: 200, factor: 2, maxDelayMs: 5_000, jitter: true };

async function arrangement(name: string, shared: boolean): Promise<Outcome> {
  const dbName = `bench_retry_storm_${shared ? 'shared' : 'per_run'}`;
  const url = await createDatabase(adminUrl, dbName);
  const engine = createEngine({ connectionString: url, log: () => {} });
  try {
    await engine.migrate();
    let outageEndsAt = Number.POSITIVE_INFINITY;
    const calls: Array<{ at: number; ok: boolean }> = [];
    const provider = () => {
      const at = Date.now();
      const ok = at >= outageEndsAt;
      calls.push({ at, ok });
      if (!ok) throw Object.assign(new Error('429 Too Many Requests'), { status: 429, headers: { 'retry-after': '1' } });
      return 'answer';
    };
    const wf = engine.workflow({ name: 'storm', queue: 'storm' }, async (ctx) =>
      ctx.step('call', provider, { retry: RETRY, ...(shared ? { rateLimit: 'provider' } : {}) }),
    );
    if (shared) await engine.setRateLimit('provider', { max: LIMIT_PER_SECOND, per: '1s' });
    const worker = await engine.runWorker({ queues: ['storm'], concurrency: RUNS, pollIntervalMs: 100 });
    const started = Date.now();
    outageEndsAt = started + OUTAGE_MS;
    const handles = await engine.startMany(
      wf,
      Array.from({ length: RUNS }, () => undefined),
    );
    await Promise.all(handles.map((h) => h.result({ timeoutMs: 120_000 })));
    const finished = Date.now();
    await worker.stop();
    // Calls per second, counted from the end of the outage (negative: during it).
    const perSecond = new Map<number, number>();
    for (const c of calls) {
      const second = Math.floor((c.at - outageEndsAt) / 1000);
      perSecond.set(second, (perSecond.get(second) ?? 0) + 1);
    }
    const timeline = [...perSecond.entries()]
      .sort((a, b) => a[0] - b[0])
      .map(([second, n]) => `${second}s: ${n}`)
      .join(', ');
    const parked = await engine.pool.query(`select count(*)::int as n from runledger.events where kind = 'rate_limit_wait'`);
    return {
      arrangement: name,
      callsDuringOutage: calls.filter((c) => !c.ok).length,
      callsAfter: calls.filter((c) => c.ok).length,
      refused: calls.filter((c) => !c.ok).length,
      recoveryMs: finished - outageEndsAt,
      totalMs: finished - started,
      parked: parked.rows[0].n,
      timeline,
    };
  } finally {
    await engine.close();
    await dropDatabase(adminUrl, dbName);
  }
}

const perRun = await arrangement('per run (each run retries on its own)', false);
const shared = await arrangement(`shared (rateLimit key, ${LIMIT_PER_SECOND}/s, Retry-After pauses it)`, true);
const rows = [perRun, shared];
const lines = [
  `### ${server}`,
  '',
  `${RUNS} runs, one call each; the provider answers 429 with Retry-After: 1 for ${OUTAGE_MS} ms; retry ${JSON.stringify(RETRY)}.`,
  '',
  '| arrangement | calls during the outage (429s) | calls after it | last run done, after the outage | whole burst | runs parked on the key |',
  '| --- | ---: | ---: | ---: | ---: | ---: |',
  ...rows.map(
    (r) => `| ${r.arrangement} | ${r.callsDuringOutage} | ${r.callsAfter} | ${r.recoveryMs} ms | ${r.totalMs} ms | ${r.parked} |`,
  ),
  '',
  `Calls during the outage, per run over shared: **${(perRun.callsDuringOutage / Math.max(1, shared.callsDuringOutage)).toFixed(1)}x**.`,
  '',
  'Calls per second at the provider, from the end of the outage (negative: during it):',
  '',
  ...rows.map((r) => `- ${r.arrangement}: ${r.timeline}`),
  '',
];
console.log(lines.join('\n'));

// The report keeps one section per server: this run replaces its own.
const header =
  '# The retry storm: a provider outage, with and without a shared rate limit\n\nbench/retry-storm.ts; one run per server.\n\n';
const existing = existsSync(REPORT) ? readFileSync(REPORT, 'utf8') : header;
const sections = existing.split(/^### /m);
const kept = sections.slice(1).filter((s) => !s.startsWith(server));
writeFileSync(REPORT, [sections[0] || header, ...kept.map((s) => `### ${s.trimEnd()}\n\n`), lines.join('\n')].join(''));
await embedded?.stop();
