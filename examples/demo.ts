/**
 * `npm run demo`: refunds as durable workflows, end to end, in a few seconds.
 *
 *   1. A run started from SQL (runledger.start_run), taken by a worker process
 *      that is then killed with SIGKILL in the middle of the run.
 *   2. A worker in this process recovers it when its lease expires, and runs more
 *      refunds started from TypeScript (one is rejected by the workflow).
 *   3. Two large refunds ask a manager for approval: they wait in the database,
 *      holding no worker, until "the operator" decides (one approved from SQL with
 *      runledger.decide_approval, one rejected with engine.decideApproval).
 *   4. Each run's steps, status and termination reason; then the psql commands
 *      that show the same runs.
 *
 * Uses its own database runledger_demo: on the server in DATABASE_URL when set, else
 * on an embedded PostgreSQL in .runledger/demo-pg.
 * `npm run demo -- --keep` keeps the embedded server up until Ctrl-C.
 */
import { createEngine, type RunHandle } from '../src/index.js';
import { openDatabase, printPsqlHelp, printRun, spawnCrashingWorker, waitFor, waitTerminal, type DemoDatabase } from './demo-support.js';
import { APPROVAL_ABOVE_CENTS, cents, createRefundTables, defineRefundWorkflow } from './refund-workflow.js';

const keep = process.argv.includes('--keep');
const began = Date.now();
let database: DemoDatabase;
try {
  database = await openDatabase();
} catch (error) {
  console.error(`demo failed: ${(error as Error).message}`);
  process.exit(1);
}
let closing = false;
const engine = createEngine({
  connectionString: database.url,
  // Stopping the embedded server can reach a connection whose close is still in flight
  // (pool.end() does not wait for it); that warning is teardown noise, not a problem.
  log: (level, message, meta) => {
    if (level === 'info' || (closing && message.endsWith('connection lost'))) return;
    (level === 'error' ? console.error : console.warn)(`[runledger] ${message}`, meta ?? '');
  },
});
let exitCode = 0;
try {
  await engine.migrate(); // already done by openDatabase; idempotent
  await createRefundTables(engine.pool);
  const refund = defineRefundWorkflow(engine);

  // Fresh order ids on every demo, so a second demo on the same database starts clean.
  const tag = Date.now().toString(36).slice(-5);
  const orders = { crash: `A-${tag}`, partial: `B-${tag}`, full: `C-${tag}`, over: `D-${tag}`, big: `E-${tag}`, bigger: `F-${tag}` };
  await engine.pool.query(
    `insert into shop.orders (order_id, customer_email, total_cents) values
       ($1, 'ada@example.com', 12000), ($2, 'bob@example.com', 4999), ($3, 'cy@example.com', 2500),
       ($4, 'di@example.com', 1500), ($5, 'eve@example.com', 15000), ($6, 'fay@example.com', 9000)`,
    Object.values(orders),
  );

  console.log('\n1. Crash: a worker process takes a run and is killed (SIGKILL) mid-run');
  const child = await spawnCrashingWorker(database.url, orders.crash);
  // Started from SQL like an operator or another service would, and executed like any other run.
  const startedFromSql = await engine.pool.query(`select runledger.start_run('refund', $1::jsonb) as run_id`, [
    JSON.stringify({ orderId: orders.crash, amountCents: 4000, reason: 'damaged in transit' }),
  ]);
  const crashRunId: string = startedFromSql.rows[0].run_id;
  console.log(`   select runledger.start_run('refund', ...) -> ${crashRunId}`);
  const killTimer = setTimeout(() => child.kill(), 20_000); // never leave a stray child behind
  const how = await child.exited;
  clearTimeout(killTimer);
  console.log(`   worker pid ${child.pid} ended by ${how}: after the provider accepted the refund, before that step's checkpoint`);

  console.log('\n2. A worker in this process: it recovers the run once the dead lease expires, and runs new refunds');
  const worker = await engine.runWorker({ concurrency: 8, leaseMs: 5000, sweepIntervalMs: 250, pollIntervalMs: 250 });
  const handles: Array<{ title: string; handle: RunHandle<unknown> }> = [
    {
      title: 'Partial refund, started with engine.start',
      handle: await engine.start(refund, { orderId: orders.partial, amountCents: 1999, reason: 'late delivery' }),
    },
    {
      title: 'Full refund, started with engine.start',
      handle: await engine.start(refund, { orderId: orders.full, amountCents: 2500, reason: 'returned' }),
    },
    {
      title: `Over-refund (${cents(9900)} on a ${cents(1500)} order): rejected by the workflow`,
      handle: await engine.start(refund, { orderId: orders.over, amountCents: 9900, reason: 'typo' }),
    },
  ];
  const approved = await engine.start(refund, { orderId: orders.big, amountCents: 12000, reason: 'wrong size, returned' });
  const rejected = await engine.start(refund, { orderId: orders.bigger, amountCents: 9000, reason: 'changed my mind' });
  for (const { handle } of handles) await handle.result().catch(() => undefined); // failures are reported below
  await waitTerminal(engine, crashRunId);

  console.log(`\n3. Refunds above ${cents(APPROVAL_ABOVE_CENTS)} wait for a manager: the run waits, not the worker`);
  const inbox = await waitFor('both approval requests', async () => {
    const result = await engine.pool.query(
      `select request_id, run_id, action, evidence->>'amount' as amount, approvers from runledger.approval_inbox
        where run_id = any($1) order by requested_at, request_id`,
      [[approved.runId, rejected.runId]],
    );
    return result.rows.length === 2 ? result.rows : undefined;
  });
  const requestOf = (runId: string) => inbox.find((row) => row.run_id === runId)!.request_id as string;
  const held = await engine.pool.query(
    `select count(*)::int as n from runledger.runs where run_id = any($1) and lease_owner is null and status = 'WAITING'`,
    [[approved.runId, rejected.runId]],
  );
  console.log(`   select * from runledger.approval_inbox  (what an approver sees)`);
  for (const row of inbox) console.log(`     ${row.request_id}  ${row.action} of ${row.amount}  approvers: ${row.approvers.join(', ')}`);
  console.log(`   ${held.rows[0].n} runs WAITING with no lease owner; this worker is executing ${worker.inFlight} runs`);

  try {
    await engine.decideApproval(requestOf(approved.runId), { approved: true, decidedBy: 'ivan.intern' });
  } catch (error) {
    console.log(
      `   ivan.intern tries to approve: ${(error as { code?: string }).code} (${(error as Error).message.replace(/^.*may not/, 'may not')})`,
    );
  }
  const sql = `select runledger.decide_approval('${requestOf(approved.runId)}', true, 'maria.manager', 'receipt checked')`;
  const decided = await engine.pool.query(sql);
  console.log(`   the operator, from psql:\n     ${sql}\n     -> ${JSON.stringify(decided.rows[0].decide_approval)}`);
  const rejection = await engine.decideApproval(requestOf(rejected.runId), {
    approved: false,
    decidedBy: 'omar.ops',
    note: 'outside the return window',
  });
  console.log(`   engine.decideApproval(..., { approved: false, decidedBy: 'omar.ops' }) -> recorded: ${rejection.recorded}`);
  handles.push(
    { title: `Refund of ${cents(12000)}: waited for approval, approved from SQL, then paid`, handle: approved },
    { title: `Refund of ${cents(9000)}: waited for approval, rejected; the reservation is released`, handle: rejected },
  );
  await approved.result().catch(() => undefined);
  await rejected.result().catch(() => undefined);
  await worker.stop();

  console.log('\n4. What happened');
  await printRun(engine, crashRunId, `Refund of ${cents(4000)}, started from SQL; its first worker was killed`);
  const provider = await engine.pool.query('select calls from payment_provider.refunds where idempotency_key = $1', [
    `refund-${crashRunId}`,
  ]);
  const calls = provider.rows[0]?.calls ?? 0;
  console.log(`     payment provider: ${calls} call(s) with key refund-${crashRunId.slice(0, 6)}..., one refund`);
  console.log('     (load-order and reserve-refund were replayed from their checkpoints, not run again;');
  const op = await engine.pool.query(
    `select status, attempts, external_resource_id from runledger.operations where run_id = $1 and name = 'refund-at-provider'`,
    [crashRunId],
  );
  const ledger = op.rows[0];
  console.log(
    `      refund-at-provider went through the operation ledger: UNKNOWN after the crash, then settled by calling again with the same key;` +
      ` now ${ledger?.status}, attempts ${ledger?.attempts}, provider refund ${ledger?.external_resource_id})`,
  );
  for (const { title, handle } of handles) await printRun(engine, handle.runId, title);
  const rejectedOrder = await engine.pool.query('select refunded_cents from shop.orders where order_id = $1', [orders.bigger]);
  console.log(`     order ${orders.bigger} after the rejection: ${cents(rejectedOrder.rows[0].refunded_cents)} refunded`);

  printPsqlHelp(database.url, [crashRunId, ...handles.map((h) => h.handle.runId)], database.embedded);
  console.log(`\nDemo finished in ${((Date.now() - began) / 1000).toFixed(1)} s.`);
} catch (error) {
  console.error('demo failed:', error);
  exitCode = 1;
} finally {
  closing = true;
  await engine.close();
  if (keep && database.embedded && exitCode === 0) {
    console.log(`\nEmbedded PostgreSQL is up at ${database.url}; press Ctrl-C to stop it.`);
    await new Promise((resolve) => process.once('SIGINT', resolve));
  }
  await database.stop();
}
process.exit(exitCode);
