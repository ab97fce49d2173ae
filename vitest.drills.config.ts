import { defineConfig } from 'vitest/config';

/**
 * `npm run test:drills`: the slow fault drills (test/drills/), one file at a time, each
 * on its own database cloned from the migrated template like the normal suite's.
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
