import { QUEUE_KEYS_SQL, QUEUE_TOTALS_SQL, type QueueRow } from '../../engine/client/reads.js';
import { ago, print, printJson, renderTable } from '../format.js';
import { JSON_OPTION, parse, withPool, type Command } from '../shared.js';

/** Reads runledger.queue_stats: what each queue holds right now, and its limits. */
export const queues: Command = {
  summary: 'queues: runs queued, ready, running and waiting, and their limits',
  usage: 'runledger queues [--keys] [--json]',
  details:
    'QUEUED: not admitted yet (limits, pause); READY: admitted, waiting for a worker; RUNNING; WAITING: durable waits; OLDEST: the oldest pending run.',
  examples: ['runledger queues', 'runledger queues --keys', "runledger queues --json | jq '.[] | select(.paused)'"],
  async run(args) {
    const parsed = parse(queues, args, {
      keys: { type: 'boolean', help: 'one row per concurrency key too (concurrency_key null: the queue total)' },
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const byKey = Boolean(parsed.values.keys);
    const rows = await withPool(parsed.values, async (pool) => {
      const totals = (await pool.query<QueueRow>(QUEUE_TOTALS_SQL)).rows;
      if (!byKey) return totals;
      const keys = (await pool.query<QueueRow>(QUEUE_KEYS_SQL)).rows;
      return totals.flatMap((total) => [total, ...keys.filter((k) => k.queue_name === total.queue_name)]);
    });
    if (parsed.values.json) {
      printJson(rows);
      return;
    }
    if (rows.length === 0) {
      print('no queues: no unfinished runs and no queue configured (runledger set-queue NAME ...)');
      return;
    }
    const table = rows.map((r) => [
      r.concurrency_key === null ? r.queue_name : `${r.queue_name}/${r.concurrency_key === '' ? '(no key)' : r.concurrency_key}`,
      String(r.waiting_admission),
      String(r.dispatched),
      String(r.running),
      String(r.waiting),
      r.oldest_pending_s === null ? '-' : ago(new Date(Date.now() - r.oldest_pending_s * 1000)),
      r.concurrency_key === null ? limits(r, true) : '',
    ]);
    print(
      renderTable(['QUEUE', 'QUEUED', 'READY', 'RUNNING', 'WAITING', 'OLDEST', 'LIMITS'], table, { shrink: [6, 0], right: [1, 2, 3, 4] }),
    );
    print('\nQUEUED: not admitted yet (limits, pause); READY: admitted, waiting for a worker; OLDEST: oldest pending run');
  },
};

/**
 * A queue's limits in one line: "PAUSED, concurrency 5, per key 1, 100 per 60000 ms", or
 * compact for a table cell: "PAUSED conc=5 key=1 rate=100/60000ms"; "none" without limits.
 */
export function limits(
  q: Pick<QueueRow, 'concurrency' | 'per_key_concurrency' | 'rate_limit_max' | 'rate_limit_period_ms' | 'paused'>,
  compact = false,
): string {
  const parts = [
    q.paused ? 'PAUSED' : undefined,
    q.concurrency === null ? undefined : compact ? `conc=${q.concurrency}` : `concurrency ${q.concurrency}`,
    q.per_key_concurrency === null ? undefined : compact ? `key=${q.per_key_concurrency}` : `per key ${q.per_key_concurrency}`,
    q.rate_limit_max === null
      ? undefined
      : compact
        ? `rate=${q.rate_limit_max}/${q.rate_limit_period_ms}ms`
        : `${q.rate_limit_max} per ${q.rate_limit_period_ms} ms`,
  ].filter((part) => part !== undefined);
  return parts.length === 0 ? 'none' : parts.join(compact ? ' ' : ', ');
}
