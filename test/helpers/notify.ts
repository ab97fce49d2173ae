import pg from 'pg';
import type { TestDatabase } from './database.js';
import { waitFor } from './database.js';

let markers = 0;

/** The notifications (runledger_runnable by default) a statement sends. */
export function notifyHelpers(db: TestDatabase) {
  /**
   * The runledger_runnable notifications (payloads, in order) sent while fn runs, seen by a
   * dedicated LISTEN session. A marker notified afterwards bounds the wait: notifications
   * arrive in commit order, so once the marker is in, everything fn committed is in too.
   */
  async function notified<T>(fn: () => Promise<T>, channel = 'runledger_runnable'): Promise<{ result: T; payloads: string[] }> {
    const listener = new pg.Client({ connectionString: db.url });
    await listener.connect();
    const payloads: string[] = [];
    listener.on('notification', (message) => {
      if (message.channel === channel) payloads.push(message.payload ?? '');
    });
    try {
      await listener.query(`listen ${channel}`);
      const result = await fn();
      markers += 1;
      const marker = `.marker-${markers}`; // no queue name starts with a dot
      await db.pool.query(`select pg_notify($2, $1)`, [marker, channel]);
      await waitFor('the marker notification', async () => payloads.includes(marker), 10_000);
      return { result, payloads: payloads.slice(0, payloads.indexOf(marker)) };
    } finally {
      await listener.end();
    }
  }
  return { notified };
}
