import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import type { System } from '../systems/types.js';
import type { Measurement, Workload } from '../workloads/types.js';
import { config } from './config.js';
import { median } from './stats.js';

export interface Row {
  workload: string;
  metric: string;
  better: 'higher' | 'lower';
  noRatio?: boolean;
  /** Per system id: the median, or a note when there is no number. */
  cells: Record<string, { value?: number; text: string }>;
}

function fmt(value: number, digits?: number): string {
  if (digits !== undefined) return value.toFixed(digits);
  if (Math.abs(value) >= 100) return Math.round(value).toLocaleString('en');
  if (Math.abs(value) >= 10) return value.toFixed(1);
  return value.toFixed(2);
}

/** Median over repetitions of one metric of one system, with the caveats the repetitions carry. */
export function cell(reps: Measurement[] | undefined, key: string, digits?: number, cappable = false): { value?: number; text: string } {
  if (!reps || reps.length === 0) return { text: '—' };
  const errors = reps.filter((r) => typeof r.error === 'string');
  const ok = reps.filter((r) => typeof r.error !== 'string');
  if (ok.length === 0) return { text: `error: ${String(errors[0]!.error).slice(0, 60)}` };
  const numbers = ok.map((r) => r[key]).filter((v): v is number => typeof v === 'number' && Number.isFinite(v));
  if (numbers.length * 2 <= ok.length) {
    const note = ok.map((r) => r[`note_${key}`] ?? r.note).find((n) => typeof n === 'string');
    return { text: typeof note === 'string' ? note : 'n/a' };
  }
  const value = median(numbers)!;
  const capped = cappable && ok.some((r) => r.capped === true);
  return { value, text: `${fmt(value, digits)}${capped ? '*' : ''}${errors.length ? ` (${errors.length} rep failed)` : ''}` };
}

export function ratio(a?: number, b?: number): string {
  if (a === undefined || b === undefined || b === 0) return '—';
  const r = a / b;
  return r >= 100 ? r.toFixed(0) : r >= 10 ? r.toFixed(1) : r.toFixed(2);
}

export function buildRows(workloads: Workload[], systems: System[], results: Record<string, Record<string, Measurement[]>>): Row[] {
  const rows: Row[] = [];
  for (const workload of workloads) {
    const bySystem = results[workload.name];
    if (!bySystem) continue;
    for (const metric of workload.metrics) {
      const cells: Row['cells'] = {};
      for (const system of systems)
        cells[system.id] = workload.runsOn(system) ? cell(bySystem[system.id], metric.key, metric.digits, metric.cappable) : { text: '—' };
      rows.push({ workload: workload.name, metric: metric.label, better: metric.better, noRatio: metric.noRatio, cells });
    }
  }
  return rows;
}

/** After each _history workload's rows: history ÷ fresh for its ratio metrics, per system. */
export function historyRows(
  rows: Row[],
  workloads: Workload[],
  systems: System[],
  results: Record<string, Record<string, Measurement[]>>,
): Row[] {
  const out: Row[] = [];
  for (const workload of workloads) {
    out.push(...rows.filter((r) => r.workload === workload.name));
    const fresh = workload.freshOf;
    if (!fresh || !results[workload.name]) continue;
    for (const key of fresh.keys) {
      const metric = workload.metrics.find((m) => m.key === key)!;
      const cells: Row['cells'] = {};
      for (const system of systems) {
        const h = workload.runsOn(system) ? cell(results[workload.name]?.[system.id], key).value : undefined;
        const f = cell(results[fresh.workload]?.[system.id], key).value;
        cells[system.id] =
          h === undefined || f === undefined || f === 0
            ? { text: results[fresh.workload] || !workload.runsOn(system) ? '—' : `— (${fresh.workload} not run)` }
            : { value: h / f, text: (h / f).toFixed(2) };
      }
      out.push({ workload: workload.name, metric: `${metric.label}: history ÷ fresh`, better: metric.better, noRatio: true, cells });
    }
  }
  return out;
}

export function markdownTable(rows: Row[], systems: System[]): string {
  const peers = systems.filter((s) => s.id !== 'runledger');
  const head = ['workload', 'metric', ...systems.map((s) => s.label), ...peers.map((p) => `runledger ÷ ${p.label}`)];
  const lines = [`| ${head.join(' | ')} |`, `|${head.map((_, i) => (i < 2 ? ' --- ' : ' ---: ')).join('|')}|`];
  for (const row of rows) {
    const rl = row.cells.runledger?.value;
    const values = systems.map((s) => row.cells[s.id]?.text ?? '—');
    const ratios = peers.map((p) => (row.noRatio ? '' : ratio(rl, row.cells[p.id]?.value)));
    lines.push(`| ${row.workload} | ${row.metric}${row.better === 'lower' ? ' ↓' : ''} | ${[...values, ...ratios].join(' | ')} |`);
  }
  return lines.join('\n');
}

export function writeResults(name: string, markdown: string, json: unknown): { md: string; json: string } {
  const dir = fileURLToPath(new URL('../results', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const md = join(dir, `${name}.md`);
  const js = join(dir, `${name}.json`);
  writeFileSync(md, markdown);
  writeFileSync(js, `${JSON.stringify(json, null, 2)}\n`);
  return { md, json: js };
}

export function sizesLine(): string {
  return [
    `repetitions ${config.reps}`,
    `concurrency ${config.concurrency}`,
    `enqueuers ${config.enqueuers}`,
    `pool max ${config.poolMax}`,
    `queue ${config.queueJobs}`,
    `workflow3 ${config.workflow3Runs}`,
    `txstep ${config.txstepRuns}`,
    `latency ${config.latencySamples} samples (≤ ${config.latencyMaxSeconds} s)`,
    `recovery ${config.recoveryRuns} (cap ${config.recoveryTimeoutSeconds} s)`,
    `history ${config.historyFinished} finished + ${config.historyWaiting} waiting (warm-up ${config.historyWarmUnits})`,
    `closedloop ${config.closedLoopCallers} callers × ${config.closedLoopCalls} calls`,
    `bulk ${config.bulkJobs} jobs in batches of ${config.bulkBatch}`,
    `drain cap ${config.drainCapSeconds} s`,
    `pgbench ${config.pgbenchSeconds} s`,
  ].join(', ');
}
