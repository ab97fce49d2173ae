import { defineConfig } from 'vitest/config';

/**
 * `npm run test:drills`: the slow fault drills (test/drills/), each against PostgreSQL
 * servers it starts, restarts and kills itself, so no global setup and one file at a time.
 */
export default defineConfig({
  test: {
    include: ['test/drills/*.test.ts'],
    pool: 'forks',
    maxWorkers: 1,
    minWorkers: 1,
    fileParallelism: false,
    testTimeout: 600_000,
    hookTimeout: 180_000,
  },
});
