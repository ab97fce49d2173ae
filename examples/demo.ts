/**
 * `npm run demo`: refunds as durable workflows, end to end, in about ten seconds.
 *
 *   1. A run started from SQL (runledger.start_run), taken by a worker process
 *      that is then killed with SIGKILL in the middle of the run.
 *   2. A worker in this process recovers it when its lease expires, and runs
 *      three more refunds started from TypeScript (one is rejected on purpose).
 *   3. Each run's steps, durations, status and termination reason; then the psql
 *      commands that show the same runs.
 *
 * Uses DATABASE_URL when set, else an embedded PostgreSQL in .runledger/demo-pg.
 * `npm run demo -- --keep` keeps the embedded server up until Ctrl-C.
 */
import { createEngine } from '../src/index.js';
import { openDatabase, printPsqlHelp, printRun, spawnCrashingWorker, waitTerminal } from './demo-support.js';
import { cents, createRefundTables, defineRefundWorkflow } from './refund-workflow.js';

const keep = process.argv.includes('--keep');
const began = Date.now();
const database = await openDatabase();
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
  await engine.migrate();
  await createRefundTables(engine.pool);
  const refund = defineRefundWorkflow(engine);

  // Fresh order ids on every demo, so a second demo on the same database starts clean.
  const tag = Date.now().toString(36).slice(-5);
  const orders = { crash: `A-${tag}`, partial: `B-${tag}`, full: `C-${tag}`, over: `D-${tag}` };
  await engine.pool.query(
    `insert into shop.orders (order_id, customer_email, total_cents) values
       ($1, 'ada@example.com', 12000), ($2, 'bob@example.com', 4999), ($3, 'cy@example.com', 2500), ($4, 'di@example.com', 1500)`,
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
  const handles = [
    { title: 'Partial refund, started with engine.start', handle: await engine.start(refund, { orderId: orders.partial, amountCents: 1999, reason: 'late delivery' }) },
    { title: 'Full refund, started with engine.start', handle: await engine.start(refund, { orderId: orders.full, amountCents: 2500, reason: 'returned' }) },
    { title: `Over-refund (${cents(9900)} on a ${cents(1500)} order): rejected by the workflow`, handle: await engine.start(refund, { orderId: orders.over, amountCents: 9900, reason: 'typo' }) },
  ];
  for (const { handle } of handles) await handle.result().catch(() => undefined); // failures are reported below
  await waitTerminal(engine, crashRunId);
  await worker.stop();

  console.log('\n3. What happened');
  await printRun(engine, crashRunId, `Refund of ${cents(4000)}, started from SQL; its first worker was killed`);
  const provider = await engine.pool.query('select calls from payment_provider.refunds where idempotency_key = $1', [`refund-${crashRunId}`]);
  const calls = provider.rows[0]?.calls ?? 0;
  console.log(`     payment provider: ${calls} call(s) with key refund-${crashRunId.slice(0, 6)}..., one refund`);
  console.log('     (load-order and reserve-refund were replayed from their checkpoints, not run again;');
  console.log('      refund-at-provider is at-least-once, and the idempotency key made its repeat harmless)');
  for (const { title, handle } of handles) await printRun(engine, handle.runId, title);

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
