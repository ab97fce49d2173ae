/**
 * The contract lists are defined once per language; these tests keep the copies a
 * reader meets (TypeScript, the docs, the SQL files) equal, so none can drift.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { SQLSTATES } from '../src/engine/core/errors.js';
import { RUN_STATES, RUN_TRANSITIONS, STEP_KINDS, TERMINATION_REASONS, WAIT_KINDS } from '../src/engine/core/states.js';
import { useTestEngine } from './helpers/test-engine.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const read = (path: string) => readFileSync(`${ROOT}/${path}`, 'utf8');

function filesUnder(dir: string, ending: string): string[] {
  return readdirSync(`${ROOT}/${dir}`, { recursive: true, encoding: 'utf8' })
    .filter((file) => file.endsWith(ending))
    .map((file) => `${dir}/${file}`);
}

describe('the state machine', () => {
  it('docs/state-machine.md draws exactly RUN_TRANSITIONS', () => {
    const doc = read('docs/state-machine.md');
    const diagram = doc.slice(doc.indexOf('```mermaid'), doc.indexOf('```', doc.indexOf('```mermaid') + 3));
    const drawn = [...diagram.matchAll(/^\s+([A-Z_]+) --> ([A-Z_]+):/gm)].map((m) => `${m[1]}>${m[2]}`).sort();
    expect(drawn.length).toBeGreaterThan(10);
    expect(drawn).toEqual(RUN_TRANSITIONS.map((t) => `${t.from}>${t.to}`).sort());
  });

  it('RUN_TRANSITIONS names only known states, once each, and no terminal state leaves except by retry_run or compensate_run', () => {
    const keys = RUN_TRANSITIONS.map((t) => `${t.from}>${t.to}`);
    expect(new Set(keys).size).toBe(keys.length);
    for (const t of RUN_TRANSITIONS) {
      expect(RUN_STATES).toContain(t.from);
      expect(RUN_STATES).toContain(t.to);
    }
    const fromTerminal = RUN_TRANSITIONS.filter((t) => ['SUCCEEDED', 'CANCELLED', 'TERMINATED', 'FAILED', 'DEAD_LETTER'].includes(t.from));
    // A SUCCEEDED run never leaves; compensate_run undoes only work that was cut short.
    expect(fromTerminal.map((t) => `${t.from}>${t.to}:${t.by}`)).toEqual([
      'FAILED>PENDING:retry_run',
      'DEAD_LETTER>PENDING:retry_run',
      'FAILED>CANCELLING:compensate_run',
      'CANCELLED>CANCELLING:compensate_run',
      'TERMINATED>CANCELLING:compensate_run',
      'DEAD_LETTER>CANCELLING:compensate_run',
    ]);
  });
});

describe('SQLSTATEs', () => {
  it('the SQL files raise exactly the SQLSTATEs of the table in errors.ts', () => {
    const raised = new Set<string>();
    for (const file of filesUnder('sql', '.sql')) {
      for (const m of read(file).matchAll(/errcode\s*=\s*'(RL\d{3})'/g)) raised.add(m[1]!);
    }
    expect([...raised].sort()).toEqual(Object.keys(SQLSTATES).sort());
  });

  it("docs/errors.md's error table lists each SQLSTATE with its code", () => {
    const rows = read('docs/errors.md')
      .split('\n')
      .filter((line) => /^\|[^|]*\|[^|]*\| RL\d{3} \|/.test(line))
      .map((line) => line.split('|').map((cell) => cell.trim()));
    const documented = Object.fromEntries(rows.map((cells) => [cells[3], cells[1]!.replace(/`/g, '') || null]));
    expect(documented).toEqual(Object.fromEntries(Object.entries(SQLSTATES).map(([state, entry]) => [state, entry.code])));
  });
});

describe('SQL calls from TypeScript', () => {
  it('name their arguments (runledger.fn(p_x => $1)), so a reordered parameter cannot shift values', () => {
    const positional: string[] = [];
    for (const file of filesUnder('src', '.ts')) {
      for (const m of read(file).matchAll(/runledger\.[a-z_]+\(\s*\$\d/g)) positional.push(`${file}: ${m[0]}`);
    }
    expect(positional).toEqual([]);
  });
});

describe('SQL agrees with TypeScript', () => {
  const t = useTestEngine({ engine: false });

  it('runledger.run_transitions() is RUN_TRANSITIONS, who moves the run included', async () => {
    const rows = (await t.db.pool.query('select from_status, to_status, by_whom from runledger.run_transitions()')).rows;
    const sql = rows.map((r) => `${r.from_status}>${r.to_status}:${r.by_whom}`).sort();
    expect(sql).toEqual(RUN_TRANSITIONS.map((tr) => `${tr.from}>${tr.to}:${tr.by}`).sort());
  });

  it('termination_reasons(), step_kinds() and wait_kinds() are TERMINATION_REASONS, STEP_KINDS and WAIT_KINDS, in order', async () => {
    const row = (
      await t.db.pool.query(
        'select runledger.termination_reasons() as reasons, runledger.step_kinds() as steps, runledger.wait_kinds() as waits',
      )
    ).rows[0];
    expect(row).toEqual({ reasons: [...TERMINATION_REASONS], steps: [...STEP_KINDS], waits: [...WAIT_KINDS] });
  });
});
