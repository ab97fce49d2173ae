/**
 * What ctx.generate and ctx.callTool cost per call over a plain ctx.step with the same
 * trivial body: one run makes CALLS calls of one kind in a row (a scripted model answering
 * 'ok'; a 'none' tool returning its argument; for the ledger kinds, an 'external' tool
 * against ctx.operation), timed from start to result, REPEATS runs per kind, interleaved.
 * Also counts the client round trips (every query the engine's pool sends) per call.
 *
 *   npm run build
 *   cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx agent-overhead.ts
 *
 * Imports the build (../dist). Not a test: it prints figures and writes a report, it asserts nothing.
 */
import { createRequire } from 'node:module';
import { writeFileSync } from 'node:fs';
import { cpus } from 'node:os';
import type PgModule from 'pg';
import { z } from 'zod';
import { createEngine, defineTool, scriptedModel } from '../dist/index.js';

const pg = createRequire(new URL('../dist/index.js', import.meta.url))('pg') as typeof PgModule;
const CALLS = Number(process.env.CALLS ?? 2_000);
const REPEATS = Number(process.env.REPEATS ?? 7);
const REPORT = process.env.REPORT ?? new URL('./results/2026-12-01-agent-overhead-pg15.md', import.meta.url).pathname;
const adminUrl = process.env.DATABASE_URL;
if (!adminUrl) throw new Error('DATABASE_URL is required');

let queries = 0;
const originalQuery = pg.Client.prototype.query;
pg.Client.prototype.query = function countedQuery(this: PgModule.Client, ...args: unknown[]) {
  queries++;
  return (originalQuery as (...a: unknown[]) => unknown).apply(this, args);
} as typeof pg.Client.prototype.query;

const database = `rl_agent_overhead_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
const pgVersion = (await admin.query('select version() as v')).rows[0].v as string;
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;

const engine = createEngine({ connectionString: url.toString(), log: () => {} });
try {
  await engine.migrate();
  const model = scriptedModel('bench', () => ({ content: 'ok', usage: { inputTokens: 1, outputTokens: 1 } }));
  const echo = defineTool({
    name: 'echo',
    description: 'Returns its argument',
    input: z.object({ n: z.number() }),
    sideEffect: 'none',
    run: async ({ n }) => n,
  });
  const echoExternal = defineTool({ ...echo, name: 'echo_external', sideEffect: 'external' });
  const limits = { maxSteps: CALLS * 2 + 10 };

  const kinds = {
    'ctx.step': engine.workflow({ name: 'bench-step', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) await ctx.step('s', () => ({ message: { role: 'assistant', content: 'ok' } }));
    }),
    'ctx.generate': engine.workflow({ name: 'bench-generate', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) await ctx.generate(model, { messages: [] });
    }),
    "ctx.callTool ('none')": engine.workflow({ name: 'bench-tool', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) await ctx.callTool(echo, { n: i });
    }),
    'ctx.operation': engine.workflow({ name: 'bench-operation', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) await ctx.operation('o', {}, async () => i);
    }),
    "ctx.callTool ('external')": engine.workflow({ name: 'bench-tool-external', limits }, async (ctx) => {
      for (let i = 0; i < CALLS; i++) await ctx.callTool(echoExternal, { n: i });
    }),
  };
  const worker = await engine.runWorker({ concurrency: 1, pollIntervalMs: 1_000 });

  const samples: Record<string, Array<{ us: number; cpu: number; trips: number }>> = {};
  // A warm-up round (prepared statements, JIT of the engine's code), not counted.
  for (const wf of Object.values(kinds)) await (await engine.start(wf, undefined)).result({ timeoutMs: 600_000 });
  for (let r = 0; r < REPEATS; r++) {
    for (const [kind, wf] of Object.entries(kinds)) {
      const before = queries;
      const cpu0 = process.cpuUsage();
      const t0 = performance.now();
      await (await engine.start(wf, undefined)).result({ timeoutMs: 600_000 });
      const ms = performance.now() - t0;
      const cpu = process.cpuUsage(cpu0);
      (samples[kind] ??= []).push({ us: (ms * 1000) / CALLS, cpu: (cpu.user + cpu.system) / CALLS, trips: (queries - before) / CALLS });
    }
  }
  await worker.stop();

  const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
  const of = (kind: string, field: 'us' | 'cpu') => median(samples[kind]!.map((s) => s[field]));
  const least = (kind: string, field: 'us' | 'cpu') => Math.min(...samples[kind]!.map((s) => s[field]));
  const diff = (value: number, base: number) => `${value - base >= 0 ? '+' : ''}${(value - base).toFixed(1)}`;
  const rows = Object.entries(samples).map(([kind, xs]) => {
    const baseName = kind.includes('external') || kind === 'ctx.operation' ? 'ctx.operation' : 'ctx.step';
    const us = of(kind, 'us');
    const cpu = of(kind, 'cpu');
    return {
      kind,
      us,
      cpu,
      vs:
        kind === baseName
          ? '(base)'
          : `${diff(us, of(baseName, 'us'))} wall, ${diff(cpu, of(baseName, 'cpu'))} CPU; least: ${diff(least(kind, 'us'), least(baseName, 'us'))} wall, ${diff(least(kind, 'cpu'), least(baseName, 'cpu'))} CPU (vs ${baseName})`,
      least: `${least(kind, 'us').toFixed(1)} / ${least(kind, 'cpu').toFixed(1)}`,
      trips: median(xs.map((s) => s.trips)),
      all: xs.map((s) => s.us.toFixed(0)).join(', '),
    };
  });
  const table = [
    '| call | wall µs per call (median) | process CPU µs per call (median) | least wall / CPU µs | difference (µs) | round trips per call | wall µs per call, each run |',
    '| --- | ---: | ---: | ---: | --- | ---: | --- |',
    ...rows.map(
      (r) => `| ${r.kind} | ${r.us.toFixed(1)} | ${r.cpu.toFixed(1)} | ${r.least} | ${r.vs} | ${r.trips.toFixed(2)} | ${r.all} |`,
    ),
  ].join('\n');
  console.log(table);
  writeFileSync(
    REPORT,
    `# Agent call overhead: ctx.generate and ctx.callTool against a plain step (${new Date().toISOString().slice(0, 10)})

\`bench/agent-overhead.ts\`: one run makes ${CALLS} calls of one kind in a row, on one worker
(concurrency 1), timed from \`engine.start\` to its result; ${REPEATS} runs per kind, interleaved,
after a warm-up run of each; the median and the least (the run least disturbed) are shown. Wall time per call is mostly the database
round trip of the call's checkpoint, and on a machine shared with other sessions it varies by
more than the agent layer costs; the CPU time of the Node process (engine and worker in one
process, \`process.cpuUsage\`) per call is the steadier measure of what the layer adds in
process. Round trips: every query the engine's pool sent during the run, per call.

- ctx.step: a body returning a small assistant message (the size of a scripted reply).
- ctx.generate: a scripted model answering 'ok' with usage { 1, 1 } (no tools, no streaming).
- ctx.callTool ('none'): a tool returning its argument, schema \`{ n: number }\`.
- ctx.operation / ctx.callTool ('external'): the same trivial body through the operation ledger.

${table}

Machine: ${cpus().length} × ${cpus()[0]?.model ?? 'cpu'}, Node ${process.version}; ${pgVersion.split(',')[0]} on 127.0.0.1
(shared with other sessions: figures vary from run to run by several per cent).

## What is and is not measured

This build has the lead's \`ctx.chargeNow\` and \`ctx.budget.remaining\` only as a local no-op
stand-in (they throw on the committed branch until the lead's implementation is merged). So:

- **Not in these figures:** the charge's own round trip. \`ctx.generate\` calls \`ctx.chargeNow({ tokens,
  costUsd })\` once per call (when the model reported any usage), and \`ctx.callTool\` calls
  \`ctx.chargeNow({ toolCalls: 1 })\` once per call; each is a fenced write of its own, so once the
  real one lands expect **one more round trip per call** (about one ctx.step's worth of latency on
  this machine, since a plain step's cost here is nearly all its one checkpoint round trip).
- **In these figures:** everything else the agent layer adds in process: the message and tool
  checks, the tool specs, the reply's checks and tool-call marking, zod validation of the
  arguments, the result wrapping, the stream forwarder (never opened: the model does not stream),
  and \`ctx.budget.remaining()\` (synchronous, no round trip).
- A tool with a key from its arguments (\`idempotencyKey(args)\`) adds a step of its own (the
  key check), one more checkpoint per call; not measured here (the tools above use derived keys).
`,
  );
  console.log(`report written to ${REPORT}`);
} finally {
  await engine.close();
  await admin.query(`drop database ${database} with (force)`);
  await admin.end();
}
