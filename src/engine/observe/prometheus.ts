/**
 * A Prometheus text endpoint for one process (`runledger worker --metrics-port`): its own
 * MeterProvider (@opentelemetry/sdk-metrics) with @opentelemetry/exporter-prometheus as
 * the reader, passed to the engine as `meterProvider`. Nothing is registered globally.
 * Both packages are optional peer dependencies, loaded only here.
 */
import { createServer, type Server } from 'node:http';
import { ConfigError } from '../core/errors.js';
import type { MeterProviderLike } from './metrics.js';

export const METRICS_HOST_DEFAULT = '127.0.0.1';
export const METRICS_PATH = '/metrics';

export interface PrometheusEndpoint {
  /** Give it to createEngine({ meterProvider }). */
  readonly meterProvider: MeterProviderLike;
  /** http://host:port/metrics, with the port the server listens on (port 0: the one it was given). */
  readonly url: string;
  readonly port: number;
  close(): Promise<void>;
}

const INSTALL = 'npm install @opentelemetry/api@^1.9.0 @opentelemetry/sdk-metrics@2.12.0 @opentelemetry/exporter-prometheus@0.223.0';

/** Serves GET /metrics in the Prometheus text format on host:port (default host 127.0.0.1: this machine only). */
export async function startPrometheusEndpoint(options: { port: number; host?: string }): Promise<PrometheusEndpoint> {
  const host = options.host ?? METRICS_HOST_DEFAULT;
  let sdk: typeof import('@opentelemetry/sdk-metrics');
  let exporterModule: typeof import('@opentelemetry/exporter-prometheus');
  try {
    [sdk, exporterModule] = await Promise.all([import('@opentelemetry/sdk-metrics'), import('@opentelemetry/exporter-prometheus')]);
  } catch (error) {
    throw new ConfigError(`--metrics-port needs the OpenTelemetry metrics SDK and Prometheus exporter: ${INSTALL}`, { cause: error });
  }
  // The exporter's own server is not started: ours answers /metrics only, and tells its port.
  const exporter = new exporterModule.PrometheusExporter({ preventServerStart: true });
  const meterProvider = new sdk.MeterProvider({ readers: [exporter] });
  const server: Server = createServer((request, response) => {
    const path = (request.url ?? '').split('?')[0];
    if (path === METRICS_PATH && (request.method === 'GET' || request.method === 'HEAD')) {
      exporter.getMetricsRequestHandler(request, response);
      return;
    }
    response.statusCode = path === METRICS_PATH ? 405 : 404;
    response.end(path === METRICS_PATH ? 'GET only\n' : `not found: metrics are at ${METRICS_PATH}\n`);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen({ port: options.port, host }, () => {
      server.off('error', reject);
      resolve();
    });
  }).catch(async (error: unknown) => {
    await meterProvider.shutdown().catch(() => undefined);
    throw new ConfigError(`--metrics-port: cannot listen on ${host}:${options.port}: ${(error as Error).message}`, { cause: error });
  });
  const address = server.address();
  const port = typeof address === 'object' && address ? address.port : options.port;
  const shownHost = host.includes(':') ? `[${host}]` : host;
  return {
    meterProvider,
    port,
    url: `http://${shownHost}:${port}${METRICS_PATH}`,
    async close() {
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
      await meterProvider.shutdown().catch(() => undefined);
    },
  };
}
