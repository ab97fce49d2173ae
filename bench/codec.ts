/**
 * What the payload codec costs: a workflow of STEPS steps, each returning a ~1 KB object,
 * run with and without aesGcmCodec (two engines on one database, each with its own worker
 * and queue), interleaved, REPEATS times each:
 *   (1) one run at a time: wall time per step (the latency a run sees);
 *   (2) PARALLEL runs at once: wall time per step over all of them (throughput), and the
 *       worker process's CPU per step (user + system, the codec's real price);
 * and, without a database, encode + decode of the same 1 KB value by aesGcmCodec alone.
 *
 *   npm run build
 *   cd bench && DATABASE_URL=postgres://postgres@127.0.0.1:5432/postgres npx tsx codec.ts
 *
 * Imports the build (../dist). Not a test: it prints figures and writes a report, it asserts nothing.
 */
import { createRequire } from 'node:module';
import { randomBytes } from 'node:crypto';
import { writeFileSync } from 'node:fs';
import { cpus, loadavg } from 'node:os';
import type PgModule from 'pg';
import { aesGcmCodec, createEngine, type Engine } from '../dist/index.js';

const pg = createRequire(new URL('../dist/index.js', import.meta.url))('pg') as typeof PgModule;
const STEPS = Number(process.env.STEPS ?? 200);
const PARALLEL = Number(process.env.PARALLEL ?? 16);
const REPEATS = Number(process.env.REPEATS ?? 5);
const MICRO = Number(process.env.MICRO ?? 20_000);
const REPORT = process.env.REPORT ?? new URL('./results/2026-12-02-codec.md', import.meta.url).pathname;
const adminUrl = process.env.DATABASE_URL;
if (!adminUrl) throw new Error('DATABASE_URL is required');

/** About 1 KB of JSON, different per step (a nonce of the step's position), as a tool result would be. */
const payload = (i: number) => ({
  step: i,
  items: Array.from({ length: 12 }, (_, j) => ({ id: `item-${i}-${j}`, title: 'lorem ipsum dolor sit amet', qty: j, ok: j % 2 === 0 })),
});
const payloadBytes = Buffer.byteLength(JSON.stringify(payload(100)));

const database = `rl_codec_${process.pid}`;
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
const pgVersion = (await admin.query('select version() as v')).rows[0].v as string;
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;

const codec = aesGcmCodec({ keys: { k1: randomBytes(32) }, activeKey: 'k1' });
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const engines: Engine[] = [];
try {
  const setup = createEngine({ connectionString: url.toString(), log: () => {} });
  engines.push(setup);
  await setup.migrate();

  const variants = {
    'no codec': createEngine({ connectionString: url.toString(), log: () => {} }),
    aesGcmCodec: createEngine({ connectionString: url.toString(), log: () => {}, codec }),
  };
  const flows = Object.fromEntries(
    Object.entries(variants).map(([name, engine], i) => {
      engines.push(engine);
      const queue = `codec-bench-${i}`;
      const flow = engine.workflow({ name: `codec-bench-${i}`, queue, limits: { maxSteps: STEPS + 10 } }, async (ctx) => {
        let total = 0;
        for (let s = 0; s < STEPS; s++) total += (await ctx.step('s', () => payload(s))).items.length;
        return { total };
      });
      return [name, { engine, flow, queue }];
    }),
  );
  for (const { engine, queue } of Object.values(flows))
    await engine.runWorker({ queues: [queue], concurrency: PARALLEL, pollIntervalMs: 50 });

  const serial: Record<string, number[]> = { 'no codec': [], aesGcmCodec: [] };
  const serialCpu: Record<string, number[]> = { 'no codec': [], aesGcmCodec: [] };
  const parallel: Record<string, number[]> = { 'no codec': [], aesGcmCodec: [] };
  const cpu: Record<string, number[]> = { 'no codec': [], aesGcmCodec: [] };
  // A warm-up round of each, not counted (plans, connections, JIT of the JS).
  for (const { engine, flow } of Object.values(flows)) await (await engine.start(flow, undefined)).result({ timeoutMs: 600_000 });
  const order = Object.entries(flows);
  for (let r = 0; r < REPEATS; r++) {
    // Turns about: neither variant always runs right after the other's burst of commits.
    for (const [name, { engine, flow }] of r % 2 === 0 ? order : [...order].reverse()) {
      // Both workers live in this process: only one variant runs at a time, so the CPU is its own.
      let c0 = process.cpuUsage();
      let t0 = performance.now();
      await (await engine.start(flow, undefined)).result({ timeoutMs: 600_000 });
      serial[name]!.push(((performance.now() - t0) * 1000) / STEPS);
      let used = process.cpuUsage(c0);
      serialCpu[name]!.push((used.user + used.system) / STEPS);

      c0 = process.cpuUsage();
      t0 = performance.now();
      const handles = await Promise.all(Array.from({ length: PARALLEL }, () => engine.start(flow, undefined)));
      await Promise.all(handles.map((h) => h.result({ timeoutMs: 600_000 })));
      parallel[name]!.push(((performance.now() - t0) * 1000) / (STEPS * PARALLEL));
      used = process.cpuUsage(c0);
      cpu[name]!.push((used.user + used.system) / (STEPS * PARALLEL));
    }
  }
  const load = loadavg()
    .map((x) => x.toFixed(1))
    .join(', ');
  const stored = await setup.pool.query(
    `select r.workflow_name, avg(octet_length(s.output::text))::int as bytes from runledger.steps s join runledger.runs r using (run_id) group by 1 order by 1`,
  );

  // The codec alone: encode + decode of one payload, in a loop.
  const value = payload(100);
  for (let i = 0; i < 2_000; i++) codec.decode(codec.encode(value));
  let t0 = performance.now();
  for (let i = 0; i < MICRO; i++) codec.encode(value);
  const encodeUs = ((performance.now() - t0) * 1000) / MICRO;
  const envelope = codec.encode(value);
  t0 = performance.now();
  for (let i = 0; i < MICRO; i++) codec.decode(envelope);
  const decodeUs = ((performance.now() - t0) * 1000) / MICRO;
  t0 = performance.now();
  for (let i = 0; i < MICRO; i++) JSON.parse(JSON.stringify(value));
  const jsonUs = ((performance.now() - t0) * 1000) / MICRO;

  // Added: the median of the paired differences (each repetition ran both), and their range.
  const row = (label: string, xs: Record<string, number[]>) => {
    const base = median(xs['no codec']!);
    const coded = median(xs.aesGcmCodec!);
    const diffs = xs.aesGcmCodec!.map((x, i) => x - xs['no codec']![i]!);
    const added = median(diffs);
    return (
      `| ${label} | ${base.toFixed(0)} | ${coded.toFixed(0)} | ${added.toFixed(0)} (${((added / base) * 100).toFixed(0)} %) | ` +
      `${Math.min(...diffs).toFixed(0)} to ${Math.max(...diffs).toFixed(0)} |`
    );
  };
  const report = [
    `# Payload codec: what aesGcmCodec costs per step (${new Date().toISOString().slice(0, 10)})`,
    '',
    `PostgreSQL: ${pgVersion.split(',')[0]}; ${cpus().length} cores (${cpus()[0]?.model ?? '?'}); Node ${process.version}.`,
    `A workflow of ${STEPS} \`ctx.step\`s, each returning a ${payloadBytes}-byte JSON object; two engines on one database, one`,
    `with \`aesGcmCodec\` and one without, each with its own worker (concurrency ${PARALLEL}) and queue, in this one process;`,
    `median of ${REPEATS} interleaved repetitions (after a warm-up run of each), the order of the two turned about each time.`,
    `Load average at the end: ${load} (a shared machine: other processes ran; read the differences, not the absolute figures).`,
    '',
    '```sh',
    'npm run build',
    `cd bench && DATABASE_URL=${adminUrl.replace(/\/\/[^@]*@/, '//…@')} STEPS=${STEPS} PARALLEL=${PARALLEL} REPEATS=${REPEATS} npx tsx codec.ts`,
    '```',
    '',
    '| measure | no codec | aesGcmCodec | added (median of pairs) | range of pairs |',
    '| --- | ---: | ---: | ---: | ---: |',
    row('one run at a time: wall µs per step', serial),
    row('one run at a time: process CPU µs per step', serialCpu),
    row(`${PARALLEL} runs at once: wall µs per step`, parallel),
    row(`${PARALLEL} runs at once: process CPU µs per step`, cpu),
    '',
    `Stored checkpoint size (avg \`octet_length(output::text)\`): ${stored.rows.map((r) => `${r.workflow_name === 'codec-bench-0' ? 'no codec' : 'aesGcmCodec'} ${r.bytes} B`).join(', ')}.`,
    '',
    `The codec alone, on the same ${payloadBytes}-byte value (${MICRO} iterations): encode ${encodeUs.toFixed(1)} µs, decode ${decodeUs.toFixed(1)} µs`,
    `(for comparison, \`JSON.parse(JSON.stringify(value))\` ${jsonUs.toFixed(1)} µs). A step is encoded once when it is`,
    'checkpointed and decoded once per replay; the first execution returns the value it has, without decoding.',
    '',
  ].join('\n');
  if (process.env.SAMPLES) console.log(JSON.stringify({ serial, serialCpu, parallel, cpu }));
  writeFileSync(REPORT, report);
  console.log(report);
} finally {
  await Promise.all(engines.map((engine) => engine.close()));
  await admin.query(`drop database if exists ${database} with (force)`);
  await admin.end();
}
