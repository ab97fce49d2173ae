// runledger/workflow-world under SIGKILL, with real processes: the SDK's own app server
// (@workflow/world-testing's server.mjs, with its workflows) runs a runledger worker in-process.
// One server is killed at a chosen point; another is started; the tables say that the SDK run
// completed, once, and that the runledger run carrying its message was taken over.
import cp from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { hydrateWorkflowReturnValue } from '@workflow/core/serialization';
import pg from 'pg';
import { afterAll, afterEach, beforeAll, describe, expect, it, onTestFailed, vi } from 'vitest';

const SERVER = fileURLToPath(new URL('./node_modules/@workflow/world-testing/dist/src/server.mjs', import.meta.url));
const CRASH_WORLD = './crash-world.mjs';
const started = [];
let db;

beforeAll(async () => {
  db = new pg.Client({ connectionString: process.env.DATABASE_URL });
  await db.connect();
});
afterAll(() => db?.end());
afterEach(() => {
  for (const server of started.splice(0)) server.proc.kill('SIGKILL');
});

/** Starts the SDK's app server on `world`, as the suite does, keeping its process to kill. */
async function startServer(world, env = {}) {
  const proc = cp.spawn(process.execPath, [SERVER], {
    // The World's module path is relative to this folder, as the suite's is.
    cwd: fileURLToPath(new URL('.', import.meta.url)),
    stdio: ['ignore', 'pipe', 'pipe', 'pipe'],
    env: { ...process.env, WORKFLOW_TARGET_WORLD: world, CONTROL_FD: '3', LEASE_MS: '1000', ...env },
  });
  let output = '';
  proc.stdout.on('data', (chunk) => (output += chunk));
  proc.stderr.on('data', (chunk) => (output += chunk));
  const exited = new Promise((resolve) => proc.on('exit', (code, signal) => resolve({ code, signal })));
  const server = { proc, exited, output: () => output };
  started.push(server);
  onTestFailed(() => console.log(`--- server ${proc.pid} (${world}) ---\n${output.slice(-6000)}`));
  let control = '';
  for await (const chunk of proc.stdio[3]) {
    control += chunk;
    if (control.includes('\n')) break;
  }
  server.port = JSON.parse(control.split('\n')[0]).info.port;
  return server;
}

async function invoke(server, file, workflow, args) {
  const response = await fetch(`http://localhost:${server.port}/invoke`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ file, workflow, args }),
  });
  return (await response.json()).runId;
}

const one = async (sql, params) => (await db.query(sql, params)).rows[0];
const deliveryOf = (runId) =>
  one(
    `select run_id, status::text, fencing_token::int, recovery_attempts from runledger.runs
      where workflow_name = 'workflow-world' and input ->> 'runId' = $1 order by created_at limit 1`,
    [runId],
  );
const eventCounts = async (runId) =>
  Object.fromEntries(
    (await db.query('select event_type, count(*)::int as n from runledger.wf_events where run_id = $1 group by 1', [runId])).rows.map(
      (r) => [r.event_type, r.n],
    ),
  );

async function completedOutput(runId) {
  const run = await vi.waitFor(
    async () => {
      const row = await one(`select status, output::text as output from runledger.wf_runs where run_id = $1`, [runId]);
      expect(row?.status).toBe('completed');
      return row;
    },
    { interval: 200, timeout: 30_000 },
  );
  const tagged = JSON.parse(run.output);
  return hydrateWorkflowReturnValue(new Uint8Array(Buffer.from(tagged.data, 'base64')), runId, undefined);
}

describe('runledger/workflow-world, SIGKILLed', () => {
  it('killed after the app handled a delivery, before runledger recorded it: another server takes the delivery over; nothing runs twice', async () => {
    const first = await startServer(CRASH_WORLD, {
      CRASH_AT: JSON.stringify({ when: 'before-checkpoint', step: 'deliver-1', action: 'kill' }),
    });
    const runId = await invoke(first, 'workflows/inline-execution.ts', 'sequentialStepsWorkflow', [10]);
    expect((await first.exited).signal).toBe('SIGKILL');
    // The SDK run finished inside the delivery; runledger never heard the delivery end.
    expect((await deliveryOf(runId)).status).toBe('RUNNING');

    await startServer(CRASH_WORLD);
    expect(await completedOutput(runId)).toBe(20);
    await vi.waitFor(async () => expect((await deliveryOf(runId)).status).toBe('SUCCEEDED'), { interval: 200, timeout: 30_000 });
    const delivery = await deliveryOf(runId);
    // Claimed by the killed worker, then by the second server's.
    expect(delivery.fencing_token).toBeGreaterThanOrEqual(2);
    const counts = await eventCounts(runId);
    // Each step started once and completed once; the run completed once.
    expect(counts.run_completed).toBe(1);
    expect(counts.step_started).toBe(counts.step_completed);
    expect(counts.step_created).toBe(counts.step_completed);
  });

  it('killed while the run sleeps: the wake-up is a runledger run due later, which another server delivers when it is due', async () => {
    const first = await startServer(CRASH_WORLD);
    const runId = await invoke(first, 'workflows/inline-execution.ts', 'sleepWorkflow', []);
    // The SDK answers a sleep by queueing the run's next message with a delay: a runledger run
    // that starts when the sleep ends, holding no worker until then.
    await vi.waitFor(
      async () => {
        const { rows } = await db.query(
          `select status::text from runledger.runs where workflow_name = 'workflow-world' and input ->> 'runId' = $1 order by created_at`,
          [runId],
        );
        expect(rows.map((row) => row.status)).toEqual(['SUCCEEDED', 'PENDING']);
      },
      { interval: 20, timeout: 20_000 },
    );
    first.proc.kill('SIGKILL');
    expect((await first.exited).signal).toBe('SIGKILL');

    await startServer(CRASH_WORLD);
    expect(await completedOutput(runId)).toBe(3);
    const counts = await eventCounts(runId);
    expect(counts).toMatchObject({ run_completed: 1, wait_created: 1, wait_completed: 1 });
    expect(counts.step_started).toBe(counts.step_completed);
  });
});
