import { mkdtempSync, readFileSync, existsSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';
import { groupAlive } from '../helpers/process-group.js';
import { defineExecWorkflows } from '../fixtures/exec-workflows.js';

/**
 * ctx.exec (src/steps/exec.ts): a child process as a step in a process group of its own.
 * The seed's "cancelled, but the shell keeps running": a cancel kills the whole group
 * (TERM, then KILL after the grace) and the run is CANCELLED only once it is gone.
 */
const t = useTestEngine();
const { db } = t;
const { workers } = stoppedAfterEach();
const dir = mkdtempSync(join(tmpdir(), 'runledger-exec-'));
let files = 0;
const newFile = () => join(dir, `f${++files}`);

async function readPid(file: string): Promise<number> {
  return waitFor(`the command's pid in ${file}`, async () => (existsSync(file) ? Number(readFileSync(file, 'utf8').trim()) : 0));
}

let defined: ReturnType<typeof defineExecWorkflows> | undefined;
/** The fixture workflows, defined on the file's engine once it exists. */
const workflows = () => (defined ??= defineExecWorkflows(t.engine));

describe('ctx.exec', () => {
  const worker = async () =>
    workflows() && workers.push(await t.engine.runWorker({ queues: ['exec'], concurrency: 2, leaseMs: 2_000, pollIntervalMs: 50 }));

  it('records exit code, output tails and duration; a non-zero exit is a result; a replay does not run the command again', async () => {
    await worker();
    const counter = newFile();
    const handle = await t.engine.start(workflows().shell, {
      command: 'sh',
      args: ['-c', `echo ran >> ${counter}; echo hello; echo oops >&2; exit 3`],
      waitAfter: true,
    });
    await waitFor(
      'the run waiting after its exec',
      async () =>
        (await db.pool.query(`select wait_kind from runledger.runs where run_id = $1`, [handle.runId])).rows[0].wait_kind === 'signal',
    );
    await t.engine.signal(handle.runId, 'done');
    const result = await handle.result();
    expect(result).toMatchObject({ exitCode: 3, signal: null, stdoutTail: 'hello\n', stderrTail: 'oops\n' });
    expect(result.durationMs).toBeGreaterThanOrEqual(0);
    expect(readFileSync(counter, 'utf8')).toBe('ran\n');
    const step = (await db.pool.query(`select status, output from runledger.steps where run_id = $1 and name = 'command'`, [handle.runId]))
      .rows[0];
    expect(step.status).toBe('SUCCEEDED');
    expect(step.output).toMatchObject({ exitCode: 3, stdoutTail: 'hello\n' });
  });

  it('keeps the last tailBytes of each stream', async () => {
    const wf = t.engine.workflow({ name: 'tails', queue: 'exec' }, async (ctx) =>
      ctx.exec('long-output', { command: 'sh', args: ['-c', 'seq 1 5000'], tailBytes: 20 }),
    );
    await worker();
    const result = await (await t.engine.start(wf, undefined)).result();
    expect(Buffer.byteLength(result.stdoutTail)).toBe(20);
    expect(result.stdoutTail.endsWith('4998\n4999\n5000\n')).toBe(true);
  });

  it('binary output (a NUL, bytes that are not UTF-8) is checkpointed as text, not a failed step', async () => {
    const wf = t.engine.workflow({ name: 'binary-output', queue: 'exec' }, async (ctx) =>
      ctx.exec('binary', { command: 'sh', args: ['-c', "printf 'a\\000b\\377c'"] }),
    );
    await worker();
    const result = await (await t.engine.start(wf, undefined)).result();
    expect(result).toMatchObject({ exitCode: 0, stdoutTail: 'a\uFFFDb\uFFFDc' });
  });

  it('keepOutput stores the whole output, binary included, as two artifacts of the run; the checkpoint names them', async () => {
    const wf = t.engine.workflow({ name: 'kept-output', queue: 'exec' }, async (ctx) =>
      ctx.exec('build', { command: 'sh', args: ['-c', "seq 1 20000; printf 'x\\000y' >&2"], tailBytes: 10, keepOutput: true }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    const result = await handle.result();
    const expected = Array.from({ length: 20_000 }, (_, i) => `${i + 1}\n`).join('');
    expect(result.stdoutTail).toBe('9999\n20000\n'.slice(-10));
    expect(result.stdoutArtifact).toMatchObject({ size: Buffer.byteLength(expected), truncated: false });
    expect(result.stderrArtifact).toMatchObject({ size: 3, truncated: false });
    const stdout = await t.engine.readArtifact(result.stdoutArtifact!.artifactId);
    expect(stdout?.record).toMatchObject({ runId: handle.runId, name: 'build.stdout', kind: 'value' });
    expect(stdout?.content?.toString('utf8')).toBe(expected);
    // Bytes as the command wrote them: the NUL is kept (only the tail, a checkpointed text, replaces it).
    expect((await t.engine.readArtifact(result.stderrArtifact!.artifactId))?.content).toEqual(Buffer.from([0x78, 0, 0x79]));
    const step = (await db.pool.query(`select seq, output from runledger.steps where run_id = $1 and name = 'build'`, [handle.runId]))
      .rows[0];
    expect(step.output.stdoutArtifact.artifactId).toBe(result.stdoutArtifact!.artifactId);
    const rows = await db.pool.query(`select name, step_position from runledger.artifacts where run_id = $1 order by name`, [handle.runId]);
    expect(rows.rows).toEqual([
      { name: 'build.stderr', step_position: step.seq },
      { name: 'build.stdout', step_position: step.seq },
    ]);
  });

  it('keepOutput with a silent command stores nothing', async () => {
    const wf = t.engine.workflow({ name: 'kept-nothing', queue: 'exec' }, async (ctx) =>
      ctx.exec('quiet', { command: 'true', keepOutput: true }),
    );
    await worker();
    const handle = await t.engine.start(wf, undefined);
    expect(await handle.result()).toMatchObject({ exitCode: 0, stdoutArtifact: null, stderrArtifact: null });
    expect((await db.pool.query(`select 1 from runledger.artifacts where run_id = $1`, [handle.runId])).rowCount).toBe(0);
  });

  it('a cancelled run kills the whole group, background jobs too, and is CANCELLED within grace + 2 s, only once the group is gone', async () => {
    await worker();
    const pidFile = newFile();
    // The shell ignores TERM and starts a background sleep: only the KILL after the grace ends them.
    const handle = await t.engine.start(workflows().shell, {
      command: 'sh',
      args: ['-c', `trap '' TERM; echo $$ > ${pidFile}; sleep 300 & sleep 300; wait`],
      grace: '1s',
    });
    const pgid = await readPid(pidFile);
    expect(groupAlive(pgid)).toBe(true);
    const cancelledAt = Date.now();
    await t.engine.cancel(handle.runId);
    const seenAlive: boolean[] = [];
    await waitFor('the run CANCELLED', async () => {
      const status = (await db.pool.query(`select status from runledger.runs where run_id = $1`, [handle.runId])).rows[0].status;
      if (status === 'CANCELLED') seenAlive.push(groupAlive(pgid));
      return status === 'CANCELLED';
    });
    const tookMs = Date.now() - cancelledAt;
    expect(seenAlive).toEqual([false]);
    expect(tookMs).toBeGreaterThanOrEqual(1_000); // TERM was ignored: the KILL came after the grace
    expect(tookMs).toBeLessThan(3_000);
  });

  it('an attempt past its timeout kills the group and fails with STEP_TIMEOUT', async () => {
    await worker();
    const pidFile = newFile();
    const handle = await t.engine.start(workflows().shell, {
      command: 'sh',
      args: ['-c', `echo $$ > ${pidFile}; exec sleep 300`],
      timeout: '300ms',
      grace: '200ms',
    });
    await expect(handle.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    expect(groupAlive(await readPid(pidFile))).toBe(false);
    const step = (await db.pool.query(`select status, error from runledger.steps where run_id = $1 and name = 'command'`, [handle.runId]))
      .rows[0];
    expect(step).toMatchObject({ status: 'FAILED', error: { code: 'STEP_TIMEOUT' } });
    expect(step.error.message).toContain('ran past its timeout of 300 ms and was killed');
  });

  it('a command that cannot start fails the step with its error; bad options are a ConfigError', async () => {
    const badKeep = t.engine.workflow({ name: 'bad-keep-output', queue: 'exec' }, async (ctx) =>
      ctx.exec('keep', { command: 'true', keepOutput: 'yes' as never }),
    );
    await worker();
    const missing = await t.engine.start(workflows().shell, { command: 'runledger-no-such-command' });
    await expect(missing.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    const step = (await db.pool.query(`select error from runledger.steps where run_id = $1 and name = 'command'`, [missing.runId])).rows[0];
    expect(step.error).toMatchObject({ code: 'ENOENT' });
    const empty = await t.engine.start(workflows().shell, { command: '' });
    await expect(empty.result()).rejects.toThrow(/options.command must be a non-empty string/);
    const badGrace = await t.engine.start(workflows().shell, { command: 'true', grace: 'soon' });
    await expect(badGrace.result()).rejects.toThrow(/grace/);
    const kept = await t.engine.start(badKeep, undefined);
    await expect(kept.result()).rejects.toThrow(/keepOutput must be true or false/);
    expect((await db.pool.query(`select error->>'code' as code from runledger.runs where run_id = $1`, [kept.runId])).rows[0].code).toBe(
      'CONFIG',
    );
  });
});
