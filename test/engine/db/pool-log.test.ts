import { describe, expect, it } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';

/**
 * A restart of PostgreSQL kills every connection of a worker's pool at once (the
 * restart drill, test/drills/restart.test.ts, does it every few seconds). The log says
 * so once per outage, not once per connection: with poolMax 100 that was 100+ lines.
 */
const lines: string[] = [];
const t = useTestEngine({ engine: { poolMax: 12, log: (level, message) => lines.push(`${level}: ${message}`) } });
const { db } = t;

describe('a pool whose connections all die at once', () => {
  it('logs the loss once (and later how many more), not a line per connection', async () => {
    const clients = await Promise.all(Array.from({ length: 12 }, () => t.engine.pool.connect()));
    const pids = await Promise.all(clients.map(async (c) => (await c.query('select pg_backend_pid() as pid')).rows[0].pid as number));
    for (const c of clients) c.release();
    await db.pool.query('select pg_terminate_backend(pid) from unnest($1::int[]) pid', [pids]);
    await waitFor('the pool to drop its dead connections', async () => t.engine.pool.totalCount === 0);
    const lost = lines.filter((line) => line.includes('connection lost'));
    expect(lost).toEqual(['warn: pool: connection lost']);
    // The pool still works: new connections replace the dead ones.
    expect((await t.engine.pool.query('select 1 as one')).rows).toEqual([{ one: 1 }]);
  });
});
