/**
 * A refund as a durable workflow: the example used by `npm run demo` and
 * loadable by the CLI (`runledger worker --module ./examples/refund-workflow.ts`
 * under tsx, or its compiled .js).
 *
 *   load-order          ctx.step             read the order
 *   reserve-refund      ctx.transaction      refund row + order total, exactly once
 *   manager-approval    ctx.requestApproval  only above APPROVAL_ABOVE_CENTS: the run waits,
 *                                            holding no worker, until a manager decides
 *   (release-refund     ctx.transaction      only when the manager rejects: undo the reservation)
 *   refund-at-provider  ctx.operation        call the (fake) payment provider through the operation ledger
 *   record-ledger       ctx.transaction      double-entry ledger rows, exactly once
 *   notify-customer     ctx.step             send the (fake) e-mail
 *
 * The refund's id, its provider key and its rows are keyed by ctx.lineageId, not
 * ctx.runId: a fork of the run (`runledger fork RUN --from N`, to run its rest again)
 * keeps the lineage id, so it reuses the provider's refund instead of paying a second
 * time, and finds the refund row its source wrote.
 *
 * In an application, import from 'runledger' instead of '../src/index.js'.
 */
import type pg from 'pg';
import { z } from 'zod';
import type { Engine } from '../src/index.js';

/**
 * `shop` is the application's own data. `payment_provider` stands in for a
 * system outside our database: its writes commit on their own, never inside a
 * runledger checkpoint, exactly like a real HTTP call.
 */
export const REFUND_TABLES = `
  create schema if not exists shop;
  create table if not exists shop.orders (
    order_id       text primary key,
    customer_email text not null,
    total_cents    int  not null check (total_cents > 0),
    refunded_cents int  not null default 0 check (refunded_cents between 0 and total_cents));
  create table if not exists shop.refunds (
    refund_id          text primary key,  -- ctx.lineageId: one refund per run and its forks
    order_id           text not null references shop.orders,
    amount_cents       int  not null check (amount_cents > 0),
    reason             text not null,
    status             text not null,     -- reserved, paid, rejected
    provider_refund_id text,
    created_at         timestamptz not null default now());
  create table if not exists shop.ledger_entries (
    entry_id     bigint generated always as identity primary key,
    refund_id    text not null references shop.refunds,
    account      text not null,
    debit_cents  int  not null default 0,
    credit_cents int  not null default 0);
  -- One entry per refund and account: a fork that records the ledger again adds nothing.
  create unique index if not exists ledger_entries_refund_account on shop.ledger_entries (refund_id, account);
  create schema if not exists payment_provider;
  create table if not exists payment_provider.refunds (
    idempotency_key    text primary key,
    provider_refund_id text not null,
    amount_cents       int  not null,
    calls              int  not null default 1);
`;

export async function createRefundTables(pool: pg.Pool): Promise<void> {
  await pool.query(REFUND_TABLES);
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * The fake provider dedupes on the idempotency key, as real payment APIs do:
 * that is what makes an at-least-once `ctx.step` safe for a money movement.
 * `calls` counts every request, so the demo can show a repeated call.
 */
async function refundAtProvider(pool: pg.Pool, idempotencyKey: string, amountCents: number) {
  await sleep(80 + Math.random() * 120); // network and provider latency
  const result = await pool.query(
    `insert into payment_provider.refunds (idempotency_key, provider_refund_id, amount_cents)
     values ($1, 're_' || substr(md5(random()::text), 1, 12), $2)
     on conflict (idempotency_key) do update set calls = payment_provider.refunds.calls + 1
     returning provider_refund_id`,
    [idempotencyKey, amountCents],
  );
  return result.rows[0].provider_refund_id as string;
}

export class RefundRejectedError extends Error {
  override name = 'RefundRejectedError';
}

/** Refunds above this amount wait for a manager's decision before any money moves. */
export const APPROVAL_ABOVE_CENTS = 5000;
/** Who may decide; runledger refuses a decision by anyone else (NOT_ALLOWED). */
export const REFUND_APPROVERS = ['maria.manager', 'omar.ops'];

export const refundInput = z.object({
  orderId: z.string().min(1),
  amountCents: z.number().int().positive(),
  reason: z.string().default('customer request'),
});

export interface RefundHooks {
  /** Called after the provider accepted the refund, before the step's checkpoint (the demo crashes here). */
  afterProviderCall?: (orderId: string) => void;
}

export function defineRefundWorkflow(engine: Engine, hooks: RefundHooks = {}) {
  return engine.workflow({ name: 'refund', input: refundInput, maxRecoveryAttempts: 3 }, async (ctx, input) => {
    const order = await ctx.step('load-order', async () => {
      const result = await engine.pool.query('select * from shop.orders where order_id = $1', [input.orderId]);
      if (result.rowCount === 0) throw new RefundRejectedError(`order ${input.orderId} does not exist`);
      return result.rows[0] as { order_id: string; customer_email: string; total_cents: number };
    });

    // The check and both writes share one transaction with the checkpoint:
    // a crash or a retry can never reserve the same refund twice. A fork finds the
    // refund its source reserved (same lineage id) and leaves it as it is.
    await ctx.transaction('reserve-refund', async (trx) => {
      const existing = await trx
        .selectFrom('shop.refunds')
        .select('status')
        .where('refund_id', '=', ctx.lineageId)
        .forUpdate()
        .executeTakeFirst();
      if (existing && existing.status !== 'rejected') return;
      const row = await trx
        .selectFrom('shop.orders')
        .select(['total_cents', 'refunded_cents'])
        .where('order_id', '=', order.order_id)
        .forUpdate()
        .executeTakeFirstOrThrow();
      const refundable = row.total_cents - row.refunded_cents;
      if (input.amountCents > refundable) {
        throw new RefundRejectedError(
          `refund of ${cents(input.amountCents)} exceeds the refundable ${cents(refundable)} on ${order.order_id}`,
        );
      }
      if (existing) {
        // A fork of a rejected refund asks again: reserved anew if it is approved this time.
        await trx.updateTable('shop.refunds').set({ status: 'reserved' }).where('refund_id', '=', ctx.lineageId).execute();
      } else {
        await trx
          .insertInto('shop.refunds')
          .values({
            refund_id: ctx.lineageId,
            order_id: order.order_id,
            amount_cents: input.amountCents,
            reason: input.reason,
            status: 'reserved',
          })
          .execute();
      }
      await trx
        .updateTable('shop.orders')
        .set((eb) => ({ refunded_cents: eb('refunded_cents', '+', input.amountCents) }))
        .where('order_id', '=', order.order_id)
        .execute();
    });

    // A large refund waits for a person. The run is parked WAITING in the database: no
    // worker, no connection, no memory, for as long as the decision takes (here 2 days
    // at most; an undecided request returns null and counts as a rejection).
    if (input.amountCents > APPROVAL_ABOVE_CENTS) {
      const decision = await ctx.requestApproval('manager-approval', {
        action: 'refund',
        evidence: {
          orderId: order.order_id,
          customer: order.customer_email,
          amount: cents(input.amountCents),
          orderTotal: cents(order.total_cents),
          reason: input.reason,
        },
        approvers: REFUND_APPROVERS,
        timeout: '2d',
      });
      if (!decision?.approved) {
        // Undo the reservation in the same transaction as its checkpoint: released exactly once.
        await ctx.transaction('release-refund', async (trx) => {
          await trx.updateTable('shop.refunds').set({ status: 'rejected' }).where('refund_id', '=', ctx.lineageId).execute();
          await trx
            .updateTable('shop.orders')
            .set((eb) => ({ refunded_cents: eb('refunded_cents', '-', input.amountCents) }))
            .where('order_id', '=', order.order_id)
            .execute();
        });
        const why = decision
          ? `rejected by ${decision.decidedBy}${decision.note ? `: ${decision.note}` : ''}`
          : 'not decided within 2 days';
        throw new RefundRejectedError(`refund of ${cents(input.amountCents)} on ${order.order_id} ${why}`);
      }
    }

    // Through the operation ledger: the intent and its key commit before the call, the
    // outcome with the checkpoint. A crash in between leaves the operation UNKNOWN; the
    // provider deduplicates on the key (idempotent), so the next worker settles it by
    // calling again with the same key, and the money moves once. The key is the lineage's:
    // a fork reuses this refund instead of paying again (a key from ctx.runId would pay twice).
    const providerRefundId = await ctx.operation(
      'refund-at-provider',
      { idempotencyKey: `refund-${ctx.lineageId}`, idempotent: true, externalResourceId: (id: string) => id },
      async ({ idempotencyKey }) => {
        const id = await refundAtProvider(engine.pool, idempotencyKey, input.amountCents);
        hooks.afterProviderCall?.(input.orderId);
        return id;
      },
    );

    await ctx.transaction('record-ledger', async (trx) => {
      await trx
        .insertInto('shop.ledger_entries')
        .values([
          { refund_id: ctx.lineageId, account: 'sales-returns', debit_cents: input.amountCents },
          { refund_id: ctx.lineageId, account: 'cash-at-provider', credit_cents: input.amountCents },
        ])
        .onConflict((oc) => oc.columns(['refund_id', 'account']).doNothing())
        .execute();
      await trx
        .updateTable('shop.refunds')
        .set({ status: 'paid', provider_refund_id: providerRefundId })
        .where('refund_id', '=', ctx.lineageId)
        .execute();
    });

    const messageId = await ctx.step('notify-customer', async () => {
      await sleep(30); // the e-mail API
      return `msg-${ctx.lineageId.slice(-8).toLowerCase()}`;
    });

    return { refundId: ctx.lineageId, providerRefundId, amountCents: input.amountCents, to: order.customer_email, messageId };
  });
}

export function cents(amount: number): string {
  return `${(amount / 100).toFixed(2)} EUR`;
}

/** The CLI's entry point: `runledger worker --module <this file>` calls it with its engine. */
export async function register(engine: Engine) {
  await createRefundTables(engine.pool);
  return defineRefundWorkflow(engine);
}

export default register;
