import { print } from '../format.js';
import { loadRegister } from '../module.js';
import { CliError, intOption, openEngine, parse, type Command, untilSignal } from '../shared.js';

/**
 * Runs workflows from the user's module until SIGINT/SIGTERM. The module defines
 * them on the engine it is given (default export or named `register`), so the
 * same module works in the user's own process and here.
 */
export const worker: Command = {
  summary: 'run a worker for the workflows a module defines, until Ctrl-C',
  usage: 'runledger worker --module ./dist/workflows.js [--concurrency 16] [--queue Q ...] [--lease-ms N] [--retention-interval-ms N]',
  details:
    'The module exports register(engine) (or a default function) that defines workflows on the engine it is given.\n' +
    'The first SIGINT or SIGTERM stops it gracefully (runs in flight finish or are released); a second one exits at once.',
  examples: [
    'runledger worker --module ./dist/workflows.js',
    'runledger worker -m ./dist/workflows.js --queue emails --queue default --concurrency 4',
    'runledger worker -m ./dist/workflows.js --retention-interval-ms 0   # never applies runledger.retention',
  ],
  async run(args) {
    const parsed = parse(worker, args, {
      module: { type: 'string', short: 'm', value: 'FILE', help: 'the JavaScript module that defines the workflows (required)' },
      concurrency: { type: 'string', value: 'N', help: 'runs executed at once (default 16)' },
      queue: { type: 'string', multiple: true, value: 'Q', help: "serve this queue only (default: the queues of the module's workflows)" },
      'lease-ms': {
        type: 'string',
        value: 'N',
        help: 'how long a claimed run is held without a heartbeat before others recover it (>= 500)',
      },
      'retention-interval-ms': {
        type: 'string',
        value: 'N',
        help: 'how often the cluster applies runledger.retention, one worker per pass (default 600000 = 10 min; 0: never here)',
      },
    });
    if (!parsed) return;
    const { values } = parsed;
    if (typeof values.module !== 'string') throw new CliError('USAGE', `--module is required\nusage: ${worker.usage}`);
    const concurrency = intOption(values, 'concurrency', 1) ?? 16;
    const leaseMs = intOption(values, 'lease-ms', 500);
    const retentionIntervalMs = intOption(values, 'retention-interval-ms', 0);
    const register = await loadRegister(values.module);

    // Each in-flight run may hold a connection for a transaction step, plus heartbeats and sweeps.
    const engine = await openEngine(values, { verbose: true, poolMax: concurrency + 4 });
    try {
      await register(engine);
      const running = await engine.runWorker({
        concurrency,
        queues: values.queue as string[] | undefined,
        ...(leaseMs === undefined ? {} : { leaseMs }),
        ...(retentionIntervalMs === undefined ? {} : { retentionIntervalMs }),
      });
      const served = await engine.pool.query('select workflows, queues, lease_ms from runledger.workers where worker_id = $1', [
        running.workerId,
      ]);
      const row = served.rows[0] ?? { workflows: [], queues: [], lease_ms: leaseMs };
      print(`worker ${running.workerId}`);
      print(
        `serving ${row.workflows.join(', ')} on queue(s) ${row.queues.join(', ')}; concurrency ${concurrency}, lease ${row.lease_ms} ms`,
      );
      print('Ctrl-C (SIGINT) or SIGTERM stops it gracefully');
      await untilSignal();
      print(`stopping: letting ${running.inFlight} run(s) in flight finish or releasing them ...`);
      // A second signal means "now": the runs' leases expire and other workers recover them.
      const force = () => process.exit(130);
      process.once('SIGINT', force).once('SIGTERM', force);
      await running.stop();
      print('stopped');
    } finally {
      await engine.close();
    }
  },
};
