import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['suite.test.mjs'],
    globalSetup: ['./global-setup.mjs'],
    setupFiles: ['./setup.mjs'],
    // Each test starts the suite's server, which runs a runledger worker on one database.
    fileParallelism: false,
  },
});
