import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['suite.test.mjs', 'crash.test.mjs'],
    globalSetup: ['./global-setup.mjs'],
    setupFiles: ['./setup.mjs'],
    // Each test starts the suite's server, which runs a runledger worker on one database.
    fileParallelism: false,
    // The crash tests start servers, kill them and wait for leases and timers (the suite's tests set their own).
    testTimeout: 60_000,
  },
});
