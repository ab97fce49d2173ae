import { print } from '../format.js';
import { loadRegister } from '../module.js';
import { CliError, intOption, openEngine, parse, type Command, untilSignal } from '../shared.js';
import { METRICS_HOST_DEFAULT, startPrometheusEndpoint } from '../../engine/observe/prometheus.js';

/**
 * Runs workflows from the user's module until SIGINT/SIGTERM. The module defines
 * them on the engine it is given (default export or named `register`), so the
 * same module works in the user's own process and here.
 */
export const worker: Command = {
  summary: 'run a worker for the workflows a module defines, until Ctrl-C',
  usage:
    'runledger worker --module ./dist/workflows.js [--concurrency 16] [--queue Q ...] [--lease-ms N] [--metrics-port N [--metrics-host 127.0.0.1]]',
  details:
    'The module exports register(engine) (or a default function) that defines workflows on the engine it is given.\n' +
    'The first SIGINT or SIGTERM stops it gracefully (runs in flight finish or are released); a second one exits at once.\n' +
    "--metrics-port serves the engine's metrics at http://HOST:N/metrics in the Prometheus text format (docs/observability.md);\n" +
    'it binds 127.0.0.1 unless --metrics-host says otherwise (0.0.0.0: every interface), and needs\n' +
    '@opentelemetry/api, @opentelemetry/sdk-metrics and @opentelemetry/exporter-prometheus installed.',
  examples: [
    'runledger worker --module ./dist/workflows.js',
    'runledger worker -m ./dist/workflows.js --queue emails --queue default --concurrency 4',
    'runledger worker -m ./dist/workflows.js --metrics-port 9464   # then: curl http://127.0.0.1:9464/metrics',
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
      'metrics-port': { type: 'string', value: 'N', help: 'serve GET /metrics (Prometheus text format) on this port (0: any free port)' },
      'metrics-host': { type: 'string', value: 'HOST', help: `the address --metrics-port binds (default ${METRICS_HOST_DEFAULT})` },
    });
    if (!parsed) return;
    const { values } = parsed;
    if (typeof values.module !== 'string') throw new CliError('USAGE', `--module is required\nusage: ${worker.usage}`);
    const concurrency = intOption(values, 'concurrency', 1) ?? 16;
    const leaseMs = intOption(values, 'lease-ms', 500);
    const metricsPort = intOption(values, 'metrics-port', 0);
    if (metricsPort !== undefined && metricsPort > 65_535)
      throw new CliError('USAGE', `--metrics-port must be at most 65535, got ${metricsPort}`);
    if (values['metrics-host'] !== undefined && metricsPort === undefined)
      throw new CliError('USAGE', '--metrics-host needs --metrics-port');
    const register = await loadRegister(values.module);

    const endpoint =
      metricsPort === undefined
        ? undefined
        : await startPrometheusEndpoint({
            port: metricsPort,
            ...(typeof values['metrics-host'] === 'string' ? { host: values['metrics-host'] } : {}),
          }).catch((error) => {
            throw new CliError('CONFIG', (error as Error).message);
          });
    // Each in-flight run may hold a connection for a transaction step, plus heartbeats and sweeps.
    const engine = await openEngine(values, {
      verbose: true,
      poolMax: concurrency + 4,
      ...(endpoint ? { meterProvider: endpoint.meterProvider } : {}),
    }).catch(async (error) => {
      await endpoint?.close();
      throw error;
    });
    try {
      await register(engine);
      const running = await engine.runWorker({
        concurrency,
        queues: values.queue as string[] | undefined,
        ...(leaseMs === undefined ? {} : { leaseMs }),
      });
      const served = await engine.pool.query('select workflows, queues, lease_ms from runledger.workers where worker_id = $1', [
        running.workerId,
      ]);
      const row = served.rows[0] ?? { workflows: [], queues: [], lease_ms: leaseMs };
      print(`worker ${running.workerId}`);
      print(
        `serving ${row.workflows.join(', ')} on queue(s) ${row.queues.join(', ')}; concurrency ${concurrency}, lease ${row.lease_ms} ms`,
      );
      if (endpoint) print(`metrics at ${endpoint.url}`);
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
      await endpoint?.close();
    }
  },
};
