import { configDefaults, defineConfig } from 'vitest/config';
import suite, { DRILLS, SLOW_TESTS } from './vitest.config.js';

/** `npm run test:fast`: the suite without its slow tier (vitest.config.ts SLOW_TESTS). */
export default defineConfig({
  test: {
    ...suite.test,
    exclude: [...configDefaults.exclude, DRILLS, ...SLOW_TESTS],
  },
});
