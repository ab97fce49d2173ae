import { defineConfig } from 'vitest/config';

/**
 * `npm run test:drills`: the slow fault drills (test/drills/), one file at a time. The restart
 * and failover drills start, restart and kill PostgreSQL servers of their own; the resume
 * storm uses a database cloned from the suite's migrated template (the global setup).
 */
export default defineConfig({
  test: {
    include: ['test/drills/*.test.ts'],
    globalSetup: ['test/setup/global-setup.ts'],
    pool: 'forks',
    maxWorkers: 1,
    minWorkers: 1,
    fileParallelism: false,
    testTimeout: 600_000,
    hookTimeout: 180_000,
  },
});
