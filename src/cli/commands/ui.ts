import { print } from '../format.js';
import { CliError, cliCodec, cliLog, databaseUrl, intOption, parse, type Command, untilSignal, cliIo } from '../shared.js';

/** The web console until SIGINT/SIGTERM (src/console/server.ts, docs/console.md). */
export const ui: Command = {
  summary: 'the web console: runs, run detail, approvals, dead letter, queues and workers in a browser',
  usage: 'runledger ui [--port 3100] [--host 127.0.0.1] [--token TOKEN]',
  details:
    'Binds 127.0.0.1 unless --host says otherwise; a host that is not loopback needs a token. Reads are open to\n' +
    'whoever reaches the port; actions (approve, retry, fork, resolve, cancel, signal, queue limits) need the token\n' +
    '(--token or the RUNLEDGER_UI_TOKEN environment variable), entered once on the sign-in page. Without a token the\n' +
    'console only reads. Ctrl-C (SIGINT) or SIGTERM stops it.',
  examples: [
    'runledger ui',
    'RUNLEDGER_UI_TOKEN=$(openssl rand -hex 16) runledger ui --port 8080',
    'runledger ui --host 0.0.0.0 --token "$TOKEN"   # reachable from other machines: put TLS in front of it',
  ],
  async run(args) {
    const parsed = parse(ui, args, {
      port: { type: 'string', value: 'N', help: 'the port (default 3100; 0: any free port)' },
      host: { type: 'string', value: 'HOST', help: 'the address to bind (default 127.0.0.1)' },
      token: { type: 'string', value: 'TOKEN', help: 'the token actions need (default: the RUNLEDGER_UI_TOKEN environment variable)' },
    });
    if (!parsed) return;
    const { values } = parsed;
    const port = intOption(values, 'port', 0) ?? 3100;
    if (port > 65_535) throw new CliError('USAGE', `--port must be at most 65535, got ${port}`);
    const token = (values.token as string | undefined) ?? cliIo().env.RUNLEDGER_UI_TOKEN ?? undefined;
    const codec = cliCodec();
    // The console (hono, its pages) is loaded only by this command.
    const { startConsole } = await import('../../console/server.js');
    const running = await startConsole({
      connectionString: databaseUrl(values),
      host: (values.host as string | undefined) ?? '127.0.0.1',
      port,
      ...(token ? { token } : {}),
      ...(codec ? { codec } : {}),
      log: cliLog(),
    });
    print(`runledger console on ${running.url}`);
    print(token ? 'actions need the token: sign in on the page' : 'read-only: no token (--token or RUNLEDGER_UI_TOKEN) to act from it');
    print('Ctrl-C (SIGINT) or SIGTERM stops it');
    await untilSignal();
    await running.close();
    print('stopped');
  },
};
