/**
 * `npm run demo:ai`: an agent written with the Vercel AI SDK (generateText, tool()), made
 * durable by runledger/ai, surviving a SIGKILL at the worst moment. Offline: the model is
 * the AI SDK's own mock (agent.ts says how to use a real provider).
 *
 *   1. A worker process runs the agent: it looks the order up and asks to refund it; the
 *      refund needs finance.fay's approval, so the run waits in the database, holding no
 *      worker. The demo approves it from SQL.
 *   2. The worker refunds at the (fake) payment provider with the key refund-<order> and is
 *      SIGKILLed before the outcome is checkpointed.
 *   3. A second worker takes the run over: the refund is UNKNOWN in the ledger, reconcile
 *      asks the provider, which has it, so nothing is refunded twice; the model calls made
 *      before the crash are not made again; the AI SDK's loop ends with the same answer.
 *   4. The checks, from the tables.
 *
 * Same database as `npm run demo` (runledger_demo): DATABASE_URL's server, or an embedded one.
 */
import { fileURLToPath } from 'node:url';
import { createEngine } from '../../src/index.js';
import {
  approvalAsked,
  killedWorker,
  openDatabase,
  operationHistory,
  spawnDemoWorker,
  waitTerminal,
  type DemoDatabase,
  type DemoWorker,
} from '../demo-support.js';
import { APPROVER, defineRefundAgent } from './agent.js';
import { startPayments } from './payments.js';

const WORKER = fileURLToPath(new URL('./worker.ts', import.meta.url));
const began = Date.now();
let database: DemoDatabase;
try {
  database = await openDatabase();
} catch (error) {
  console.error(`demo failed: ${(error as Error).message}`);
  process.exit(1);
}
const payments = await startPayments();
const engine = createEngine({ connectionString: database.url, log: (level, message) => level === 'error' && console.error(message) });
const workers: DemoWorker[] = [];
const failures: string[] = [];
const check = (ok: boolean, what: string) => {
  console.log(`   ${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};
const spawnWorker = async (crash: boolean) => {
  const worker = await spawnDemoWorker(WORKER, {
    DATABASE_URL: database.url,
    PAYMENTS_URL: payments.url,
    CRASH_AFTER_REFUND: crash ? '1' : '0',
  });
  workers.push(worker);
  return worker;
};

let exitCode = 0;
try {
  await engine.migrate();
  const agent = defineRefundAgent(engine, payments.url);
  // A refund key stands for one refund forever, so each demo on the same database refunds a new order.
  const earlier = await engine.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'ai-refund-agent'`);
  const orderId = `A-${1001 + earlier.rows[0].n}`;

  console.log(`\n1. A worker process runs the AI SDK agent on "please refund order ${orderId}"`);
  const first = await spawnWorker(true);
  const handle = await engine.start(agent, { orderId, message: `Hi, please refund order ${orderId}. The headphones broke.` });
  console.log(`   run ${handle.runId} on worker pid ${first.pid}`);
  const request = await approvalAsked(engine, handle.runId);
  const waiting = await engine.getRun(handle.runId);
  console.log(`   the agent asks ${APPROVER} to approve "${request.action}" ${JSON.stringify(request.evidence)}`);
  console.log(`   the run is ${waiting?.status}, holding no worker; ${APPROVER} approves from SQL`);
  await engine.pool.query(`select runledger.decide_approval($1, true, $2, 'ok, broken on arrival')`, [request.request_id, APPROVER]);

  console.log('\n2. The worker refunds, and is killed before the outcome is checkpointed');
  const how = await killedWorker(first);
  console.log(
    `   worker pid ${first.pid} ended by ${how}; the provider has ${payments.refunds().length} refund(s) from ${payments.posts()} request(s)`,
  );
  check(how === 'SIGKILL', 'the first worker was SIGKILLed after the refund call');

  console.log('\n3. A second worker takes the run over');
  const second = await spawnWorker(false);
  const run = await waitTerminal(engine, handle.runId, 60_000);
  console.log(`   run ${run.status} on worker pid ${second.pid}, ${run.recoveryAttempts} recovery: ${JSON.stringify(run.output)}`);

  console.log('\n4. What the tables say');
  check(
    run.status === 'SUCCEEDED',
    `the run SUCCEEDED with the AI SDK's answer: ${JSON.stringify((run.output as { answer?: string })?.answer)}`,
  );
  check(payments.refunds().length === 1 && payments.posts() === 1, `refunded once at the provider (${payments.posts()} refund request)`);
  const op = await operationHistory(engine, handle.runId, 'tool:refund');
  console.log(`   operation tool:refund: ${JSON.stringify(op)}`);
  check(
    op?.status === 'SUCCEEDED' && op?.idempotency_key === `refund-${orderId}` && String(op?.history).includes('operation_unknown'),
    `the refund went through the operation ledger with key refund-${orderId}: UNKNOWN after the crash, settled by reconcile`,
  );
  const { rows: steps } = await engine.pool.query(`select name, status from runledger.steps where run_id = $1 order by seq`, [
    handle.runId,
  ]);
  console.log(`   steps: ${steps.map((s) => s.name).join(', ')}`);
  const modelSteps = steps.filter((s) => String(s.name).startsWith('model:support:')).map((s) => s.name);
  check(
    JSON.stringify(modelSteps) === JSON.stringify(['model:support:1', 'model:support:2', 'model:support:3']),
    'each model call is a checkpointed step',
  );
  // Each model call charges 150 tokens inside its step: a call made again after the crash would show as more.
  const { rows: budget } = await engine.pool.query(`select budget_used from runledger.runs where run_id = $1`, [handle.runId]);
  check(budget[0].budget_used.tokens === 450, `tokens charged: ${budget[0].budget_used.tokens} (3 model calls, none made twice)`);
  console.log(`\n   psql: select * from runledger.run_timeline where run_id = '${handle.runId}' order by at;`);
  if (failures.length > 0) exitCode = 1;
  console.log(
    `\nAI SDK demo ${failures.length === 0 ? 'finished' : `FAILED (${failures.length} checks)`} in ${((Date.now() - began) / 1000).toFixed(1)} s.`,
  );
} catch (error) {
  console.error('AI SDK demo failed:', error);
  exitCode = 1;
} finally {
  for (const worker of workers) worker.kill();
  await engine.close();
  await payments.close();
  await database.stop();
}
process.exit(exitCode);
