import { toMs } from '../../engine/core/duration.js';
import { print } from '../format.js';
import { CliError, cliPayloads, jsonArgument, parse, withPool, type Command } from '../shared.js';

/**
 * Through runledger.start_run, exactly as from psql: the workflow must have been
 * registered by a worker or engine that defines it. Prints only the run id, so
 * scripts can write RUN=$(runledger start ...).
 */
export const start: Command = {
  summary: 'start a run of a registered workflow; prints its run id',
  usage:
    'runledger start WORKFLOW [JSON_INPUT] [--idempotency-key K] [--queue Q] [--version V] [--priority N]\n' +
    '                [--concurrency-key K] [--deadline INTERVAL|TIMESTAMP] [--run-at TIMESTAMP|DURATION]',
  async run(args) {
    const parsed = parse(
      start,
      args,
      {
        'idempotency-key': { type: 'string' },
        queue: { type: 'string' },
        version: { type: 'string' },
        priority: { type: 'string' },
        'concurrency-key': { type: 'string' },
        deadline: { type: 'string' },
        'run-at': { type: 'string' },
      },
      { min: 1, max: 2 },
    );
    if (!parsed) return;
    const [workflow, json] = parsed.positionals as [string, string | undefined];
    const input = jsonArgument(json, 'JSON_INPUT');
    const { values } = parsed;
    const options: Record<string, unknown> = {};
    if (values['idempotency-key'] !== undefined) options.idempotency_key = values['idempotency-key'];
    if (values.queue !== undefined) options.queue = values.queue;
    if (values.version !== undefined) options.version = values.version;
    if (values['concurrency-key'] !== undefined) options.concurrency_key = values['concurrency-key'];
    // start_run reads a date-time as a point in time and anything else ('2 days') as a lifetime.
    if (values.deadline !== undefined) options.deadline = values.deadline;
    if (values['run-at'] !== undefined) Object.assign(options, runAt(values['run-at'] as string));
    if (values.priority !== undefined) {
      options.priority = Number(values.priority);
      if (!Number.isInteger(options.priority))
        throw new CliError('USAGE', `--priority must be a whole number, got ${JSON.stringify(values.priority)}`);
    }
    // With RUNLEDGER_KEYS set the input is stored encrypted, as engine.start stores it.
    const payloads = cliPayloads();
    const inputText = json === undefined ? null : payloads.enabled ? payloads.text(JSON.stringify(input)) : json;
    const runId = await withPool(values, async (pool) => {
      const result = await pool.query(
        'select runledger.start_run(p_workflow => $1, p_input => $2::jsonb, p_options => $3::jsonb) as run_id',
        [workflow, inputText, JSON.stringify(options)],
      );
      return result.rows[0].run_id as string;
    });
    print(runId);
  },
};

/** '10m' (from now, on the database's clock: run_in_ms) or a date-time (run_at); the run is not claimed before then. */
function runAt(raw: string): { run_at: string } | { run_in_ms: number } {
  if (/^\d{4}-\d{2}-\d{2}/.test(raw)) return { run_at: raw };
  try {
    return { run_in_ms: Math.round(toMs(raw, '--run-at')) };
  } catch {
    throw new CliError(
      'USAGE',
      `--run-at must be a date-time (2030-01-31T12:00Z) or a duration (90s, 10m, 2h), got ${JSON.stringify(raw)}`,
    );
  }
}
