import type pg from 'pg';
import type { Engine } from '../../src/index.js';

/**
 * The drills' workflow, shared by the test and its worker processes. Each run:
 * a transaction step (its effect: one row in drill_effects), an operation at the fake
 * ticket service (effect: one ticket per idempotency key), a durable sleep, a wait for
 * the signal 'go' (sent by the test while the server goes down and up), and a second
 * transaction step. A run that ends SUCCEEDED with two effect rows and one ticket
 * under its key was neither lost nor done twice.
 */
export const DRILL_TABLES = `
  create table if not exists drill_effects (
    id bigint generated always as identity primary key,
    run_id text not null, step text not null, pid int not null);
`;

export async function createDrillTables(pool: pg.Pool): Promise<void> {
  await pool.query(DRILL_TABLES);
}

export function defineDrillWorkflows(engine: Engine) {
  const drill = engine.workflow({ name: 'drill', maxRecoveryAttempts: 20 }, async (ctx, input: { service: string; napMs: number }) => {
    await ctx.transaction('reserve', async (trx) => {
      await trx.insertInto('drill_effects').values({ run_id: ctx.runId, step: 'reserve', pid: process.pid }).execute();
    });
    const ticket = await ctx.operation<{ id: string }>(
      'ticket',
      { idempotencyKey: `drill-${ctx.runId}`, idempotent: true },
      async ({ idempotencyKey }) => {
        const res = await fetch(`${input.service}/tickets?key=${idempotencyKey}`, { method: 'POST' });
        if (!res.ok) throw new Error(`ticket service answered ${res.status}`);
        return (await res.json()) as { id: string };
      },
    );
    await ctx.sleep('nap', input.napMs);
    const go = await ctx.waitForSignal<{ n: number }>('go', { timeout: '10m' });
    await ctx.transaction('ship', async (trx) => {
      await trx.insertInto('drill_effects').values({ run_id: ctx.runId, step: 'ship', pid: process.pid }).execute();
    });
    return { ticket: ticket.id, go: go?.n ?? null };
  });
  /**
   * A run that stays RUNNING for holdMs inside one step (an in-process wait, not a durable
   * sleep), then writes one effect row: a worker killed meanwhile certainly holds its lease.
   */
  const hold = engine.workflow({ name: 'drill-hold', maxRecoveryAttempts: 20 }, async (ctx, input: { holdMs: number }) => {
    await ctx.step('hold', async () => {
      await new Promise((resolve) => setTimeout(resolve, input.holdMs));
      return true;
    });
    await ctx.transaction('hold-ship', async (trx) => {
      await trx.insertInto('drill_effects').values({ run_id: ctx.runId, step: 'hold-ship', pid: process.pid }).execute();
    });
    return { held: true };
  });
  return { drill, hold };
}
