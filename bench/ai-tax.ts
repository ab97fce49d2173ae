/**
 * The durability tax of runledger/ai: the same AI SDK loop (generateText, a mock model
 * scripted to make 3 model calls, the first two asking for tool `lookup`, a 'none' tool
 * returning its input; the third answering in text) run plain, with no engine, and inside
 * a runledger workflow under durableModel and durableTools, on one worker (concurrency 1).
 * Each model call (doGenerate as the AI SDK sees it) and each tool execute is timed, and
 * the client round trips during it counted (every query a pg.Client sends); each loop is
 * timed whole (plain: generateText; durable: engine.start to its result). WARMUP loops of
 * each kind first (default 20), then LOOPS loops each (default 300), plain and durable in turn.
 *
 *   npm run build
 *   cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx ai-tax.ts
 *   cd bench && EMBEDDED=1 npx tsx ai-tax.ts     # embedded PostgreSQL (runledger/dev, ../.runledger/bench-pg)
 *   UI_STREAM=0 ...                               # durableTools with uiStream: false (no UI chunk write per tool call)
 *   HISTORY=100000 ...                            # a database with history: N finished runs loaded before the warm-up, no ANALYZE
 *
 * Imports the build (../dist). Not a test: it prints figures and writes its server's section
 * of the report (REPORT, default results/2026-12-07-ai-tax.md; other sections are kept), it asserts nothing.
 */
import { createRequire } from 'node:module';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type PgModule from 'pg';
import type { LanguageModelV4, LanguageModelV4CallOptions, LanguageModelV4GenerateResult } from '@ai-sdk/provider';
import { generateText, stepCountIs, tool, type ToolSet } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { createEngine } from '../dist/index.js';
import { durableModel, durableTools } from '../dist/ai/index.js';
import { startEmbeddedPostgres } from '../dist/dev/index.js';
import { config } from './lib/config.js';
import { withAdmin } from './lib/db.js';
import { loadHistory } from './lib/history.js';

const pg = createRequire(new URL('../dist/index.js', import.meta.url))('pg') as typeof PgModule;
const LOOPS = Number(process.env.LOOPS ?? 300);
const WARMUP = Number(process.env.WARMUP ?? 20);
const TARGET_MS = 2;
const TOOLS_UI = process.env.UI_STREAM !== '0'; // UI_STREAM=0: durableTools(..., { uiStream: false }), no UI chunk per tool call
const HISTORY = Number(process.env.HISTORY ?? 0); // HISTORY=N: bench/lib/history.ts's history with N finished runs, statistics left as they are
const REPORT = process.env.REPORT ?? new URL('./results/2026-12-07-ai-tax.md', import.meta.url).pathname;
const here = fileURLToPath(new URL('.', import.meta.url));
const embedded =
  process.env.EMBEDDED === '1' || !process.env.DATABASE_URL
    ? await startEmbeddedPostgres({ dataDir: join(here, '..', '.runledger', 'bench-pg') })
    : undefined;
const adminUrl = embedded?.connectionString ?? process.env.DATABASE_URL!;

let queries = 0;
const originalQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function countedQuery(this: PgModule.Client, ...args: unknown[]) {
  queries++;
  return (originalQuery as (...a: unknown[]) => unknown).apply(this, args);
} as typeof pg.Client.prototype.query;

type Kind = 'model' | 'tool';
interface Sample {
  kind: Kind;
  pos: number;
  ms: number;
  trips: number;
}
const samples: Record<'plain' | 'durable', Sample[]> = { plain: [], durable: [] };
const loops: Record<'plain' | 'durable', number[]> = { plain: [], durable: [] };
let recording = false;

// The mock's reply follows the conversation (the tool results so far), not a call counter: a replay gets the same answer.
const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: undefined, cacheWrite: undefined },
  outputTokens: { total: 5, text: 5, reasoning: undefined },
};
function reply(options: LanguageModelV4CallOptions): LanguageModelV4GenerateResult {
  const done = options.prompt.filter((m) => m.role === 'tool').length;
  if (done >= 2)
    return { content: [{ type: 'text', text: 'found it' }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] };
  return {
    content: [{ type: 'tool-call', toolCallId: `call-${done + 1}`, toolName: 'lookup', input: JSON.stringify({ q: `q${done + 1}` }) }],
    finishReason: { unified: 'tool-calls', raw: 'tool_calls' },
    usage,
    warnings: [],
  };
}
const mockModel = () => new MockLanguageModelV4({ modelId: 'mock', doGenerate: async (options) => reply(options) });
const lookup = tool({ description: 'Looks q up', inputSchema: z.object({ q: z.string() }), execute: async ({ q }) => ({ q }) });

/** Times each doGenerate of `model` and each execute of `tools` as the AI SDK sees them, with the round trips during it. */
function timed<T extends ToolSet>(model: LanguageModelV4, tools: T, sink: Sample[]): { model: LanguageModelV4; tools: T } {
  const count = { model: 0, tool: 0 };
  const time = async <R>(kind: Kind, call: () => PromiseLike<R>): Promise<R> => {
    const pos = ++count[kind];
    const q0 = queries;
    const t0 = performance.now();
    const result = await call();
    sink.push({ kind, pos, ms: performance.now() - t0, trips: queries - q0 });
    return result;
  };
  const timedModel: LanguageModelV4 = {
    specificationVersion: 'v4',
    provider: model.provider,
    modelId: model.modelId,
    supportedUrls: model.supportedUrls,
    doGenerate: (options) => time('model', () => model.doGenerate(options)),
    doStream: (options) => model.doStream(options),
  };
  const timedTools: Record<string, unknown> = {};
  for (const [name, t] of Object.entries(tools)) {
    const execute = t.execute as (input: unknown, options: unknown) => PromiseLike<unknown>;
    timedTools[name] = { ...t, execute: (input: unknown, options: unknown) => time('tool', () => execute(input, options)) };
  }
  return { model: timedModel, tools: timedTools as T };
}

async function agentLoop(model: LanguageModelV4, tools: { lookup: typeof lookup }, sink: Sample[], question: string): Promise<string> {
  const t = timed(model, tools, sink);
  const result = await generateText({ model: t.model, tools: t.tools, stopWhen: stepCountIs(5), prompt: question });
  return result.text;
}

const database = `rl_ai_tax_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
const pgVersion = ((await admin.query('select version() as v')).rows[0].v as string).split(',')[0]!;
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;

const engine = createEngine({ connectionString: url.toString(), log: () => {} });
try {
  await engine.migrate();
  // the workflow and queue of bench/lib/history.ts's finished runs, so that with HISTORY the measured runs join that history
  const queue = 'default';
  const wf = engine.workflow({ name: 'bench', queue }, async (ctx, input: { question: string }) => {
    const sink: Sample[] = [];
    const text = await agentLoop(
      durableModel(ctx, mockModel()),
      durableTools(ctx, { lookup }, {}, TOOLS_UI ? {} : { uiStream: false }),
      sink,
      input.question,
    );
    if (recording) samples.durable.push(...sink);
    return text;
  });
  const worker = await engine.runWorker({ queues: [queue], concurrency: 1 });

  const plainLoop = async (i: number) => {
    const sink: Sample[] = [];
    const t0 = performance.now();
    const text = await agentLoop(mockModel(), { lookup }, sink, `question ${i}`);
    if (recording) {
      samples.plain.push(...sink);
      loops.plain.push(performance.now() - t0);
    }
    return text;
  };
  const durableLoop = async (i: number) => {
    const t0 = performance.now();
    const text = await (await engine.start(wf, { question: `question ${i}` })).result({ timeoutMs: 60_000 });
    if (recording) loops.durable.push(performance.now() - t0);
    return text;
  };
  // HISTORY=N: N SUCCEEDED runs of 'bench' (3 steps, 3 events each) and BENCH_HISTORY_WAITING (10,000) WAITING runs of another
  // workflow, loaded by set-based SQL; no ANALYZE after it: the tables have no column statistics until autovacuum analyses them
  const statsSql = `select current_setting('autovacuum') as autovacuum, coalesce(sum(analyze_count + autoanalyze_count), 0)::int as analyzes
    from pg_stat_user_tables where schemaname = 'runledger' and relname in ('runs', 'steps', 'events')`;
  let history = '';
  if (HISTORY > 0) {
    config.historyFinished = HISTORY;
    const load = await loadHistory('runledger', url.toString());
    const mb = (load.historyBytes / 1e6).toFixed(0);
    history = `${HISTORY.toLocaleString('en')} SUCCEEDED runs of the measured workflow over the last 7 days (3 steps and 3 events each) and ${config.historyWaiting.toLocaleString('en')} WAITING runs of another workflow (2 steps and 3 events each) were loaded before the warm-up (bench/lib/history.ts: ${load.historyLoadSeconds.toFixed(1)} s, ${mb} MB); no ANALYZE afterwards, as when autovacuum has not caught up.`;
    console.log(history);
  }
  for (let i = 0; i < WARMUP; i++) {
    await plainLoop(i);
    await durableLoop(i);
  }
  recording = true;
  const q0 = queries;
  for (let i = 0; i < LOOPS; i++) {
    const [plainText, durableText] = [await plainLoop(i), await durableLoop(i)];
    if (plainText !== 'found it' || durableText !== 'found it') console.warn(`loop ${i}: unexpected answers ${plainText} / ${durableText}`);
  }
  const tripsPerLoop = (queries - q0) / LOOPS;
  await worker.stop();
  if (HISTORY > 0) {
    const { autovacuum, analyzes } = (await withAdmin(url.toString(), (c) => c.query(statsSql))).rows[0];
    history += ` The server's autovacuum setting: ${autovacuum}; ANALYZE or autoanalyze runs of runledger.runs, steps and events by the end of the measurement: ${analyzes}.`;
  }

  const sorted = (xs: number[]) => [...xs].sort((a, b) => a - b);
  const pct = (xs: number[], p: number) => sorted(xs)[Math.min(xs.length - 1, Math.floor((p / 100) * xs.length))] ?? NaN;
  const mean = (xs: number[]) => xs.reduce((a, b) => a + b, 0) / xs.length;
  const f = (ms: number) => ms.toFixed(3);
  const of = (mode: 'plain' | 'durable', kind: Kind, pos?: number) =>
    samples[mode].filter((s) => s.kind === kind && (pos === undefined || s.pos === pos));
  const ms = (xs: Sample[]) => xs.map((s) => s.ms);
  const trips = (xs: Sample[]) => xs.map((s) => s.trips);
  const added: Record<Kind, { p50: number; p99: number }> = { model: { p50: 0, p99: 0 }, tool: { p50: 0, p99: 0 } };
  const rows = (['model', 'tool'] as const).map((kind) => {
    const [p, d] = [ms(of('plain', kind)), ms(of('durable', kind))];
    added[kind] = { p50: pct(d, 50) - pct(p, 50), p99: pct(d, 99) - pct(p, 99) };
    const t = trips(of('durable', kind));
    return `| ${kind === 'model' ? 'model call (doGenerate)' : "tool call ('none')"} | ${d.length} | ${f(pct(p, 50))} / ${f(pct(p, 99))} | ${f(pct(d, 50))} / ${f(pct(d, 90))} / ${f(pct(d, 99))} / ${f(Math.max(...d))} | **${f(added[kind].p50)}** | ${f(added[kind].p99)} | ${mean(t).toFixed(2)} (${Math.min(...t)}–${Math.max(...t)}) |`;
  });
  const [lp, ld] = [loops.plain, loops.durable];
  rows.push(
    `| whole loop (3 model + 2 tool calls) | ${ld.length} | ${f(pct(lp, 50))} / ${f(pct(lp, 99))} | ${f(pct(ld, 50))} / ${f(pct(ld, 90))} / ${f(pct(ld, 99))} / ${f(Math.max(...ld))} | ${f(pct(ld, 50) - pct(lp, 50))} | ${f(pct(ld, 99) - pct(lp, 99))} | ${tripsPerLoop.toFixed(2)} |`,
  );
  const table = [
    '| call | n (durable) | plain ms p50 / p99 | durable ms p50 / p90 / p99 / max | added ms p50 | added ms p99 | round trips per call, durable (mean, min–max) |',
    '| --- | ---: | ---: | ---: | ---: | ---: | ---: |',
    ...rows,
  ].join('\n');
  const positions = [
    ['model', 1],
    ['tool', 1],
    ['model', 2],
    ['tool', 2],
    ['model', 3],
  ] as const;
  const byPosition = [
    '| call in the loop | plain ms p50 | durable ms p50 / p99 | round trips (mean) |',
    '| --- | ---: | ---: | ---: |',
    ...positions.map(([kind, pos]) => {
      const d = of('durable', kind, pos);
      return `| ${kind} ${pos} | ${f(pct(ms(of('plain', kind, pos)), 50))} | ${f(pct(ms(d), 50))} / ${f(pct(ms(d), 99))} | ${mean(trips(d)).toFixed(2)} |`;
    }),
  ].join('\n');
  const holds = (kind: Kind) => (added[kind].p50 <= TARGET_MS ? 'holds' : 'does not hold');
  const verdict = `Target (≤ ${TARGET_MS} ms p50 added per call): model call ${holds('model')} (${f(added.model.p50)} ms), 'none' tool call ${holds('tool')} (${f(added.tool.p50)} ms).`;
  console.log(`${table}\n\n${byPosition}\n\n${verdict}`);

  const key = `${embedded ? 'embedded' : `${url.hostname}:${url.port || 5432}`}${TOOLS_UI ? '' : ', tools with uiStream false'}${HISTORY ? `, ${HISTORY.toLocaleString('en')} runs of history, statistics not refreshed` : ''}`;
  const section = `## Server: ${key} (${pgVersion})

${LOOPS} loops each after ${WARMUP} warm-up loops of each, plain and durable in turn; ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, Node ${process.version},
${new Date().toISOString().slice(0, 16)}Z. ${embedded ? 'Embedded server (runledger/dev startEmbeddedPostgres, ../.runledger/bench-pg, fsync on).' : 'Server from DATABASE_URL.'}${history ? `\n\n${history}` : ''}

${table}

By position in the loop (a durable step's checkpoint is deferred to the start of the next step, so each call after the first
also writes the one before it; the last model call's checkpoint commits with the run's completion, after the timed calls):

${byPosition}

${verdict}
`;
  const header = `# runledger/ai durability tax: the same AI SDK loop with and without runledger (2026-12-07)

\`bench/ai-tax.ts\`: \`generateText\` (ai v7) with a \`MockLanguageModelV4\` scripted to 3 model calls (2 tool calls of a
'none' tool \`lookup\`, then text), \`stopWhen: stepCountIs(5)\`; plain, and inside a workflow under \`durableModel\` and
\`durableTools\` on one worker (concurrency 1). Each model call is timed around the doGenerate the AI SDK calls, each tool call
around its execute; added = durable − plain at the same percentile. Round trips: queries sent by any pg.Client of the
process during the call (the worker's background queries included when they fall inside it).

`;
  const old = existsSync(REPORT) ? readFileSync(REPORT, 'utf8') : header;
  const cut = old.indexOf('\n## Server: ');
  const preamble = cut < 0 ? old.trimEnd() + '\n' : old.slice(0, cut + 1);
  const others =
    cut < 0
      ? []
      : old
          .slice(cut + 1)
          .split(/\n(?=## Server: )/)
          .filter((s) => !s.startsWith(`## Server: ${key} `));
  writeFileSync(REPORT, [preamble.trimEnd(), ...others.map((s) => s.trimEnd()), section.trimEnd()].join('\n\n') + '\n');
  console.log(`report written to ${REPORT}`);
} finally {
  await engine.close();
  await admin.query(`drop database ${database} with (force)`);
  await admin.end();
  await embedded?.stop();
}
