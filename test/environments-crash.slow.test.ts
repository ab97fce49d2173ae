import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { describe, expect, it } from 'vitest';
import { useTestEngine } from './helpers/test-engine.js';
import { stoppedAfterEach } from './helpers/cleanup.js';
import { waitFor } from './helpers/database.js';
import { spawnWorker } from './helpers/worker-process.js';
import { defineEnvironmentWorkflows } from './fixtures/environment-workflows.js';

/**
 * Environments across a worker crash, with real processes. Worker a makes the environments of
 * two runs and is SIGKILLed: one run waits for a signal, the other is in the middle of a step
 * and has no recovery attempt left. Worker b resumes the first (rebuilding its environment,
 * then reclaiming it once it succeeds) and, its lease expired, dead-letters the second and
 * reclaims that one's environment too. From the log each process appends to, and from
 * runledger.environments.
 */
const t = useTestEngine();
const { db } = t;
const { processes } = stoppedAfterEach();
const WORKER = fileURLToPath(new URL('./fixtures/environment-worker.ts', import.meta.url));

describe('environments across a worker crash', () => {
  it('a SIGKILLed worker: the waiting run is rebuilt and reclaimed elsewhere; the busy one is dead-lettered and reclaimed', async () => {
    const logFile = join(mkdtempSync(join(tmpdir(), 'runledger-env-crash-')), 'log');
    const story = (runId: string) =>
      (existsSync(logFile) ? readFileSync(logFile, 'utf8') : '')
        .split('\n')
        .filter((line) => line.split(' ')[1] === runId)
        .map((line) => line.split(' '));
    const status = async (runId: string) =>
      (await db.pool.query(`select status from runledger.runs where run_id = $1`, [runId])).rows[0].status;
    const env = { DATABASE_URL: db.url, LEASE_MS: '1000', ENV_LOG: logFile };
    const { workspace } = defineEnvironmentWorkflows(t.engine, logFile);
    // The busy run starts with no recovery attempt: when its worker dies, it is dead-lettered.
    const strict = t.newEngine();
    const strictWorkflows = defineEnvironmentWorkflows(strict, logFile, { maxRecoveryAttempts: 0 });

    const a = await spawnWorker(env, WORKER);
    processes.push(a);
    const waiting = await t.engine.start(workspace, { wait: true });
    const busy = await strict.start(strictWorkflows.workspace, { busyMs: 60_000 });
    await waitFor('one run waiting, the other busy on worker a', async () => {
      const busySteps = await db.pool.query(`select count(*)::int as n from runledger.steps where run_id = $1 and name = '@environment'`, [
        busy.runId,
      ]);
      return (await status(waiting.runId)) === 'WAITING' && (await status(busy.runId)) === 'RUNNING' && busySteps.rows[0].n === 1;
    });
    a.kill('SIGKILL');
    await a.exited;

    const b = await spawnWorker(env, WORKER);
    processes.push(b);
    await t.engine.signal(waiting.runId, 'go');
    const output = await waiting.result();
    expect(output.exists).toBe(true);
    await waitFor(
      'both reclaimed',
      async () => [waiting.runId, busy.runId].every((id) => story(id).some((l) => l[0] === 'reclaim')),
      20_000,
    );
    // The reclaim callback logs before its worker records the reclaim in the table.
    await waitFor(
      'both reclaims recorded',
      async () =>
        (
          await db.pool.query(
            `select count(*)::int as n from runledger.environments where run_id = any($1) and reclaimed_status is not null`,
            [[waiting.runId, busy.runId]],
          )
        ).rows[0].n === 2,
    );

    const resumed = story(waiting.runId);
    expect(resumed.map((l) => [l[0], l.at(-1)])).toEqual([
      ['create', String(a.pid)],
      ['rehydrate', String(b.pid)],
      ['reclaim', String(b.pid)],
    ]);
    expect(resumed[2]!.slice(2, 4)).toEqual(['SUCCEEDED', 'true']);
    expect(await status(busy.runId)).toBe('DEAD_LETTER');
    const dead = story(busy.runId);
    expect(dead.map((l) => [l[0], l.at(-1)])).toEqual([
      ['create', String(a.pid)],
      ['reclaim', String(b.pid)],
    ]);
    expect(dead[1]![2]).toBe('DEAD_LETTER');
    const rows = await db.pool.query(
      `select reclaimed_status, reclaim_attempts from runledger.environments where run_id = any($1) order by reclaimed_status`,
      [[waiting.runId, busy.runId]],
    );
    expect(rows.rows).toEqual([
      { reclaimed_status: 'DEAD_LETTER', reclaim_attempts: 1 },
      { reclaimed_status: 'SUCCEEDED', reclaim_attempts: 1 },
    ]);
  });
});
