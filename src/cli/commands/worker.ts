import { print } from '../format.js';
import { loadRegister } from '../module.js';
import { constants as osConstants } from 'node:os';
import { SHUTDOWN_TIMEOUT_MS_DEFAULT } from '../../index.js';
import { CliError, EXIT_FAILED, intOption, openEngine, parse, type Command, untilSignal, cliIo } from '../shared.js';
import { METRICS_HOST_DEFAULT, startPrometheusEndpoint } from '../../engine/observe/prometheus.js';

/** On a second signal: the most the release of what is still held may take before the process exits. */
const FORCE_RELEASE_MS = 1_000;
/** After the grace period: how long the stop may take in all before the process exits anyway. */
const STOP_BACKSTOP_MS = 10_000;
/** After the stop: how long closing the pools may take (a step deaf to its abort may hold a connection). */
const CLOSE_MS = 1_000;

/**
 * Runs workflows from the user's module until SIGINT/SIGTERM. The module defines
 * them on the engine it is given (default export or named `register`), so the
 * same module works in the user's own process and here.
 */
export const worker: Command = {
  summary: 'run a worker for the workflows a module defines, until Ctrl-C',
  usage:
    'runledger worker --module ./dist/workflows.js [--concurrency 16] [--queue Q ...] [--lease-ms N] [--grace-ms N] [--retention-interval-ms N] [--metrics-port N [--metrics-host H]]',
  details:
    'The module exports register(engine) (or a default function) that defines workflows on the engine it is given.\n' +
    'The first SIGINT or SIGTERM stops it gracefully: it claims nothing more, lets the runs in flight finish for up to\n' +
    '--grace-ms, then aborts them, releases every run it still holds (another worker takes them at once, without waiting\n' +
    'for the lease), marks the worker stopped and exits 0: moments after the grace period, at most about 10 s after it\n' +
    'when the database is unreachable (the leases then expire on their own). A second signal during the stop releases\n' +
    "what it can within 1 s and exits: 143 after a second SIGTERM, 130 after a second SIGINT. Set the orchestrator's kill timeout\n" +
    '(terminationGracePeriodSeconds, TimeoutStopSec, stop_grace_period) above --grace-ms + 10 s.\n' +
    "--metrics-port serves the engine's metrics at http://HOST:N/metrics in the Prometheus text format (docs/observability.md);\n" +
    'it binds 127.0.0.1 unless --metrics-host says otherwise (0.0.0.0: every interface), and needs\n' +
    '@opentelemetry/api, @opentelemetry/sdk-metrics and @opentelemetry/exporter-prometheus installed.',
  examples: [
    'runledger worker --module ./dist/workflows.js',
    'runledger worker -m ./dist/workflows.js --queue emails --queue default --concurrency 4',
    'runledger worker -m ./dist/workflows.js --grace-ms 20000   # under a 30 s kill timeout: 20 s to finish, then release',
    'runledger worker -m ./dist/workflows.js --retention-interval-ms 0   # never applies runledger.retention',
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
      'grace-ms': {
        type: 'string',
        value: 'N',
        help: 'on the first SIGINT/SIGTERM, how long runs in flight may take to finish before they are aborted and released (default 10000)',
      },
      'retention-interval-ms': {
        type: 'string',
        value: 'N',
        help: 'how often the cluster applies runledger.retention, one worker per pass (default 600000 = 10 min; 0: never here)',
      },
      'metrics-port': { type: 'string', value: 'N', help: 'serve GET /metrics (Prometheus text format) on this port (0: any free port)' },
      'metrics-host': { type: 'string', value: 'HOST', help: `the address --metrics-port binds (default ${METRICS_HOST_DEFAULT})` },
    });
    if (!parsed) return;
    const { values } = parsed;
    if (typeof values.module !== 'string') throw new CliError('USAGE', `--module is required\nusage: ${worker.usage}`);
    const concurrency = intOption(values, 'concurrency', 1) ?? 16;
    const leaseMs = intOption(values, 'lease-ms', 500);
    const graceMs = intOption(values, 'grace-ms', 0);
    const retentionIntervalMs = intOption(values, 'retention-interval-ms', 0);
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
        ...(graceMs === undefined ? {} : { shutdownTimeoutMs: graceMs }),
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
      if (endpoint) print(`metrics at ${endpoint.url}`);
      // A second signal means "now": what can be released quickly is, the rest is left to lease expiry.
      let forced: Promise<never> | undefined;
      const force = (signal: NodeJS.Signals) => {
        print(`${signal} again: releasing what is held and exiting now`);
        forced = running.forceStop(FORCE_RELEASE_MS).finally(() => process.exit(signalExitCode(signal))) as Promise<never>;
      };
      // Listening before the line that says so: a signal sent as soon as it is read must
      // find a listener (without one, it kills the process).
      const stopSignal = untilSignal(force);
      print('Ctrl-C (SIGINT) or SIGTERM stops it gracefully');
      const first = await stopSignal;
      print(
        `stopping (${first}): letting ${running.inFlight} run(s) in flight finish within ${graceMs ?? SHUTDOWN_TIMEOUT_MS_DEFAULT} ms, then releasing the rest ...`,
      );
      // stop() bounds its own waits; this is the backstop for anything it cannot bound.
      const backstop = setTimeout(
        () => {
          cliIo().stderr.write('worker: the stop did not finish in time; exiting (leases still held expire on their own)\n');
          process.exit(EXIT_FAILED);
        },
        (graceMs ?? SHUTDOWN_TIMEOUT_MS_DEFAULT) + STOP_BACKSTOP_MS,
      );
      backstop.unref();
      await running.stop();
      // A forced stop that began meanwhile ends the process with its own code.
      if (forced) await forced;
      // A step deaf to its abort signal may still hold a pool connection or a timer: the
      // pools get a moment to close, then the process exits whatever is left.
      await Promise.race([engine.close(), new Promise((resolve) => setTimeout(resolve, CLOSE_MS).unref())]);
      print('stopped');
      process.exit(0);
    } finally {
      await engine.close();
      await endpoint?.close();
    }
  },
};

/** The exit code of a process ended by `signal`, as a shell reports it: 128 + its number (SIGINT 130, SIGTERM 143). */
export function signalExitCode(signal: NodeJS.Signals): number {
  return 128 + (osConstants.signals[signal] ?? 0);
}
