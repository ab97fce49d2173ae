import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startConsole, type RunningConsole } from '../../src/console/server.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';
import { stoppedAfterEach } from '../helpers/cleanup.js';

/**
 * Execution environments in the console: the run page shows the manifest and the reclaim;
 * the problems page lists environments whose reclaim keeps failing after their run ended.
 */
const t = useTestEngine();
const { db } = t;
const { workers } = stoppedAfterEach();
let ui: RunningConsole;

beforeAll(async () => {
  ui = await startConsole({ pool: db.pool, port: 0 });
});
afterAll(async () => {
  await ui?.close();
});

const page = async (path: string) => {
  const answer = await fetch(`${ui.url}${path}`);
  expect(answer.status).toBe(200);
  return answer.text();
};

describe('environments in the console', () => {
  it('the run page shows the environment and its reclaim; a failing reclaim is listed under problems until it succeeds', async () => {
    let sandboxUp = false;
    const wf = t.engine.workflow(
      {
        name: 'console-env',
        queue: 'console-env',
        environment: {
          create: () => ({ sandbox: 'sbx-42' }),
          reclaim: () => {
            if (!sandboxUp) throw new Error('sandbox API unreachable');
          },
        },
      },
      async () => 'done',
    );
    workers.push(await t.engine.runWorker({ queues: ['console-env'], pollIntervalMs: 50, sweepIntervalMs: 250 }));
    const handle = await t.engine.start(wf, undefined);
    await handle.result();
    await waitFor(
      'the failed reclaim',
      async () =>
        (await db.pool.query('select last_error from runledger.environments where run_id = $1', [handle.runId])).rows[0]?.last_error,
    );

    const run = await page(`/runs/${handle.runId}`);
    expect(run).toContain('<h2>Environment</h2>');
    expect(run).toContain('sbx-42');
    expect(run).toContain('not reclaimed yet');
    expect(run).toContain('sandbox API unreachable');
    const problems = await page('/problems');
    expect(problems).toContain('Environments not reclaimed (1)');
    expect(problems).toContain(`/runs/${handle.runId}`);

    // The sandbox API is back; the retry is due now (time passes here by moving it).
    sandboxUp = true;
    await db.pool.query('update runledger.environments set reclaim_until = now() where run_id = $1', [handle.runId]);
    await waitFor(
      'the reclaim',
      async () =>
        (await db.pool.query('select reclaimed_at from runledger.environments where run_id = $1', [handle.runId])).rows[0]?.reclaimed_at,
    );
    expect(await page(`/runs/${handle.runId}`)).toContain('reclaimed (SUCCEEDED)');
    expect(await page('/problems')).not.toContain('Environments not reclaimed');
  });

  it('a run without an environment has no environment section', async () => {
    const wf = t.engine.workflow({ name: 'console-no-env', queue: 'console-no-env' }, async () => 1);
    const handle = await t.engine.start(wf, undefined);
    expect(await page(`/runs/${handle.runId}`)).not.toContain('<h2>Environment</h2>');
  });
});
