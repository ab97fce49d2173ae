/**
 * `npm run docs:screenshots`: fills a database with a few realistic runs and saves a PNG of
 * each console page to docs/img/console-*.png (shown in docs/console.md).
 *
 * The runs are real, made by workers: refunds that completed (several steps, an operation
 * each), one that waits for a manager's approval, a fork of a completed one, a run
 * dead-lettered by a non-determinism (its code changed under it), an operation whose outcome
 * is UNKNOWN (its worker "crashed" right after the call: crashAt), a run writing a stream,
 * and a paused queue. Uses DATABASE_URL's server when set, else the embedded PostgreSQL;
 * the database runledger_console_shots is dropped at the end. Needs chromium (CHROMIUM_PATH,
 * default /usr/bin/chromium).
 */
import { mkdirSync } from 'node:fs';
import pg from 'pg';
import { chromium } from 'playwright-core';
import { createRefundTables, defineRefundWorkflow } from '../../examples/refund-workflow.js';
import { startConsole } from '../../src/console/server.js';
import { startEmbeddedPostgres } from '../../src/dev/index.js';
import { createEngine, type Engine } from '../../src/index.js';
import { createTestClock, createTestEngine } from '../../src/testing/index.js';

const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const TOKEN = 'screenshots';
const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

async function until(what: string, check: () => Promise<boolean>, timeoutMs = 30_000): Promise<void> {
  const end = Date.now() + timeoutMs;
  while (!(await check())) {
    if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
    await sleep(100);
  }
}

const embedded = process.env.DATABASE_URL ? undefined : await startEmbeddedPostgres({ dataDir: '.runledger/screenshots-pg' });
const adminUrl = process.env.DATABASE_URL ?? embedded!.connectionString;
const database = 'runledger_console_shots';
const admin = new pg.Client({ connectionString: adminUrl });
await admin.connect();
await admin.query(`drop database if exists ${database} with (force)`);
await admin.query(`create database ${database}`);
const url = new URL(adminUrl);
url.pathname = `/${database}`;
const connectionString = url.toString();

const engines: Engine[] = [];
try {
  const engine = createEngine({ connectionString, log: () => {} });
  engines.push(engine);
  await engine.migrate();
  await createRefundTables(engine.pool);
  await engine.pool.query(`insert into shop.orders (order_id, customer_email, total_cents) values
    ('ord-1001', 'ada@example.com', 4200), ('ord-1002', 'grace@example.com', 2599), ('ord-1003', 'alan@example.com', 1800),
    ('ord-1004', 'edsger@example.com', 129900)`);
  const refund = defineRefundWorkflow(engine);
  const report = engine.workflow({ name: 'nightly-report', queue: 'reports' }, async (ctx) => {
    const rows = await ctx.step('count-orders', async () => 4);
    const out = ctx.stream('log');
    await ctx.step('write-summary', async () => {
      for (const line of ['reading orders…\n', `${rows} orders, 1 refund pending\n`, 'summary written\n']) void out.write(line);
      return 'ok';
    });
    await out.close();
    return { rows };
  });
  let variant = 'first';
  const importer = engine.workflow({ name: 'import-catalog', queue: 'imports' }, async (ctx) => {
    await ctx.step(variant === 'first' ? 'fetch-feed' : 'download-feed', async () => 120);
    await ctx.step('hold', async () => {
      await until('the code change', async () => variant === 'second', 60_000);
      return 2;
    });
    return 'imported';
  });

  const worker = await engine.runWorker({ pollIntervalMs: 100, queues: ['default', 'reports'] });
  const done = [];
  for (const [orderId, amountCents] of [
    ['ord-1001', 1500],
    ['ord-1002', 2599],
    ['ord-1003', 900],
  ] as const) {
    done.push(await engine.start(refund, { orderId, amountCents, reason: 'item returned' }));
  }
  for (const handle of done) await handle.result();
  const waiting = await engine.start(refund, { orderId: 'ord-1004', amountCents: 99900, reason: 'damaged in transit' });
  await (await engine.start(report, undefined)).result();
  const fork = (await engine.pool.query('select runledger.fork_run($1, 2) as id', [done[0]!.runId])).rows[0].id as string;
  // The fork reuses the first two checkpoints (load-order, reserve-refund) and runs the rest again.
  await until('the fork to finish', async () => ['SUCCEEDED', 'FAILED'].includes((await engine.getRun(fork))?.status ?? ''));
  await until('the approval request', async () => (await engine.getRun(waiting.runId))?.status === 'WAITING');

  // Dead letter: the run's code changes between two executions (NON_DETERMINISM).
  const first = await engine.runWorker({ queues: ['imports'], leaseMs: 2_000, pollIntervalMs: 100, shutdownTimeoutMs: 100 });
  const imported = await engine.start(importer, undefined);
  await until('the first checkpoint', async () => ((await engine.getRun(imported.runId))?.steps?.length ?? 0) >= 1);
  await first.stop();
  variant = 'second';
  const second = await engine.runWorker({ queues: ['imports'], leaseMs: 2_000, pollIntervalMs: 100 });
  await until('the dead letter', async () => (await engine.getRun(imported.runId))?.status === 'DEAD_LETTER');
  await second.stop();

  // UNKNOWN: the call returned, its worker died before recording the outcome (a crash point), its lease ran out.
  const clock = createTestClock(new Date());
  const charge = (e: Engine) =>
    e.workflow({ name: 'charge-card', queue: 'payments' }, async (ctx) =>
      ctx.operation('charge', { idempotencyKey: `charge-${ctx.runId}` }, async () => ({ chargeId: 'ch_1' })),
    );
  for (let i = 0; i < 2; i++) {
    const crashing = createTestEngine({ connectionString, clock, crashAt: { step: 'charge', when: 'after-call' } });
    engines.push(crashing);
    const flow = charge(crashing);
    if (i === 0) await crashing.start(flow, undefined);
    await (await crashing.runWorker({ manual: true, leaseMs: 30_000, queues: ['payments'] })).drain();
    clock.advance('31s');
  }
  await engine.setQueue('reports', { paused: true, concurrency: 2 });
  await engine.setQueue('payments', { concurrency: 10, rateLimit: { max: 100, periodMs: 60_000 } });

  mkdirSync('docs/img', { recursive: true });
  const ui = await startConsole({ connectionString, port: 0, token: TOKEN });
  const browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
  try {
    const page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    await page.goto(`${ui.url}/signin`);
    await page.locator('input[name="token"]').fill(TOKEN);
    await page.locator('input[name="name"]').fill('maria.manager');
    await page.getByRole('button', { name: 'Sign in' }).click();
    await page.waitForURL('**/runs?notice=*');
    const shots: Array<[string, string]> = [
      ['runs', '/runs'],
      ['run-waiting', `/runs/${waiting.runId}`],
      ['run-completed', `/runs/${done[0]!.runId}`],
      ['run-dead-letter', `/runs/${imported.runId}`],
      ['approvals', '/approvals'],
      ['problems', '/problems'],
      ['queues', '/queues'],
    ];
    for (const [name, path] of shots) {
      await page.goto(`${ui.url}${path}`);
      await page.screenshot({ path: `docs/img/console-${name}.png`, fullPage: true });
      console.log(`docs/img/console-${name}.png  ${path}`);
    }
  } finally {
    await browser.close();
    await ui.close();
    await worker.stop();
  }
} finally {
  for (const e of engines) await e.close().catch(() => {});
  await admin.query(`drop database if exists ${database} with (force)`);
  await admin.end();
  await embedded?.stop();
}
