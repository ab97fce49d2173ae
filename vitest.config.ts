import { configDefaults, defineConfig } from 'vitest/config';
import { longestFirst } from './test/setup/longest-first.js';

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
    // The files that took longest on the 2-core CI machine (npm test, PostgreSQL 15), so none
    // starts last and runs alone.
    sequence: {
      sequencer: longestFirst([
        'test/engine/worker/crash.slow.test.ts',
        'test/steps/operations.slow.test.ts',
        'test/engine/worker/sigterm.slow.test.ts',
        'test/plans.slow.test.ts',
        'test/adapters/crash.slow.test.ts',
        'test/engine/worker/versions.slow.test.ts',
        'test/engine/worker/half-open.slow.test.ts',
        'test/agents/session-crash.slow.test.ts',
        'test/upgrade.slow.test.ts',
        'test/resume-storm.slow.test.ts',
        'test/engine/client/queues.slow.test.ts',
        'test/clock-skew.slow.test.ts',
        'test/cli/cli.test.ts',
        'test/entry-points.test.ts',
        'test/engine/core/codec.test.ts',
        'test/agents/artifacts.test.ts',
        'test/steps/rate-limits.test.ts',
        'test/cli/json.test.ts',
        'test/engine/run/compensations.test.ts',
      ]),
    },
  },
});
