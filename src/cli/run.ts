/**
 * The `runledger` command line as a function: runCliMain(argv, io) runs one command with
 * `io` as its output, input and environment, and resolves to its exit code. src/cli/main.ts
 * (the program) calls it with the process's own; tests call it with strings in memory, in
 * their own process. Every one-shot command closes its pool before the call resolves.
 *
 * Exit codes: 0 done, 1 refused or failed (`error [CODE]: message` on stderr, CODE the
 * runledger error code: NOT_FOUND, INVALID_STATE, PERMISSION_DENIED ...), 2 it could not be
 * attempted (usage, no database, not available yet).
 *
 * worker, ui and dev run until SIGINT or SIGTERM, and a second signal or a stop that hangs
 * ends the process itself: they belong to the program, not to a call made inside another one.
 */
import { RUNTIME_VERSION } from '../engine/core/version.js';
import { approvals } from './commands/approvals.js';
import { approve } from './commands/approve.js';
import { audit } from './commands/audit.js';
import { cancel } from './commands/cancel.js';
import { compensate } from './commands/compensate.js';
import { deadLetter } from './commands/dead-letter.js';
import { dev } from './commands/dev.js';
import { doctor } from './commands/doctor.js';
import { fork } from './commands/fork.js';
import { migrate } from './commands/migrate.js';
import { migrateRun } from './commands/migrate-run.js';
import { prune } from './commands/prune.js';
import { retention } from './commands/retention.js';
import { queues } from './commands/queues.js';
import { resolve } from './commands/resolve.js';
import { retry } from './commands/retry.js';
import { runs } from './commands/runs.js';
import { session } from './commands/session.js';
import { setQueue } from './commands/set-queue.js';
import { show } from './commands/show.js';
import { signal } from './commands/signal.js';
import { start } from './commands/start.js';
import { tail } from './commands/tail.js';
import { ui } from './commands/ui.js';
import { unknown } from './commands/unknown.js';
import { waiting } from './commands/waiting.js';
import { worker } from './commands/worker.js';
import { workers } from './commands/workers.js';
import { versions } from './commands/versions.js';
import { CliError, EXIT_USAGE, describeError, logFormat, withCliIo, type CliIo, type Command } from './shared.js';

/** In the order `runledger --help` lists them: set up, look, act, clean up. */
const COMMANDS: Record<string, Command> = {
  migrate,
  worker,
  start,
  runs,
  show,
  tail,
  waiting,
  approvals,
  session,
  unknown,
  'dead-letter': deadLetter,
  queues,
  workers,
  versions,
  doctor,
  audit,
  signal,
  approve,
  resolve,
  cancel,
  compensate,
  retry,
  fork,
  'migrate-run': migrateRun,
  'set-queue': setQueue,
  retention,
  prune,
  ui,
  dev,
};

function usage(): string {
  const width = Math.max(...Object.keys(COMMANDS).map((name) => name.length));
  const lines = Object.entries(COMMANDS).map(([name, command]) => `  ${name.padEnd(width)}  ${command.summary}`);
  return [
    'usage: runledger COMMAND [options]     (runledger COMMAND --help: its options and examples)',
    '',
    ...lines,
    '',
    'Connection: --database-url URL, or the DATABASE_URL environment variable.',
    'Read commands take --json: one JSON document on stdout, keys as the SQL columns.',
    'Exit codes: 0 done, 1 refused or failed (error [CODE]: message on stderr), 2 usage error or no database.',
  ].join('\n');
}

/** The command is the first argument that is neither an option nor --database-url's value, so the URL may come first. */
function splitCommand(args: string[]): { name: string | undefined; rest: string[] } {
  for (let i = 0; i < args.length; i++) {
    const arg = args[i]!;
    if (arg === '--database-url') {
      i++;
      continue;
    }
    if (!arg.startsWith('-')) return { name: arg, rest: [...args.slice(0, i), ...args.slice(i + 1)] };
  }
  return { name: undefined, rest: args };
}

async function main(args: string[], io: CliIo): Promise<number> {
  if (args.length === 1 && args[0] === '--version') {
    io.stdout.write(`runledger ${RUNTIME_VERSION}\n`);
    return 0;
  }
  const { name, rest } = splitCommand(args);
  if (name === 'help' && rest[0] !== undefined && COMMANDS[rest[0]]) {
    // `runledger help runs` is `runledger runs --help`.
    await COMMANDS[rest[0]]!.run(['--help']);
    return 0;
  }
  if (name === undefined || name === 'help') {
    const asked = name === 'help' || rest.includes('--help') || rest.includes('-h');
    (asked ? io.stdout : io.stderr).write(`${usage()}\n`);
    return asked ? 0 : EXIT_USAGE;
  }
  const command = COMMANDS[name];
  try {
    if (!command) throw new CliError('USAGE', `unknown command ${JSON.stringify(name)}; runledger --help lists them`);
    // A bad setting is refused by every command, not only by those that happen to log.
    logFormat();
    await command.run(rest);
    return 0;
  } catch (error) {
    const { line, exitCode } = describeError(error);
    io.stderr.write(`${line}\n`);
    return exitCode;
  }
}

/** Runs `runledger ARGV...` with `io` (every call its own: calls at once do not mix their output); resolves to the exit code. */
export function runCliMain(argv: string[], io: CliIo): Promise<number> {
  return withCliIo(io, () => main(argv, io));
}
