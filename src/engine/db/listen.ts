import pg from 'pg';
import type { LogFunction } from '../core/log.js';

/** A run was cancelled: its worker stops it within milliseconds, not at its next checkpoint. */
export const CANCEL_CHANNEL = 'runledger_cancel';
/** A run became runnable in the queue named by the payload ("queue"), or will in that many ms ("queue+ms"). */
export const RUNNABLE_CHANNEL = 'runledger_runnable';
const RECONNECT_MS_MAX = 5_000;

/** Runs that ended (payload: their ids, comma-separated); callers awaiting results listen for it. */
export const FINISHED_CHANNEL = 'runledger_finished';

/** A run was marked for a migration (payload: workflow@from>to); workers with that migration apply it. */
export const MIGRATE_CHANNEL = 'runledger_migrate';

/** A run's durable stream got chunks or was closed (payload: the run id); engine.readStream's readers listen for it. */
export const STREAM_CHANNEL = 'runledger_stream';

export interface Listener {
  /** True while the LISTEN connection is up: notifications arrive. */
  readonly listening: boolean;
  close(): Promise<void>;
}

/**
 * One LISTEN connection (per worker, and per engine for awaited results) for runledger's channels. Reconnects after a lost
 * connection and then calls onReconnect: notifications sent meanwhile are gone, so the
 * caller looks for itself (a cancel is still seen in the checkpoint's answer, and
 * runnable runs by the next claim).
 */
export async function listen(
  config: pg.PoolConfig,
  log: LogFunction,
  handlers: Record<string, (payload: string) => void>,
  onReconnect: () => void = () => {},
  onLost: () => void = () => {},
): Promise<Listener> {
  let client: pg.Client | undefined;
  let closed = false;
  let retryMs = 100;
  let connectedBefore = false;

  const retry = () => {
    setTimeout(() => void connect().catch(() => undefined), retryMs).unref();
    retryMs = Math.min(RECONNECT_MS_MAX, retryMs * 2);
  };
  const connect = async (): Promise<void> => {
    if (closed) return;
    // A multi-host connection string brings its own client class (db/multi-host.ts), which picks the host.
    const Client = (config.Client as typeof pg.Client | undefined) ?? pg.Client;
    const next = new Client(config);
    next.on('notification', (message) => {
      const handler = handlers[message.channel];
      if (handler && message.payload !== undefined) handler(message.payload);
    });
    next.on('error', (error) => {
      log('warn', `listener: connection lost (${error.message}); reconnecting`);
      void next.end().catch(() => undefined);
      if (client === next) {
        client = undefined;
        onLost();
      }
      retry();
    });
    try {
      await next.connect();
      for (const channel of Object.keys(handlers)) await next.query(`listen ${channel}`);
      client = next;
      retryMs = 100;
      if (closed) await next.end();
      else if (connectedBefore) onReconnect();
      connectedBefore = true;
    } catch (error) {
      log('warn', `listener: cannot connect (${(error as Error).message}); retrying`);
      void next.end().catch(() => undefined);
      retry();
    }
  };
  await connect();
  return {
    get listening() {
      return client !== undefined && !closed;
    },
    async close() {
      closed = true;
      await client?.end().catch(() => undefined);
    },
  };
}
