import { describe, expect, it } from 'vitest';
import { ConfigError } from '../../../src/index.js';
import { workerHost } from '../../../src/engine/worker/worker.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { spawnWorker } from '../../helpers/worker-process.js';
import { waitFor } from '../../helpers/database.js';
import { hostname } from 'node:os';

// Each worker reports a host identity of its own (workers on several machines, or several pods on one hostname).
const t = useTestEngine({ fixtures: true });

describe('worker host identity', () => {
  it('the host option names the worker in runledger.workers and prefixes its id', async () => {
    const worker = await t.engine.runWorker({ host: 'pod-a.eu-west-1', manual: true });
    try {
      expect(worker.workerId.startsWith('pod-a.eu-west-1-')).toBe(true);
      const row = await t.db.pool.query('select host, pid from runledger.workers where worker_id = $1', [worker.workerId]);
      expect(row.rows).toEqual([{ host: 'pod-a.eu-west-1', pid: process.pid }]);
    } finally {
      await worker.stop();
    }
  });

  it('a worker process takes RUNLEDGER_HOST from its environment', async () => {
    const w = await spawnWorker({ DATABASE_URL: t.db.url, RUNLEDGER_HOST: 'host-3' });
    try {
      const workerId = /ready (\S+)/.exec(w.output())![1]!;
      const row = await waitFor('the worker registered', async () => {
        const result = await t.db.pool.query('select host, pid from runledger.workers where worker_id = $1', [workerId]);
        return result.rows[0];
      });
      expect(row).toEqual({ host: 'host-3', pid: w.pid });
    } finally {
      w.kill('SIGTERM');
      await w.exited;
    }
  });

  it('default: the hostname; a name that cannot be shown plainly is refused with CONFIG', () => {
    expect(workerHost(undefined, {})).toBe(hostname());
    expect(workerHost(undefined, { RUNLEDGER_HOST: '  ' })).toBe(hostname());
    expect(workerHost('rack-2', { RUNLEDGER_HOST: 'ignored' })).toBe('rack-2');
    expect(() => workerHost('two words', {})).toThrow(ConfigError);
    expect(() => workerHost('', {})).toThrow(/host must be 1-200/);
    expect(() => workerHost(undefined, { RUNLEDGER_HOST: 'x'.repeat(201) })).toThrow(/RUNLEDGER_HOST/);
  });
});
