import { defineConfig } from 'vitest/config';

/**
 * `npm run test:drills`: the slow fault drills (test/drills/), two files at a time. The restart
 * and failover drills start, restart and kill PostgreSQL servers of their own; the resume
 * storm uses a database cloned from the suite's migrated template (the global setup).
 */
export default defineConfig({
  test: {
    include: ['test/drills/*.test.ts'],
    globalSetup: ['test/setup/global-setup.ts'],
    pool: 'forks',
    // Two files at a time: the resume storm beside the restart and failover drills, which
    // mostly wait on servers going down and coming up (each starts servers of its own, on
    // ports of their own): 314 s instead of 369 s on 2 cores.
    maxWorkers: 2,
    minWorkers: 1,
    fileParallelism: true,
    testTimeout: 600_000,
    hookTimeout: 180_000,
  },
});
