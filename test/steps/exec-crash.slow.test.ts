import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { useTestEngine } from '../helpers/test-engine.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';
import { waitFor } from '../helpers/database.js';
import { groupAlive } from '../helpers/process-group.js';
import { spawnWorker } from '../helpers/worker-process.js';
import { defineExecWorkflows } from '../fixtures/exec-workflows.js';

/**
 * ctx.exec when its worker dies: a worker process SIGKILLed while its command runs does not
 * leave the command's process group behind (a watcher outside the group sees the worker's
 * pipe close and kills it), and the run resumes on another worker, which runs the command
 * again (at least once, like a step) and checkpoints it once.
 */
const t = useTestEngine();
const { db } = t;
const { processes } = stoppedAfterEach();
const EXEC_WORKER = fileURLToPath(new URL('../fixtures/exec-worker.ts', import.meta.url));

describe('ctx.exec across a worker crash', () => {
  it('a SIGKILLed worker leaves no process of its command behind within grace + 2 s; another worker finishes the run', async () => {
    const { shell } = defineExecWorkflows(t.engine);
    const dir = mkdtempSync(join(tmpdir(), 'runledger-exec-crash-'));
    const pidFile = join(dir, 'pid');
    const runs = join(dir, 'runs');
    const env = { DATABASE_URL: db.url, LEASE_MS: '1000' };
    const first = await spawnWorker(env, EXEC_WORKER);
    processes.push(first);
    // The first execution records its group and sleeps; the second finds it ran before and exits 0.
    const script = `echo run >> ${runs}; if [ -f ${pidFile} ]; then echo second; exit 0; fi; echo $$ > ${pidFile}; sleep 300 & sleep 300; wait`;
    const handle = await t.engine.start(shell, { command: 'sh', args: ['-c', script], grace: '1s' });
    const pgid = await waitFor('the command started', async () => (existsSync(pidFile) ? Number(readFileSync(pidFile, 'utf8').trim()) : 0));
    expect(groupAlive(pgid)).toBe(true);

    first.kill('SIGKILL');
    await first.exited;
    const killedAt = Date.now();
    await waitFor('the command group gone', async () => !groupAlive(pgid), 10_000);
    expect(Date.now() - killedAt).toBeLessThan(3_000);

    processes.push(await spawnWorker(env, EXEC_WORKER));
    const result = await handle.result();
    expect(result).toMatchObject({ exitCode: 0, stdoutTail: 'second\n' });
    expect(readFileSync(runs, 'utf8')).toBe('run\nrun\n');
    const steps = await db.pool.query(`select status from runledger.steps where run_id = $1 and name = 'command'`, [handle.runId]);
    expect(steps.rows).toEqual([{ status: 'SUCCEEDED' }]);
    const run = (await db.pool.query(`select status, recovery_attempts from runledger.runs where run_id = $1`, [handle.runId])).rows[0];
    expect(run).toEqual({ status: 'SUCCEEDED', recovery_attempts: 1 });
  });
});
