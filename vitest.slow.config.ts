import { defineConfig } from 'vitest/config';
import suite, { SLOW_TESTS } from './vitest.config.js';

/** `npm run test:slow`: the slow tier alone (vitest.config.ts SLOW_TESTS). */
export default defineConfig({
  test: {
    ...suite.test,
    include: SLOW_TESTS,
  },
});
