import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { aesGcmCodec } from '../src/index.js';
import { useTestEngine } from './helpers/test-engine.js';
import { claimRun } from './helpers/claim.js';
import { waitFor } from './helpers/database.js';

/**
 * A run that ends DEAD_LETTER carries the last error that put it there (class, code,
 * message, SQLSTATE) in runs.error and in evidence.last_error: never error = NULL
 * (sql/0004_claim_and_leases.sql, docs/state-machine.md).
 */
const t = useTestEngine({ engine: { codec: aesGcmCodec({ keys: { k1: randomBytes(32).toString('base64') }, activeKey: 'k1' }) } });
const { db } = t;

async function runRow(runId: string) {
  return (
    await db.pool.query('select status, error, termination_reason, termination_evidence from runledger.runs where run_id = $1', [runId])
  ).rows[0];
}

async function startRaw(workflow: string, maxRecoveryAttempts: number): Promise<string> {
  await db.pool.query(`select runledger._register_workflow($1, '1', 'default', $2)`, [workflow, maxRecoveryAttempts]);
  const { rows } = await db.pool.query(`select runledger.start_run($1, '{}'::jsonb) as run_id`, [workflow]);
  return rows[0].run_id;
}

describe('the error of a dead letter', () => {
  it('a worker that cannot read a payload (PAYLOAD_KEY_MISSING) releases the run until it dead-letters: the error is the last release', async () => {
    const flow = t.engine.workflow({ name: 'dl-codec', maxRecoveryAttempts: 2 }, async (_ctx, input: { n: number }) => input);
    const { runId } = await t.engine.start(flow, { n: 1 });
    // A worker whose codec lacks k1, as after a key was dropped too early.
    const lacking = t.newEngine({ codec: aesGcmCodec({ keys: { k2: randomBytes(32).toString('base64') }, activeKey: 'k2' }) });
    lacking.workflow({ name: 'dl-codec', maxRecoveryAttempts: 2 }, async (_ctx, input: unknown) => input);
    const worker = await lacking.runWorker({ manual: true, leaseMs: 30_000 });
    for (let i = 0; i < 3; i++) {
      await waitFor('claimable again', async () => (await worker.drain()) > 0 || (await runRow(runId)).status === 'DEAD_LETTER');
      if ((await runRow(runId)).status === 'DEAD_LETTER') break;
    }
    const row = await runRow(runId);
    expect(row.status).toBe('DEAD_LETTER');
    expect(row.termination_reason).toBe('MAX_RECOVERY_ATTEMPTS');
    expect(row.error).toMatchObject({ code: 'PAYLOAD_KEY_MISSING', message: expect.stringContaining('"k1"') });
    expect(row.termination_evidence).toMatchObject({ last_error: row.error, max_recovery_attempts: 2 });
    // Each release kept its error too.
    const released = await db.pool.query(`select detail from runledger.events where run_id = $1 and kind = 'released'`, [runId]);
    expect(released.rows.length).toBeGreaterThan(0);
    for (const { detail } of released.rows) expect(detail.error).toMatchObject({ code: 'PAYLOAD_KEY_MISSING' });
  });

  it('NON_DETERMINISM: the dead letter carries the NonDeterminismError', async () => {
    let second = 'pack';
    const flow = t.engine.workflow({ name: 'dl-drift' }, async (ctx) => {
      await ctx.step('first', () => 1);
      await ctx.step(second, () => 2);
      await ctx.waitForSignal('go');
      return 'done';
    });
    const worker = await t.engine.runWorker({ manual: true, leaseMs: 30_000 });
    const { runId } = await t.engine.start(flow, undefined);
    await worker.drain();
    second = 'wrap';
    await t.engine.signal(runId, 'go', null);
    await worker.drain();
    const row = await runRow(runId);
    expect(row).toMatchObject({ status: 'DEAD_LETTER', termination_reason: 'NON_DETERMINISM' });
    expect(row.error).toMatchObject({ code: 'NON_DETERMINISM', name: 'NonDeterminismError', message: expect.stringContaining('"wrap"') });
    expect(row.termination_evidence.last_error).toEqual(row.error);
    await worker.stop();
  });

  it('a lease that expires once too often: the error is LEASE_EXPIRED, naming the worker', async () => {
    const runId = await startRaw('dl-lease', 1);
    for (let attempt = 1; attempt <= 2; attempt++) {
      await claimRun(db, runId, { worker: `wk-dead-${attempt}`, leaseMs: 1 });
      await waitFor('the lease recovered', async () => {
        await db.pool.query('select runledger._recover_expired()');
        return (await runRow(runId)).status !== 'RUNNING';
      });
    }
    const row = await runRow(runId);
    expect(row).toMatchObject({ status: 'DEAD_LETTER', termination_reason: 'MAX_RECOVERY_ATTEMPTS' });
    expect(row.error).toMatchObject({ code: 'LEASE_EXPIRED', name: 'LeaseExpired', message: expect.stringContaining('wk-dead-2') });
    expect(row.termination_evidence).toMatchObject({ last_owner: 'wk-dead-2', last_error: row.error });
  });

  it('_release_run from psql or an older worker, without p_error: the error is built from the reason', async () => {
    const runId = await startRaw('dl-release', 1);
    let claimed = await claimRun(db, runId, { worker: 'wk-a', leaseMs: 60_000 });
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'infrastructure', true)`, [runId, claimed[0]!.fencing_token]);
    expect((await runRow(runId)).status).toBe('PENDING');
    claimed = await claimRun(db, runId, { worker: 'wk-a', leaseMs: 60_000 });
    const given = { name: 'Error', code: 'ECONNRESET', message: 'read ECONNRESET', sqlstate: '08006' };
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'infrastructure', true, $3::jsonb)`, [
      runId,
      claimed[0]!.fencing_token,
      JSON.stringify(given),
    ]);
    const row = await runRow(runId);
    expect(row).toMatchObject({ status: 'DEAD_LETTER', termination_reason: 'MAX_RECOVERY_ATTEMPTS', error: given });
    expect(row.termination_evidence).toMatchObject({ last_release: 'infrastructure', last_error: given });

    const other = await startRaw('dl-release-old', 0);
    claimed = await claimRun(db, other, { worker: 'wk-a', leaseMs: 60_000 });
    await db.pool.query(`select runledger._release_run($1, $2, 0, 'infrastructure', true)`, [other, claimed[0]!.fencing_token]);
    expect((await runRow(other)).error).toMatchObject({ code: 'INFRASTRUCTURE', message: expect.stringContaining('infrastructure') });
  });
});
