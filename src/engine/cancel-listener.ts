import pg from 'pg';
import type { LogFunction } from './pools.js';

export const CANCEL_CHANNEL = 'runledger_cancel';
const RECONNECT_MS_MAX = 5_000;

/**
 * LISTENs on runledger_cancel so a worker hears a cancel within milliseconds, not at
 * its next checkpoint. Reconnects after a lost connection; a notification missed
 * meanwhile is still seen through the checkpoint's answer (the run's status).
 */
export async function listenForCancels(config: pg.PoolConfig, log: LogFunction, onCancel: (runId: string) => void): Promise<{ close(): Promise<void> }> {
  let client: pg.Client | undefined;
  let closed = false;
  let retryMs = 100;

  const connect = async (): Promise<void> => {
    if (closed) return;
    const next = new pg.Client(config);
    next.on('notification', (message) => {
      if (message.channel === CANCEL_CHANNEL && message.payload) onCancel(message.payload);
    });
    next.on('error', (error) => {
      log('warn', `cancel listener: connection lost (${error.message}); reconnecting`);
      void next.end().catch(() => undefined);
      if (client === next) client = undefined;
      setTimeout(() => void connect().catch(() => undefined), retryMs).unref();
      retryMs = Math.min(RECONNECT_MS_MAX, retryMs * 2);
    });
    try {
      await next.connect();
      await next.query(`listen ${CANCEL_CHANNEL}`);
      client = next;
      retryMs = 100;
      if (closed) await next.end();
    } catch (error) {
      log('warn', `cancel listener: cannot connect (${(error as Error).message}); retrying`);
      void next.end().catch(() => undefined);
      setTimeout(() => void connect().catch(() => undefined), retryMs).unref();
      retryMs = Math.min(RECONNECT_MS_MAX, retryMs * 2);
    }
  };
  await connect();
  return {
    async close() {
      closed = true;
      await client?.end().catch(() => undefined);
    },
  };
}
