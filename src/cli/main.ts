#!/usr/bin/env node
/**
 * `runledger`: the operator's command line. Every command is a thin layer over
 * the engine or a documented SQL function, so what it shows and does is what
 * psql shows and does. The commands and their exit codes: src/cli/run.ts; this
 * file runs them with the process's own streams and environment.
 */
import { runCliMain } from './run.js';
import { PROCESS_IO } from './shared.js';

// `runledger runs | head` closes the pipe early: that is the reader's choice, not an error.
process.stdout.on('error', (error: NodeJS.ErrnoException) => {
  if (error.code === 'EPIPE') process.exit(process.exitCode ?? 0);
  throw error;
});

process.exitCode = await runCliMain(process.argv.slice(2), PROCESS_IO);
// A refused command exits with its code even when something it loaded keeps the event loop
// alive (a --module that opens a pool or starts a worker at import): once the loop has had
// a second to drain on its own, exit.
if (process.exitCode !== 0) setTimeout(() => process.exit(), 1000).unref();
