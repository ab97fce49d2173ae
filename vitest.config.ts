import { configDefaults, defineConfig } from 'vitest/config';

/**
 * The slow tier: tests that kill worker processes (SIGKILL, SIGSTOP, SIGTERM drains), resume
 * storms and long drills, a browser, the plans on a loaded database, the upgrade drill. Their files
 * are named *.slow.test.ts. `npm test` runs both tiers; CI runs the fast one
 * on every PostgreSQL and Node it tries (`npm run test:fast`) and the slow one once
 * (`npm run test:slow`).
 */
export const SLOW_TESTS = ['test/**/*.slow.test.ts'];

/** The fault drills start and kill PostgreSQL servers of their own for minutes: `npm run test:drills` (vitest.drills.config.ts). */
export const DRILLS = 'test/drills/**';

/** `npm test`: the whole suite, both tiers, without the drills. */
export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    exclude: [...configDefaults.exclude, DRILLS],
    globalSetup: ['test/setup/global-setup.ts'],
    // Each file gets its own database cloned from a migrated template, so files run in parallel.
    // Three at a time on two cores: many files wait on worker processes, leases and timers
    // (with two, the machine was about 70 % busy in the slow tier), and a third file uses
    // that time: npm test on 2 cores took 344 s with two and 252 s with three.
    pool: 'forks',
    maxWorkers: 3,
    minWorkers: 1,
    testTimeout: 60_000,
    hookTimeout: 120_000,
  },
});
