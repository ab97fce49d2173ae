import { ulid } from 'ulid';
import { InvalidInputError, PayloadTooLargeError, RunFailedError, fromPgError } from '../core/errors.js';
import { toMs, type Duration } from '../core/duration.js';
import type pg from 'pg';
import { toJsonText } from '../core/json.js';
import type { RunRecord } from './runs.js';
import type { Jsonify } from '../core/jsonify.js';
import { TERMINAL_STATES } from '../core/states.js';
import { limitsToSql, type Workflow } from '../core/workflow.js';
import { RUNTIME_MANIFEST } from '../core/version.js';

export interface StartOptions {
  /** Explicit run id; starting again with the same id returns the same run. */
  runId?: string;
  /** Starting again with the same key (per workflow) returns the same run. */
  idempotencyKey?: string;
  queue?: string;
  priority?: number;
  concurrencyKey?: string;
  /** Wall-clock lifetime ('2d', ms) or an absolute Date; overrides the workflow's limit. */
  deadline?: Duration | Date;
  /**
   * Start no earlier than this: after this long ('10m', ms), counted on the database's
   * clock from the start (SQL run_in_ms), or at a Date, a wall-clock instant compared with
   * the database's clock (runledger.now()), not this process's.
   */
  runAt?: Date | Duration;
  /** Override the workflow's limits for this run. */
  maxSteps?: number;
  budget?: number;
  noProgress?: number;
}

/** `O` is the output as stored: `engine.start` gives `RunHandle<Jsonify<O>>` for a workflow returning `O`. */
export interface RunHandle<O> {
  readonly runId: string;
  /** Resolves with the output (its JSON form) when the run succeeds; rejects with RunFailedError when it ends any other way. */
  result(options?: { timeoutMs?: number }): Promise<O>;
}

export interface StartHost {
  deps: { pool: pg.Pool; maxPayloadBytes: number };
  registerWorkflow: (workflow: Workflow<any, any>) => Promise<void>;
  getRun: (runId: string, options?: { withSteps?: boolean }) => Promise<RunRecord | undefined>;
}

export async function startRun<O, In>(
  host: StartHost,
  workflow: Workflow<any, O, In>,
  input: In,
  options: StartOptions = {},
): Promise<RunHandle<Jsonify<O>>> {
  let stored: unknown = input;
  if (workflow.inputSchema) {
    const parsed = workflow.inputSchema.safeParse(input);
    if (!parsed.success) {
      throw new InvalidInputError(`input for workflow ${workflow.name} is invalid: ${parsed.error.message}`, {
        details: { issues: parsed.error.issues },
      });
    }
    stored = parsed.data;
  }
  let inputText: string | undefined;
  try {
    inputText = toJsonText(stored, `input of workflow ${workflow.name}`);
  } catch (error) {
    throw new InvalidInputError((error as Error).message, { cause: error });
  }
  const size = inputText === undefined ? 0 : Buffer.byteLength(inputText);
  if (size > host.deps.maxPayloadBytes) {
    throw new PayloadTooLargeError(`input for workflow ${workflow.name} is ${size} bytes, over the limit of ${host.deps.maxPayloadBytes}`, {
      details: { bytes: size, limit: host.deps.maxPayloadBytes },
    });
  }
  await host.registerWorkflow(workflow);

  const sqlOptions: Record<string, unknown> = {
    run_id: options.runId ?? ulid(),
    version: workflow.version,
    queue: options.queue ?? workflow.queue,
    max_recovery_attempts: workflow.maxRecoveryAttempts,
    version_manifest: RUNTIME_MANIFEST,
  };
  if (options.idempotencyKey !== undefined) sqlOptions.idempotency_key = options.idempotencyKey;
  if (options.priority !== undefined) {
    if (!Number.isInteger(options.priority)) throw new InvalidInputError('start: priority must be a whole number (lower runs first)');
    sqlOptions.priority = options.priority;
  }
  if (options.runAt !== undefined) {
    // A duration travels as a delay, so this process's clock plays no part in when the run starts.
    if (options.runAt instanceof Date) sqlOptions.run_at = options.runAt.toISOString();
    else sqlOptions.run_in_ms = Math.round(toMs(options.runAt, 'runAt'));
  }
  if (options.concurrencyKey !== undefined) sqlOptions.concurrency_key = options.concurrencyKey;
  Object.assign(sqlOptions, limitsToSql({ maxSteps: options.maxSteps, budget: options.budget, noProgress: options.noProgress }, 'start'));
  if (options.deadline !== undefined) {
    sqlOptions.deadline =
      options.deadline instanceof Date ? options.deadline.toISOString() : `${toMs(options.deadline, 'deadline')} milliseconds`;
  }
  let runId: string;
  try {
    const result = await host.deps.pool.query({
      name: 'runledger_start_run',
      text: 'select runledger.start_run(p_workflow => $1, p_input => $2::jsonb, p_options => $3::jsonb) as run_id',
      values: [workflow.name, inputText ?? null, JSON.stringify(sqlOptions)],
    });
    runId = result.rows[0].run_id;
  } catch (error) {
    throw fromPgError(error);
  }
  return { runId, result: (opts) => awaitResult<Jsonify<O>>(host, runId, opts?.timeoutMs) };
}

/**
 * Polls the run row with a growing interval (10 ms up to 500 ms) until it is
 * terminal. Polling keeps NOTIFY traffic off every completion's commit.
 */
export async function awaitResult<O>(host: StartHost, runId: string, timeoutMs = Infinity): Promise<O> {
  // A timeout of this caller's own: measured on its clock, never compared with the database's.
  const deadline = Date.now() + timeoutMs;
  for (let interval = 10; ; interval = Math.min(500, interval * 1.5)) {
    const run = await host.getRun(runId, { withSteps: false });
    if (!run) throw new RunFailedError(`run ${runId} not found`, { runId });
    if (TERMINAL_STATES.has(run.status)) {
      if (run.status === 'SUCCEEDED') return run.output as O;
      throw new RunFailedError(`run ${runId} ended ${run.status} (${run.terminationReason})${errorSuffix(run.error)}`, {
        runId,
        status: run.status,
        terminationReason: run.terminationReason,
        terminationEvidence: run.terminationEvidence,
        error: run.error,
      });
    }
    if (Date.now() + interval > deadline) {
      const served = run.status !== 'PENDING' || (await servedByLiveWorker(host.deps.pool, run.workflowName, run.workflowVersion));
      const key = `${run.workflowName}@${run.workflowVersion}`;
      throw new RunFailedError(
        `run ${runId} still ${run.status} after ${timeoutMs} ms` +
          (served ? '' : `: no live worker serves ${key} (runledger.workers); start a worker with this workflow defined`),
        { runId, status: run.status, ...(served ? {} : { noLiveWorker: key }) },
      );
    }
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}

/**
 * Whether a live worker (registered in runledger.workers, not stopped, heard from within
 * its lease on the database clock) serves this workflow version.
 */
async function servedByLiveWorker(pool: pg.Pool, name: string, version: string): Promise<boolean> {
  const result = await pool.query(
    `select exists (
       select 1 from runledger.workers
        where $1 = any (workflows) and stopped_at is null
          and last_heartbeat_at + make_interval(secs => lease_ms / 1000.0) > runledger.now()) as served`,
    [`${name}@${version}`],
  );
  return result.rows[0].served === true;
}

function errorSuffix(error: unknown): string {
  const message = (error as { message?: unknown } | null)?.message;
  return typeof message === 'string' ? `: ${message}` : '';
}
