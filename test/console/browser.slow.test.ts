import { existsSync } from 'node:fs';
import { chromium, type Browser } from 'playwright-core';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createRefundTables, defineRefundWorkflow } from '../../examples/refund-workflow.js';
import { startConsole, type RunningConsole } from '../../src/console/server.js';
import type { Worker } from '../../src/index.js';
import { waitFor } from '../helpers/database.js';
import { useTestEngine } from '../helpers/test-engine.js';

/**
 * The console in a real browser: Debian's chromium driven by playwright-core clicks from the
 * run list to a refund's detail, signs in with the token, approves it with a note in the
 * inbox, and the tables say the decision was recorded and the run went on to SUCCEEDED.
 * Without chromium the test is skipped on a developer's machine and fails in CI (CI=true):
 * .ci/run installs it.
 */
const CHROMIUM = process.env.CHROMIUM_PATH ?? '/usr/bin/chromium';
const haveChromium = existsSync(CHROMIUM);
const TOKEN = 'browser-test-token';

const t = useTestEngine({ prepare: async (db) => createRefundTables(db.pool) });
const { db } = t;
let ui: RunningConsole;
let browser: Browser | undefined;
let worker: Worker;
let refund: ReturnType<typeof defineRefundWorkflow>;

beforeAll(async () => {
  refund = defineRefundWorkflow(t.engine);
  worker = await t.engine.runWorker({ pollIntervalMs: 100 });
  ui = await startConsole({ pool: db.pool, port: 0, token: TOKEN });
  if (haveChromium) browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});
afterAll(async () => {
  await browser?.close();
  await ui?.close();
  await worker?.stop();
});

describe('the console in chromium', () => {
  (haveChromium || process.env.CI ? it : it.skip)(
    'list → detail → sign in → approve with a note in the inbox; the run moves on to SUCCEEDED',
    async () => {
      expect(haveChromium, `no chromium at ${CHROMIUM} (apt-get install -y chromium; .ci/run does it)`).toBe(true);
      await db.pool.query(`insert into shop.orders (order_id, customer_email, total_cents) values ('ord-77', 'ada@example.com', 90000)`);
      const { runId } = await t.engine.start(refund, { orderId: 'ord-77', amountCents: 42000, reason: 'damaged in transit' });
      await waitFor('the refund to wait for approval', async () => (await t.engine.getRun(runId))?.status === 'WAITING');

      const page = await browser!.newPage();
      await page.goto(`${ui.url}/runs`);
      await page.getByRole('link', { name: runId }).first().click();
      await page.waitForURL(`**/runs/${runId}`);
      await expect.poll(() => page.locator('h1').textContent()).toContain(runId);
      expect(await page.locator('[data-testid="summary"]').textContent()).toContain('waiting for approval');
      expect(await page.locator('[data-testid="steps"]').textContent()).toContain('reserve-refund');

      await page.getByRole('link', { name: 'Approvals' }).click();
      await page.waitForURL('**/approvals');
      const row = page.locator('[data-testid="inbox"] tr', { hasText: runId });
      expect(await row.textContent()).toContain('sign in to decide');
      expect(await row.textContent()).toContain('damaged in transit');

      await page.getByRole('link', { name: 'sign in to act' }).click();
      await page.locator('input[name="token"]').fill(TOKEN);
      await page.locator('input[name="name"]').fill('maria.manager');
      await page.getByRole('button', { name: 'Sign in' }).click();
      await page.waitForURL('**/approvals?notice=*');

      const form = page.locator('[data-testid="inbox"] tr', { hasText: runId }).locator('form');
      expect(await form.locator('input[name="by"]').inputValue()).toBe('maria.manager');
      await form.locator('input[name="note"]').fill('photos checked');
      await form.getByRole('button', { name: 'Approve' }).click();
      await expect.poll(() => page.locator('[role="status"]').textContent()).toContain('approved by maria.manager');

      const decision = await db.pool.query('select decision, decided_by, note from runledger.approvals where run_id = $1', [runId]);
      expect(decision.rows).toEqual([{ decision: true, decided_by: 'maria.manager', note: 'photos checked' }]);
      await waitFor('the refund to complete', async () => (await t.engine.getRun(runId))?.status === 'SUCCEEDED');
      const paid = await db.pool.query('select status from shop.refunds where refund_id = $1', [runId]);
      expect(paid.rows).toEqual([{ status: 'paid' }]);

      // The detail page shows the run finished, with its operation in the ledger.
      await page.goto(`${ui.url}/runs/${runId}`);
      expect(await page.locator('h1').textContent()).toContain('SUCCEEDED');
      expect(await page.locator('[data-testid="operations"]').textContent()).toContain('refund-at-provider');
      await page.close();
    },
    90_000,
  );
});
