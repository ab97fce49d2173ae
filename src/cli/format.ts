/** Text output for the CLI: borderless tables that fit the terminal, times, durations, JSON. */
import Table from 'cli-table3';
import { cliIo } from './shared.js';

/**
 * The width tables and wrapped values fit: the terminal's width when stdout is one
 * (COLUMNS when the terminal does not say: cliIo().columns), and no limit at all when
 * stdout is a pipe or a file, so `runledger runs | grep ...` never sees a cell cut with '…'.
 */
export function screenWidth(): number {
  const columns = cliIo().columns;
  return columns === undefined ? Infinity : Math.max(60, columns);
}

const GAP = 2;
const NO_BORDERS = {
  top: '',
  'top-mid': '',
  'top-left': '',
  'top-right': '',
  bottom: '',
  'bottom-mid': '',
  'bottom-left': '',
  'bottom-right': '',
  left: '',
  'left-mid': '',
  mid: '',
  'mid-mid': '',
  right: '',
  'right-mid': '',
  middle: ' '.repeat(GAP),
};

export interface TableOptions {
  /** Columns that may be cut (with '…') to fit the width, most expendable first. Others are never cut. */
  shrink?: number[];
  /** Right-aligned columns (numbers). */
  right?: number[];
  /** Spaces before every line (counted in the width). */
  indent?: number;
}

/**
 * Plain columns, like `ps` or `kubectl get`: easy to read and to grep. When the
 * natural widths exceed the screen, the `shrink` columns give up space, so ids
 * and statuses are never cut.
 */
export function renderTable(head: string[], rows: string[][], options: TableOptions = {}): string {
  const natural = head.map((h, i) => Math.max(h.length, ...rows.map((row) => (row[i] ?? '').length)));
  const widths = [...natural];
  let excess = widths.reduce((sum, w) => sum + w, 0) + GAP * (widths.length - 1) + (options.indent ?? 0) - screenWidth();
  for (const i of options.shrink ?? []) {
    if (excess <= 0) break;
    const give = Math.min(excess, widths[i]! - Math.max(8, head[i]!.length));
    if (give > 0) {
      widths[i]! -= give;
      excess -= give;
    }
  }
  const table = new Table({
    head,
    chars: NO_BORDERS,
    style: { head: [], border: [], 'padding-left': 0, 'padding-right': 0 },
    colWidths: widths,
    colAligns: head.map((_, i) => (options.right?.includes(i) ? 'right' : 'left')),
    truncate: '…',
    wordWrap: false,
  });
  table.push(...rows.map((row) => row.map((cell) => cell.replace(/\s+/g, ' '))));
  return table
    .toString()
    .split('\n')
    .map((line) => line.trimEnd())
    .filter((line) => line.length > 0)
    .map((line) => ' '.repeat(options.indent ?? 0) + line)
    .join('\n');
}

/** "12s ago", "5m ago", "3h ago", "2d ago": enough to scan a list; `show` has exact times. */
export function ago(date: Date | null | undefined, now = Date.now()): string {
  if (!date) return '-';
  const seconds = Math.round((now - date.getTime()) / 1000);
  if (seconds < 0) return `in ${fmtSpan(-seconds)}`;
  return `${fmtSpan(seconds)} ago`;
}

function fmtSpan(seconds: number): string {
  if (seconds < 60) return `${seconds}s`;
  if (seconds < 3600) return `${Math.floor(seconds / 60)}m`;
  if (seconds < 86400) return `${Math.floor(seconds / 3600)}h`;
  return `${Math.floor(seconds / 86400)}d`;
}

/** Milliseconds as "4 ms", "1.24 s", "3m 05s". */
export function duration(ms: number): string {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60_000) return `${(ms / 1000).toFixed(2)} s`;
  const s = Math.round(ms / 1000);
  return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, '0')}s`;
}

/** Offset from the start of a run, for timelines: "+0.015s" ("-44.661s" for a checkpoint a fork copied from its source). */
export function offset(at: Date, from: Date): string {
  const seconds = (at.getTime() - from.getTime()) / 1000;
  return `${seconds < 0 ? '-' : '+'}${Math.abs(seconds).toFixed(3)}s`;
}

/** UTC with milliseconds, no 'T': the server's clock, whatever the viewer's time zone. */
export function timestamp(date: Date | null | undefined): string {
  return date ? date.toISOString().replace('T', ' ').replace('Z', ' UTC') : '-';
}

/** One-line JSON cut to `max` characters; '-' for null/undefined. */
export function shortJson(value: unknown, max = 60): string {
  if (value === null || value === undefined) return '-';
  const text = JSON.stringify(value) ?? String(value);
  return text.length <= max ? text : `${text.slice(0, max - 1)}…`;
}

/**
 * Wraps `text` into lines of at most `width` characters, breaking at a space when
 * one is near the end of the line, at most `maxLines` of them (the last ends with
 * '…' when cut): long values stay readable without flooding the screen.
 */
export function wrap(text: string, width: number, maxLines = 3): string[] {
  let rest = text.replace(/\s*[\r\n]\s*|\t/g, ' ');
  const lines: string[] = [];
  while (rest.length > width && lines.length < maxLines) {
    const space = rest.lastIndexOf(' ', width);
    const cut = space > width / 2 ? space : width;
    lines.push(rest.slice(0, cut).trimEnd());
    rest = rest.slice(cut).trimStart();
  }
  if (lines.length < maxLines) lines.push(rest);
  else if (rest.length > 0) lines[maxLines - 1] = `${lines[maxLines - 1]!.slice(0, width - 1)}…`;
  return lines;
}

export function print(line = ''): void {
  cliIo().stdout.write(`${line}\n`);
}

/**
 * The `--json` output of a command: one JSON document on stdout. Rows keep the column
 * names of the view or table they come from (snake_case, as psql and `audit --json` show
 * them); counts PostgreSQL returns as text (bigint) are numbers.
 */
export function printJson(value: unknown): void {
  print(JSON.stringify(value, null, 2));
}
