import { createServer } from 'node:net';
import { describe, expect, it } from 'vitest';
import { parseMultiHost } from '../../../src/engine/db/multi-host.js';
import { useTestEngine } from '../../helpers/test-engine.js';

/**
 * Connection strings naming several hosts (libpq's `host=a,b`, `target_session_attrs`),
 * which node-postgres alone does not understand: the failover drill
 * (test/drills/failover.test.ts) gives them to workers. Here the first host is a port
 * nobody listens on, so every connection must go on to the second.
 */
const t = useTestEngine({ engine: false });
const { db } = t;

/** A port that refuses connections: bound, then closed. */
function deadPort(): Promise<number> {
  return new Promise((resolve) => {
    const probe = createServer();
    probe.listen(0, '127.0.0.1', () => {
      const address = probe.address();
      probe.close(() => resolve(typeof address === 'object' && address ? address.port : 1));
    });
  });
}

function hostsOf(url: string, dead: number): string {
  const parsed = new URL(url);
  const auth = `${parsed.username}${parsed.password ? `:${parsed.password}` : ''}@`;
  return `postgres://${auth}127.0.0.1:${dead},${parsed.hostname}:${parsed.port || 5432}${parsed.pathname}`;
}

describe('multi-host connection strings', () => {
  it('an engine and its worker skip a host that is down: a run started on host=dead,live completes, LISTEN included', async () => {
    const url = `${hostsOf(db.url, await deadPort())}?target_session_attrs=read-write`;
    const engine = t.newEngine({ connectionString: url });
    const hello = engine.workflow({ name: 'hello-multi-host' }, async (ctx) => ctx.step('greet', () => 'hello'));
    const worker = await engine.runWorker({ concurrency: 2, pollIntervalMs: 100 });
    const handle = await engine.start(hello, undefined);
    await expect(handle.result({ timeoutMs: 20_000 })).resolves.toBe('hello');
    // The worker's LISTEN connection reached the live host too.
    const listening = await db.pool.query(
      `select count(*)::int as n from pg_stat_activity where datname = current_database() and query ilike 'listen runledger%'`,
    );
    expect(listening.rows[0].n).toBeGreaterThanOrEqual(1);
    await worker.stop();
  });

  it('parses both forms; one host without target_session_attrs is left to node-postgres', () => {
    expect(parseMultiHost('postgres://u:p@a:5432,b:5433/db?target_session_attrs=read-write&application_name=x')).toEqual({
      hosts: [
        { host: 'a', port: 5432 },
        { host: 'b', port: 5433 },
      ],
      readWrite: true,
      config: { connectionString: 'postgres://u:p@a:5432/db?application_name=x' },
    });
    expect(parseMultiHost(`host=a,b port=5432,5433 user=u dbname=db password='p w' target_session_attrs=read-write`)).toEqual({
      hosts: [
        { host: 'a', port: 5432 },
        { host: 'b', port: 5433 },
      ],
      readWrite: true,
      config: { user: 'u', password: 'p w', database: 'db' },
    });
    expect(parseMultiHost('postgres://u@a,b/db')).toMatchObject({
      hosts: [
        { host: 'a', port: 5432 },
        { host: 'b', port: 5432 },
      ],
      readWrite: false,
    });
    expect(parseMultiHost('postgres://u@a:5432/db')).toBeUndefined();
  });
});
