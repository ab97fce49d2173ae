// @workflow/world-testing's createTestSuite, unmodified, against runledger's World: each test
// starts the suite's app server with WORKFLOW_TARGET_WORLD naming the built module
// (npm run build makes dist/), which the server resolves from its working directory.
import { createTestSuite } from '@workflow/world-testing';
import pg from 'pg';
import { afterAll, expect } from 'vitest';

createTestSuite('../../../dist/workflow-world/index.js');

// And the runs the suite made are runledger's: each SDK run is in runledger.wf_runs, and its
// queue messages were delivered by runledger runs of the workflow 'workflow-world': none failed,
// and all but the ones queued with a delay have ended.
afterAll(async () => {
  const client = new pg.Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    const { rows } = await client.query(
      `select status, count(*)::int as runs, sum(deliveries)::int as deliveries, sum(deliveries_active)::int as active
         from runledger.workflow_world_runs group by status order by status`,
    );
    console.log('runledger.workflow_world_runs after the suite:', JSON.stringify(rows));
    const completed = rows.find((row) => row.status === 'completed');
    // 12 tests start 13 top-level runs and 3 children; every one completes.
    expect(completed?.runs).toBeGreaterThanOrEqual(15);
    expect(completed?.deliveries).toBeGreaterThanOrEqual(completed?.runs);
    const { rows: deliveries } = await client.query(
      `select status::text, count(*)::int as n from runledger.runs where workflow_name = 'workflow-world' group by status order by status`,
    );
    console.log('runledger.runs of workflow-world:', JSON.stringify(deliveries));
    // A delivery the SDK queued with a delay (a backstop wake for a step) may still be waiting to start.
    expect(deliveries.find((row) => row.status === 'SUCCEEDED')?.n).toBe(completed.deliveries - completed.active);
    expect(deliveries.filter((row) => !['SUCCEEDED', 'PENDING', 'WAITING'].includes(row.status))).toEqual([]);
  } finally {
    await client.end();
  }
});
