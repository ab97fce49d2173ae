import { describe, expect, it } from 'vitest';
import { useTestEngine } from './helpers/test-engine.js';
import { queueWorkers } from './helpers/cleanup.js';
import { waitFor } from './helpers/database.js';

/**
 * runledger.cost_stats (sql/0019_governance.sql): per workflow version and manifest, the
 * spend of every run beside the runs that delivered a verified success, the time runs spent
 * waiting, and what they store. Checked against the charges the runs made.
 */
const t = useTestEngine();
const { db } = t;
const worker = queueWorkers(() => t.engine, 'costs');

describe('cost_stats', () => {
  it('matches the charges: spend per dimension, per verified successful run (failed runs counted in the spend), waiting days, bytes', async () => {
    const wf = t.engine.workflow(
      {
        name: 'costed',
        queue: 'costs',
        manifest: { agent: 'a7', prompt: 'p3' },
        limits: { budget: { tokens: 1_000_000, costUsd: 100 } },
        verify: (output) => ((output as { ok: boolean }).ok ? { ok: true, evidence: { checked: true } } : { ok: false, reason: 'not ok' }),
      },
      async (ctx, input: { tokens: number; costUsd: number; ok: boolean; wait?: boolean }) => {
        await ctx.step('call', () => {
          ctx.charge({ tokens: input.tokens, costUsd: input.costUsd });
          return 'x'.repeat(1000);
        });
        if (input.wait) await ctx.waitForSignal('go');
        return { ok: input.ok };
      },
    );
    await worker();
    const a = await t.engine.start(wf, { tokens: 100, costUsd: 0.5, ok: true });
    const b = await t.engine.start(wf, { tokens: 300, costUsd: 1.5, ok: true, wait: true });
    const c = await t.engine.start(wf, { tokens: 200, costUsd: 1, ok: false });
    await a.result();
    await expect(c.result()).rejects.toMatchObject({ code: 'RUN_FAILED' });
    await waitFor(
      'run b waiting',
      async () => (await db.pool.query(`select status from runledger.runs where run_id = $1`, [b.runId])).rows[0].status === 'WAITING',
    );

    const waiting = (await db.pool.query(`select * from runledger.cost_stats where workflow_name = 'costed'`)).rows;
    expect(waiting).toHaveLength(1);
    expect(waiting[0]).toMatchObject({ runs: '3', succeeded: '1', verified_succeeded: '1', waiting_now: '1' });
    expect(Number(waiting[0].waiting_run_days)).toBeGreaterThan(0);

    await t.engine.signal(b.runId, 'go');
    await b.result();
    const row = (await db.pool.query(`select * from runledger.cost_stats where workflow_name = 'costed'`)).rows[0];
    expect(row).toMatchObject({
      workflow_version: '1',
      runtime_version: expect.stringMatching(/^runledger@/),
      checkpoint_schema_version: '1',
      manifest: { agent: 'a7', prompt: 'p3' },
      runs: '3',
      succeeded: '2',
      verified_succeeded: '2',
      not_succeeded: '1',
      stopped_by_policy: '0',
      waiting_now: '0',
    });
    expect(Number(row.tokens)).toBe(600);
    expect(Number(row.cost_usd)).toBe(3);
    // Every run's spend (the failed one's too) over the two verified successes.
    expect(Number(row.cost_usd_per_verified_run)).toBe(1.5);
    expect(Number(row.tokens_per_verified_run)).toBe(300);
    expect(Number(row.bytes_per_run)).toBeGreaterThan(1000);
    const charged = await db.pool.query(
      `select sum((budget_used->>'cost_usd')::numeric) as cost from runledger.runs where workflow_name = 'costed'`,
    );
    expect(Number(charged.rows[0].cost)).toBe(Number(row.cost_usd));
  });
});
