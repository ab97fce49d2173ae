import { createHash } from 'node:crypto';
import { afterAll, describe, expect, it } from 'vitest';
import { LARGE_VALUE_THRESHOLD_BYTES, loadLarge, storeLarge, type ArtifactRecord, type Engine } from '../../src/index.js';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';
import { useTestEngine } from '../helpers/test-engine.js';

/**
 * Artifacts (src/agents/artifact.ts, sql/0012_agents.sql): recorded exactly once with
 * their step's checkpoint, content stored once by sha256 across runs, and a 50 MB step
 * result stored by reference so the checkpoint stays small, read back equal on a replay.
 * Crashes are in-process (crashAt, manual workers, a test clock): no process is needed to
 * show what a replay does.
 */
const t = useTestEngine({ engine: false });
const { db } = t;
const engines: Engine[] = [];
afterAll(async () => {
  await Promise.all(engines.map((engine) => engine.close()));
});

const sha256 = (data: string | Uint8Array) => createHash('sha256').update(data).digest('hex');
const count = async (text: string, values: unknown[] = []) => (await db.pool.query(text, values)).rows[0].n as number;

/** Counts of tool bodies run, per name: a replay must not run them again. */
const ran: Record<string, number> = {};

function engineWith(options: Parameters<typeof createTestEngine>[0] extends infer O ? Partial<O> : never = {}) {
  const clock = createTestClock('2030-01-01T00:00:00Z');
  const engine = createTestEngine({ connectionString: db.url, clock, ...options });
  engines.push(engine);
  const suffix = engines.length;
  const diff = engine.workflow({ name: `artifact-diff-${suffix}` }, async (ctx, input: { diff: string }) => {
    const record = await ctx.artifact('diff', input.diff);
    const again = await ctx.artifact('diff-again', input.diff); // same content: a second row, the same blob
    const bytes = await ctx.artifact('bytes', new Uint8Array([0, 1, 2, 255]));
    const external = await ctx.artifact('report', { ref: 's3://bucket/report.html', sha256: 'a'.repeat(64), size: 1234 });
    await ctx.step('after', () => 'after');
    return { record, again, bytes, external };
  });
  const big = engine.workflow({ name: `artifact-big-${suffix}` }, async (ctx, input: { mb: number }) => {
    const stored = await ctx.step('tool:grep', async () => {
      ran.grep = (ran.grep ?? 0) + 1;
      return storeLarge(ctx, 'tool:grep', bigValue(input.mb));
    });
    const value = (await loadLarge(ctx, stored)) as ReturnType<typeof bigValue>;
    const small = await ctx.step('tool:small', async () => storeLarge(ctx, 'tool:small', { lines: ['one line'] }));
    return ctx.step('digest', () => ({ stored, digest: sha256(JSON.stringify(value)), lines: value.lines.length, small }));
  });
  const bad = engine.workflow({ name: `artifact-bad-${suffix}` }, async (ctx) => {
    const codes: Record<string, unknown> = {};
    const attempts: Array<[string, () => Promise<unknown>]> = [
      ['empty name', () => ctx.artifact('', 'x')],
      ['name too long', () => ctx.artifact('n'.repeat(201), 'x')],
      ['number content', () => ctx.artifact('n', 42 as never)],
      ['empty ref', () => ctx.artifact('n', { ref: '' })],
      ['bad sha256', () => ctx.artifact('n', { ref: 'x', sha256: 'not-hex' })],
      ['negative size', () => ctx.artifact('n', { ref: 'x', size: -1 })],
    ];
    for (const [label, call] of attempts) {
      try {
        await call();
        codes[label] = 'ok';
      } catch (error) {
        codes[label] = (error as { code?: unknown }).code;
      }
    }
    return codes;
  });
  return { engine, clock, diff, big, bad };
}

/** About `mb` MiB of JSON: lines of a fake tool output, deterministic. */
function bigValue(mb: number): { lines: string[] } {
  const line = 'src/agents/session.ts:42: a line of grep output, padded to be long enough '.padEnd(100, '.');
  return { lines: Array.from({ length: Math.ceil((mb * 1024 * 1024) / (line.length + 3)) }, (_, i) => `${i}:${line}`) };
}

describe('ctx.artifact', () => {
  it('is recorded once even when the run replays it (a crash right after its commit)', async () => {
    const { engine, clock, diff } = engineWith({ crashAt: { step: 'artifact:diff', when: 'after-commit' } });
    const handle = await engine.start(diff, { diff: '--- a\n+++ b\n+fixed\n' });
    const doomed = await engine.runWorker({ manual: true, leaseMs: 10_000 });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    const committed = await db.pool.query('select artifact_id from runledger.artifacts where run_id = $1', [handle.runId]);
    expect(committed.rows).toHaveLength(1);

    const survivor = await engine.runWorker({ manual: true, leaseMs: 10_000 });
    clock.advance('11s');
    await survivor.drain();
    const output = (await engine.getRun(handle.runId))!.output as {
      record: ArtifactRecord;
      again: ArtifactRecord;
      bytes: ArtifactRecord;
      external: ArtifactRecord;
    };
    expect((await engine.getRun(handle.runId))!.recoveryAttempts).toBe(1);
    // The replay returned the record the first execution committed: same id, one row.
    expect(output.record.artifactId).toBe(committed.rows[0].artifact_id);
    const rows = await db.pool.query(
      'select name, kind, sha256, size, ref, blob is not null as stored from runledger.artifacts where run_id = $1 order by step_position',
      [handle.runId],
    );
    const text = '--- a\n+++ b\n+fixed\n';
    expect(rows.rows).toEqual([
      { name: 'diff', kind: 'artifact', sha256: sha256(text), size: String(text.length), ref: null, stored: true },
      { name: 'diff-again', kind: 'artifact', sha256: sha256(text), size: String(text.length), ref: null, stored: true },
      { name: 'bytes', kind: 'artifact', sha256: sha256(new Uint8Array([0, 1, 2, 255])), size: '4', ref: null, stored: true },
      { name: 'report', kind: 'artifact', sha256: 'a'.repeat(64), size: '1234', ref: 's3://bucket/report.html', stored: false },
    ]);
    expect(output.record).toMatchObject({
      name: 'diff',
      kind: 'artifact',
      sha256: sha256(text),
      size: text.length,
      ref: null,
      runId: handle.runId,
    });
    expect(output.external).toMatchObject({ name: 'report', ref: 's3://bucket/report.html', size: 1234 });
    // The same content twice is one blob.
    expect(await count('select count(*)::int as n from runledger.artifact_blobs where sha256 = $1', [sha256(text)])).toBe(1);

    const read = await engine.readArtifact(output.record.artifactId);
    expect(read?.content?.toString('utf8')).toBe(text);
    expect((await engine.readArtifact(output.bytes.artifactId))?.content).toEqual(Buffer.from([0, 1, 2, 255]));
    expect((await engine.readArtifact(output.external.artifactId))?.content).toBeNull();
    expect(await engine.readArtifact('no-such-artifact')).toBeUndefined();
    const listed = await db.pool.query('select name, stored from runledger.artifact_list where run_id = $1 order by step_position', [
      handle.runId,
    ]);
    expect(listed.rows.map((r) => [r.name, r.stored])).toEqual([
      ['diff', true],
      ['diff-again', true],
      ['bytes', true],
      ['report', false],
    ]);
  });

  it('the same content recorded by two runs is stored as one blob', async () => {
    const { engine, diff } = engineWith();
    const worker = await engine.runWorker({ manual: true });
    const shared = 'a diff both runs produce\n';
    const first = await engine.start(diff, { diff: shared });
    const second = await engine.start(diff, { diff: shared });
    await worker.drain();
    for (const handle of [first, second]) expect((await engine.getRun(handle.runId))!.status).toBe('SUCCEEDED');
    expect(await count('select count(*)::int as n from runledger.artifacts where sha256 = $1', [sha256(shared)])).toBe(4);
    expect(await count('select count(*)::int as n from runledger.artifact_blobs where sha256 = $1', [sha256(shared)])).toBe(1);
  });

  it('bad input gets a coded error and stores nothing', async () => {
    const { engine, bad } = engineWith();
    const worker = await engine.runWorker({ manual: true });
    const handle = await engine.start(bad, {});
    await worker.drain();
    expect((await engine.getRun(handle.runId))!.output).toEqual({
      'empty name': 'INVALID_INPUT',
      'name too long': 'INVALID_INPUT',
      'number content': 'INVALID_INPUT',
      'empty ref': 'INVALID_INPUT',
      'bad sha256': 'INVALID_INPUT',
      'negative size': 'INVALID_INPUT',
    });
    expect(await count('select count(*)::int as n from runledger.artifacts where run_id = $1', [handle.runId])).toBe(0);
    expect(await count('select count(*)::int as n from runledger.steps where run_id = $1', [handle.runId])).toBe(0);
  });
});

describe('a large step result stored by reference', () => {
  it('a 50 MB tool output: one blob, small checkpoints, read back equal on the first execution and on a replay', async () => {
    const { engine, clock, big } = engineWith({ crashAt: { step: 'digest', when: 'before-checkpoint' } });
    const expected = bigValue(50);
    const expectedText = JSON.stringify(expected);
    expect(expectedText.length).toBeGreaterThan(50 * 1024 * 1024);
    ran.grep = 0;
    const handle = await engine.start(big, { mb: 50 });
    const doomed = await engine.runWorker({ manual: true, leaseMs: 10_000 });
    await doomed.drain();
    expect(doomed.crashed).toBe(true);
    const survivor = await engine.runWorker({ manual: true, leaseMs: 10_000 });
    clock.advance('11s');
    await survivor.drain();
    const run = (await engine.getRun(handle.runId))!;
    expect(run).toMatchObject({ status: 'SUCCEEDED', recoveryAttempts: 1 });
    // The tool ran once; its value came back equal from the blob on the replay.
    expect(ran.grep).toBe(1);
    const output = run.output as { stored: { $artifact: string; size: number }; digest: string; lines: number; small: unknown };
    expect(output.stored).toEqual({ $artifact: sha256(expectedText), size: Buffer.byteLength(expectedText) });
    expect(output.digest).toBe(sha256(expectedText));
    expect(output.lines).toBe(expected.lines.length);
    // Under the threshold a value is not stored by reference.
    expect(output.small).toEqual({ lines: ['one line'] });

    const blobs = await db.pool.query(
      'select sha256, size, octet_length(content) as bytes from runledger.artifact_blobs where sha256 = $1',
      [sha256(expectedText)],
    );
    expect(blobs.rows).toEqual([
      { sha256: sha256(expectedText), size: String(Buffer.byteLength(expectedText)), bytes: Buffer.byteLength(expectedText) },
    ]);
    const values = await db.pool.query(`select name, kind, step_position from runledger.artifacts where run_id = $1`, [handle.runId]);
    expect(values.rows).toEqual([{ name: 'tool:grep', kind: 'value', step_position: 0 }]);
    const steps = await db.pool.query<{ name: string; bytes: number }>(
      'select name, pg_column_size(output) as bytes from runledger.steps where run_id = $1 order by seq',
      [handle.runId],
    );
    expect(steps.rows.map((s) => s.name)).toEqual(['tool:grep', 'tool:small', 'digest']);
    for (const step of steps.rows) expect(step.bytes, step.name).toBeLessThan(300);
    const runBytes = await count('select pg_column_size(r.*) as n from runledger.runs r where run_id = $1', [handle.runId]);
    expect(runBytes).toBeLessThan(4_000);
    expect(LARGE_VALUE_THRESHOLD_BYTES).toBe(64 * 1024);
  }, 120_000);
});

describe('retention', () => {
  it('prune_artifact_blobs deletes only the blobs no artifact refers to any more', async () => {
    const before = await count('select count(*)::int as n from runledger.artifact_blobs');
    expect(await count('select runledger.prune_artifact_blobs()::int as n')).toBe(0);
    // The runs finished on the test clocks' time (2030): prune on a connection a day past it.
    const { engine, clock } = engineWith();
    clock.advance('1d');
    await engine.pool.query(`select runledger.prune('0 seconds')`);
    expect(await count('select count(*)::int as n from runledger.artifacts')).toBe(0);
    expect(await count('select runledger.prune_artifact_blobs()::int as n')).toBe(before);
    expect(await count('select count(*)::int as n from runledger.artifact_blobs')).toBe(0);
  });
});
