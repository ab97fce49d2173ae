import { toMs } from '../../engine/core/duration.js';
import { print } from '../format.js';
import { InvalidInputError } from '../../engine/core/errors.js';
import { definedWorkflows, loadRegister } from '../module.js';
import { CliError, EXIT_FAILED, cliPayloads, jsonArgument, parse, withEngine, withPool, type Command, type Parsed } from '../shared.js';

/**
 * Through runledger.start_run, exactly as from psql: the workflow must have been
 * registered by a worker or engine that defines it. Prints only the run id, so
 * scripts can write RUN=$(runledger start ...).
 *
 * start_run cannot check the input against the workflow's zod schema (the schema is
 * code); with `--module` the CLI loads the workflows as `runledger worker --module`
 * does and checks it first: bad input is refused (INVALID_INPUT, exit 1) and nothing
 * is started. The run then starts on the module's version, with the schema's output as
 * its input, as engine.start stores it.
 */
export const start: Command = {
  summary: 'start a run of a registered workflow; prints its run id',
  usage:
    'runledger start WORKFLOW [JSON_INPUT|@FILE|-] [--module FILE] [--idempotency-key K] [--queue Q] [--version V]\n' +
    '                [--priority N] [--concurrency-key K] [--deadline INTERVAL|TIMESTAMP] [--run-at TIMESTAMP|DURATION]',
  args: [
    ['WORKFLOW', 'the workflow name, as a worker registered it'],
    ['JSON_INPUT', 'the input as JSON (default: none); @FILE reads it from a file, - reads it from stdin'],
  ],
  details:
    'The input is read from stdin only when the argument is `-` (never implicitly, so a script with a closed or idle\n' +
    'stdin does not hang). Use @FILE or - for large inputs: a command line of a few hundred KB fails with\n' +
    '"Argument list too long". Without --module the input is not checked against the schema here: a run whose\n' +
    'input fails it ends FAILED with INVALID_INPUT when a worker claims it.',
  examples: [
    'runledger start order \'{"item":"book","amount":3}\' --idempotency-key order-7',
    'runledger start order @order.json --module ./dist/workflows.js',
    'jq -n \'{item: "book", amount: 3}\' | runledger start order - --module ./dist/workflows.js',
    'RUN=$(runledger start report --queue nightly --run-at 2h)',
  ],
  async run(args) {
    const parsed = parse(
      start,
      args,
      {
        module: {
          type: 'string',
          short: 'm',
          value: 'FILE',
          help: "check the input against the workflow's schema in this module (as `worker --module` loads it) before starting",
        },
        'idempotency-key': { type: 'string', value: 'K', help: 'starting again with the same key returns the same run' },
        queue: { type: 'string', value: 'Q', help: "the queue (default: the workflow's)" },
        version: { type: 'string', value: 'V', help: "the workflow version (default: the newest registered; with --module: the module's)" },
        priority: { type: 'string', value: 'N', help: 'a whole number; lower runs first (default 0)' },
        'concurrency-key': { type: 'string', value: 'K', help: "the key the queue's --per-key limit counts by (a tenant, a user)" },
        deadline: {
          type: 'string',
          value: 'D',
          help: "a lifetime ('2 days') or a date-time; past it the run ends TERMINATED (DEADLINE)",
        },
        'run-at': {
          type: 'string',
          value: 'T',
          help: 'not before this date-time (2030-01-31T12:00Z) or after this duration (90s, 10m, 2h)',
        },
      },
      { min: 1, max: 2 },
    );
    if (!parsed) return;
    const [workflow, raw] = parsed.positionals as [string, string | undefined];
    const input = await jsonArgument(raw, 'JSON_INPUT');
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
    let inputText = input === undefined ? null : JSON.stringify(input.value);
    if (typeof values.module === 'string') {
      const checked = await checkInput(values, values.module, workflow, values.version as string | undefined, input?.value);
      options.version = checked.version;
      inputText = checked.inputText;
    }
    // With RUNLEDGER_KEYS set the input is stored encrypted, as engine.start stores it.
    const payloads = cliPayloads();
    if (inputText !== null && payloads.enabled) inputText = payloads.text(inputText);
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

/**
 * Loads the module, finds its definition of the workflow and checks the input against its
 * schema: what engine.start does before it stores anything. The engine is never started
 * (no worker, no registration); the module's register function only defines workflows on it.
 */
async function checkInput(
  values: Parsed['values'],
  path: string,
  name: string,
  version: string | undefined,
  input: unknown,
): Promise<{ version: string; inputText: string | null }> {
  const register = await loadRegister(path);
  const defined = await withEngine(values, (engine) => definedWorkflows(engine, register));
  const named = defined.filter((w) => w.name === name);
  const chosen = version === undefined ? named : named.filter((w) => w.version === version);
  if (chosen.length === 0) {
    const what = named.length > 0 ? `${name}@${version} (it defines ${named.map((w) => `${name}@${w.version}`).join(', ')})` : name;
    const has = defined.map((w) => `${w.name}@${w.version}`).join(', ') || 'none';
    throw new CliError('MODULE', `${path} does not define workflow ${what}; it defines: ${has}`, EXIT_FAILED);
  }
  if (chosen.length > 1) {
    throw new CliError(
      'USAGE',
      `${path} defines ${chosen.length} versions of ${name} (${chosen.map((w) => w.version).join(', ')}): pick one with --version`,
    );
  }
  const wf = chosen[0]!;
  let stored = input;
  if (wf.inputSchema) {
    const result = wf.inputSchema.safeParse(input);
    if (!result.success) {
      const issues = result.error.issues
        .map((issue) => `${issue.path.length > 0 ? issue.path.join('.') : '(the input)'}: ${issue.message}`)
        .join('; ');
      throw new InvalidInputError(`start: input of ${wf.name}@${wf.version} is invalid: ${issues}`, {
        details: { issues: result.error.issues },
      });
    }
    stored = result.data;
  }
  return { version: wf.version, inputText: stored === undefined ? null : JSON.stringify(stored) };
}

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
