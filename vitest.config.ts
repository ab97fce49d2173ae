import { configDefaults, defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    // The fault drills start and kill PostgreSQL servers of their own for minutes: `npm run test:drills` (vitest.drills.config.ts).
    exclude: [...configDefaults.exclude, 'test/drills/**'],
    globalSetup: ['test/setup/global-setup.ts'],
    // Each file gets its own database cloned from a migrated template, so files run in parallel.
    pool: 'forks',
    maxWorkers: 2,
    minWorkers: 1,
    testTimeout: 60_000,
    hookTimeout: 120_000,
  },
});
