import { toMs } from '../../engine/core/duration.js';
import { setQueue as setQueueSql, type QueueOptions } from '../../engine/client/queues.js';
import { print } from '../format.js';
import { CliError, parse, withPool, type Command, type Parsed } from '../shared.js';
import { limits } from './queues.js';

/**
 * Through runledger.set_queue: options given replace the current value, options
 * left out are kept, and `none` clears a limit. The new limits act at once,
 * across every worker (admission is in SQL).
 */
export const setQueue: Command = {
  summary: "create or change a queue's limits (concurrency, per key, rate, pause)",
  usage:
    'runledger set-queue NAME [--concurrency N|none] [--per-key N|none] [--rate MAX/PERIOD_MS|none] [--pause|--resume]\n' +
    '       (PERIOD_MS may also be a duration: --rate 100/1m)',
  args: [['NAME', 'the queue (created if it does not exist)']],
  details: 'Options given replace the current value, options left out are kept. The new limits act at once, on every worker.',
  examples: [
    'runledger set-queue emails --concurrency 5 --rate 100/1m',
    'runledger set-queue tenants --per-key 1',
    'runledger set-queue emails --pause',
    'runledger set-queue emails --resume --concurrency none',
  ],
  async run(args) {
    const parsed = parse(
      setQueue,
      args,
      {
        concurrency: { type: 'string', value: 'N|none', help: 'runs of the queue running at once, across workers' },
        'per-key': { type: 'string', value: 'N|none', help: 'runs with the same concurrency key running at once' },
        rate: { type: 'string', value: 'MAX/PERIOD|none', help: 'at most MAX runs started per PERIOD (ms, or a duration: 100/1m)' },
        pause: { type: 'boolean', help: 'admit no more runs (running ones go on)' },
        resume: { type: 'boolean', help: 'admit runs again' },
      },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const name = parsed.positionals[0]!;
    const { values } = parsed;
    if (values.pause && values.resume) throw new CliError('USAGE', `--pause and --resume contradict each other\nusage: ${setQueue.usage}`);
    const options: QueueOptions = {};
    const concurrency = limit(values, 'concurrency');
    if (concurrency !== undefined) options.concurrency = concurrency;
    const perKey = limit(values, 'per-key');
    if (perKey !== undefined) options.perKeyConcurrency = perKey;
    if (values.rate !== undefined) options.rateLimit = rate(values.rate as string);
    if (values.pause) options.paused = true;
    if (values.resume) options.paused = false;
    const queue = await withPool(values, (pool) => setQueueSql(pool, name, options));
    print(
      `queue ${queue.name}: ${limits({
        concurrency: queue.concurrency,
        per_key_concurrency: queue.perKeyConcurrency,
        rate_limit_max: queue.rateLimitMax,
        rate_limit_period_ms: queue.rateLimitPeriodMs,
        paused: queue.paused,
      })}`,
    );
  },
};

/** A whole number >= 1, or `none` (null: clears the limit). */
function limit(values: Parsed['values'], name: string): number | null | undefined {
  const raw = values[name];
  if (raw === undefined) return undefined;
  if (raw === 'none') return null;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < 1)
    throw new CliError('USAGE', `--${name} must be a whole number >= 1 or none, got ${JSON.stringify(raw)}`);
  return n;
}

function rate(raw: string): { max: number; periodMs: number } | null {
  if (raw === 'none') return null;
  const match = /^(\d+)\/(.+)$/.exec(raw);
  const max = Number(match?.[1]);
  let periodMs = Number.NaN;
  if (match) {
    try {
      periodMs = /^\d+$/.test(match[2]!) ? Number(match[2]) : toMs(match[2]!, '--rate');
    } catch {
      // reported below
    }
  }
  if (!match || !Number.isInteger(max) || max < 1 || !Number.isInteger(periodMs) || periodMs < 1) {
    throw new CliError('USAGE', `--rate must be MAX/PERIOD_MS (e.g. 100/60000 or 100/1m) or none, got ${JSON.stringify(raw)}`);
  }
  return { max, periodMs };
}
