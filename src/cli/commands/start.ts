import { print } from '../format.js';
import { CliError, parse, withEngine, type Command } from '../shared.js';

/**
 * Through runledger.start_run, exactly as from psql: the workflow must have been
 * registered by a worker or engine that defines it. Prints only the run id, so
 * scripts can write RUN=$(runledger start ...).
 */
export const start: Command = {
  summary: 'start a run of a registered workflow; prints its run id',
  usage: "runledger start WORKFLOW [JSON_INPUT] [--idempotency-key K] [--queue Q] [--version V] [--priority N]",
  async run(args) {
    const parsed = parse(
      start,
      args,
      {
        'idempotency-key': { type: 'string' },
        queue: { type: 'string' },
        version: { type: 'string' },
        priority: { type: 'string' },
      },
      { min: 1, max: 2 },
    );
    if (!parsed) return;
    const [workflow, json] = parsed.positionals as [string, string | undefined];
    if (json !== undefined) {
      try {
        JSON.parse(json);
      } catch (error) {
        throw new CliError('USAGE', `JSON_INPUT is not valid JSON: ${(error as Error).message}`);
      }
    }
    const { values } = parsed;
    const options: Record<string, unknown> = {};
    if (values['idempotency-key'] !== undefined) options.idempotency_key = values['idempotency-key'];
    if (values.queue !== undefined) options.queue = values.queue;
    if (values.version !== undefined) options.version = values.version;
    if (values.priority !== undefined) {
      options.priority = Number(values.priority);
      if (!Number.isInteger(options.priority)) throw new CliError('USAGE', `--priority must be a whole number, got ${JSON.stringify(values.priority)}`);
    }
    const runId = await withEngine(values, async (engine) => {
      const result = await engine.pool.query('select runledger.start_run($1, $2::jsonb, $3::jsonb) as run_id', [
        workflow,
        json ?? null,
        JSON.stringify(options),
      ]);
      return result.rows[0].run_id as string;
    });
    print(runId);
  },
};
