import type { ZodType } from 'zod';
import { ConfigError } from './errors.js';
import { toMs, type Duration } from './duration.js';
import { toBudgetAmounts, toSqlLimits, type BudgetAmounts } from './budget.js';
import { RUNTIME_MANIFEST } from './version.js';
import { toJsonText } from './json.js';
import { checkMigrations, type MigrateFunction } from './migration.js';
import { Redaction } from './redaction.js';
import type { WorkflowContext } from './workflow-context.js';
import type { PolicyFunction } from './policy.js';
import type { EnvironmentSpec } from './environment.js';

/** Workflow, queue and version names: safe in task identifiers and never spliced into SQL. */
export const NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$/;
export const QUEUE_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$/;
export const VERSION_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$/;
export const MAX_RECOVERY_ATTEMPTS_DEFAULT = 10;
export const QUEUE_DEFAULT = 'default';

export interface WorkflowLimits {
  /** Wall-clock lifetime from creation ('2d', ms), enforced while waiting too. */
  deadline?: Duration;
  /** Steps (turns) a run may take, waits included. */
  maxSteps?: number;
  /**
   * What a run may spend: a number of units (ctx.charge(n)), or per dimension
   * `{ units, tokens, costUsd, toolCalls, turns }`. Past any of them the run ends
   * TERMINATED (BUDGET), the evidence naming the dimension.
   */
  budget?: number | BudgetAmounts;
  /**
   * N: the same step returning the same result N times in a row stops the run; so do N
   * rounds in a row of ctx.progress that bring nothing new (after onNoProgress, if any).
   */
  noProgress?: number;
  /** Retries all steps of a run may spend together; past it a failing step fails at once. */
  retryBudget?: number;
}

/** Validates limits and converts them to the SQL options start_run and the workflows table take. */
export function limitsToSql(limits: WorkflowLimits, what: string): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  if (limits.deadline !== undefined) out.deadline = `${toMs(limits.deadline, `${what}: deadline`)} milliseconds`;
  if (limits.maxSteps !== undefined) {
    if (!Number.isInteger(limits.maxSteps) || limits.maxSteps < 1) throw new ConfigError(`${what}: maxSteps must be a whole number >= 1`);
    out.max_steps = limits.maxSteps;
  }
  if (limits.budget !== undefined) {
    if (typeof limits.budget === 'number') {
      if (!Number.isFinite(limits.budget) || limits.budget < 0) throw new ConfigError(`${what}: budget must be a number >= 0`);
      out.budget = limits.budget;
    } else {
      out.budget = toSqlLimits(toBudgetAmounts(limits.budget, `${what}: budget`));
    }
  }
  if (limits.noProgress !== undefined) {
    if (!Number.isInteger(limits.noProgress) || limits.noProgress < 2)
      throw new ConfigError(`${what}: noProgress must be a whole number >= 2`);
    out.no_progress = limits.noProgress;
  }
  if (limits.retryBudget !== undefined) {
    if (!Number.isInteger(limits.retryBudget) || limits.retryBudget < 0)
      throw new ConfigError(`${what}: retryBudget must be a whole number >= 0`);
    out.retry_budget = limits.retryBudget;
  }
  return out;
}

/**
 * `I` is what the workflow function receives: the schema's output type (`z.output`).
 * `In` is what `engine.start`, `startChild` and `runChild` accept: the schema's input type
 * (`z.input`), so a field with `.default()` may be left out. Without a schema both are the
 * type of the function's `input` parameter.
 */
export interface WorkflowOptions<I, In = I> {
  name: string;
  /** Runs are pinned to the version they started with; default '1'. */
  version?: string;
  /**
   * What this version depends on, free-form JSON (`{ agent: '12', prompt: 'p7', tools: { git: 'v3' } }`):
   * stored on each run at start under `manifest` in its version manifest, beside the runtime
   * and checkpoint schema versions the engine adds. At most MAX_MANIFEST_BYTES of JSON.
   */
  manifest?: Record<string, unknown>;
  /**
   * How runs of older versions continue on this one, by the version they come from:
   * `{ '1': ({ input, checkpoints, manifest }) => ({ input, checkpoints }) }`. A worker
   * serving this version applies them to runs an operator marks with migrate_run.
   */
  migrations?: Record<string, MigrateFunction>;
  /** Validated before a run is stored (bad input: INVALID_INPUT, nothing stored) and again when a run started from SQL is claimed. */
  input?: ZodType<I, In>;
  queue?: string;
  /** Recoveries after a lost lease before the run is dead-lettered; default 10. */
  maxRecoveryAttempts?: number;
  limits?: WorkflowLimits;
  /**
   * Checks the output before the run may succeed: `{ ok: true, evidence }` commits SUCCEEDED
   * with the evidence in the termination record; `{ ok: false, reason }` ends the run FAILED
   * with reason UNVERIFIED. It runs as workflow code after the function returns (its ctx
   * calls are checkpointed as usual); its verdict is recorded as the step `@verify`.
   */
  verify?: VerifyFunction<I>;
  /**
   * Called once when `limits.noProgress` rounds in a row brought nothing new (ctx.progress),
   * to re-plan or reduce the tools; the run ends NO_PROGRESS only if the next
   * `noProgress` rounds bring nothing new either. Without it, the run ends at the limit.
   */
  onNoProgress?: (ctx: WorkflowContext, evidence: NoProgressEvidence) => Promise<void> | void;
  /**
   * Paths of values kept out of what the engine copies from the run's data: log lines,
   * stored errors, termination and approval evidence, events (replaced with "[redacted]").
   * Rooted where the data comes from: `input.card.number`, `output.token`,
   * `steps.charge.result.card`, `signals.reply.payload.email`; `*` is any one key or array
   * element. The run's own input, checkpoints and output are stored as they are. See
   * docs/security.md#redaction.
   */
  redact?: string[];
  /**
   * Asked before each tool call, operation and ctx.exec is first taken: nothing (or true)
   * allows it; `{ refuse: reason, evidence? }` ends the run TERMINATED with the reason POLICY
   * and the action, reason and evidence as its record, distinct from FAILED. Synchronous (no
   * I/O); a policy that throws refuses. See docs/termination.md#policy.
   */
  policy?: PolicyFunction;
  /**
   * The run's execution environment: made once per run (`create`, checkpointed as the step
   * `@environment`), rebuilt on a worker that lacks it (`rehydrate`), released when the run
   * finishes whatever its status (`reclaim`). `ctx.environment` is its manifest. See
   * docs/environments.md.
   */
  environment?: EnvironmentSpec<any>;
}

function checkEnvironment(environment: EnvironmentSpec | undefined, name: string): void {
  if (environment === undefined) return;
  if (typeof environment !== 'object' || environment === null)
    throw new ConfigError(`workflow ${name}: environment must be { create, rehydrate?, reclaim }`);
  for (const key of ['create', 'reclaim'] as const) {
    if (typeof environment[key] !== 'function') throw new ConfigError(`workflow ${name}: environment.${key} must be a function`);
  }
  if (environment.rehydrate !== undefined && typeof environment.rehydrate !== 'function')
    throw new ConfigError(`workflow ${name}: environment.rehydrate must be a function`);
}

export type Verdict = { ok: true; evidence?: unknown } | { ok: false; reason: string; evidence?: unknown };

/** `output` is what the workflow returned, in its stored JSON form. */
export type VerifyFunction<I = unknown> = (output: unknown, ctx: WorkflowContext, input: I) => Promise<Verdict> | Verdict;

export interface NoProgressEvidence {
  /** Rounds in a row without anything new. */
  rounds: number;
  limit: number;
  /** Step positions of those rounds' ctx.progress calls. */
  positions: number[];
}

/** `DB` types `trx` in `ctx.transaction`: the Kysely database interface given to `createEngine<DB>()`. */
export type WorkflowFunction<I, O, DB = any> = (ctx: WorkflowContext<DB>, input: I) => Promise<O>;

/**
 * A defined workflow. `I`: what its function receives; `O`: what it returns (callers get
 * `Jsonify<O>`, the stored JSON form); `In`: what starting it takes (see WorkflowOptions).
 */
export interface Workflow<I = unknown, O = unknown, In = I> {
  readonly name: string;
  readonly version: string;
  readonly queue: string;
  readonly maxRecoveryAttempts: number;
  readonly inputSchema: ZodType<I, In> | undefined;
  readonly limits: WorkflowLimits;
  readonly fn: WorkflowFunction<I, O>;
  readonly verify: VerifyFunction<I> | undefined;
  /** The version manifest its runs start with: runtime, checkpoint schema, workflow@version and the user's manifest. */
  readonly versionManifest: Readonly<Record<string, unknown>>;
  /** Migrations into this version, by the version a run comes from. */
  readonly migrations: ReadonlyMap<string, MigrateFunction>;
  readonly onNoProgress: WorkflowOptions<I, In>['onNoProgress'];
  readonly policy: PolicyFunction | undefined;
  readonly environment: EnvironmentSpec<any> | undefined;
  /** The redact paths, compiled; undefined for none. */
  readonly redaction: Redaction | undefined;
}

export function defineWorkflow<I, O, In = I, DB = any>(
  options: WorkflowOptions<I, In>,
  fn: WorkflowFunction<I, O, DB>,
): Workflow<I, O, In> {
  if (typeof options?.name !== 'string' || !NAME_PATTERN.test(options.name)) {
    throw new ConfigError(`workflow name ${JSON.stringify(options?.name)} is invalid: 1-50 characters of letters, digits, '_', '.', '-'`);
  }
  const version = options.version ?? '1';
  if (!VERSION_PATTERN.test(version)) {
    throw new ConfigError(
      `workflow ${options.name}: version ${JSON.stringify(version)} is invalid: 1-20 characters of letters, digits, '_', '.', '-'`,
    );
  }
  const queue = options.queue ?? QUEUE_DEFAULT;
  if (!QUEUE_PATTERN.test(queue)) {
    throw new ConfigError(
      `workflow ${options.name}: queue ${JSON.stringify(queue)} is invalid: 1-40 characters of letters, digits, '_', '.', '-'`,
    );
  }
  const maxRecoveryAttempts = options.maxRecoveryAttempts ?? MAX_RECOVERY_ATTEMPTS_DEFAULT;
  if (!Number.isInteger(maxRecoveryAttempts) || maxRecoveryAttempts < 0) {
    throw new ConfigError(`workflow ${options.name}: maxRecoveryAttempts must be a whole number >= 0`);
  }
  if (typeof fn !== 'function') throw new ConfigError(`workflow ${options.name}: the second argument must be the workflow function`);
  const manifest = checkManifest(options.manifest, options.name);
  const migrations = checkMigrations(options.migrations, options.name, version, VERSION_PATTERN);
  if (options.verify !== undefined && typeof options.verify !== 'function')
    throw new ConfigError(`workflow ${options.name}: verify must be a function`);
  if (options.onNoProgress !== undefined && typeof options.onNoProgress !== 'function')
    throw new ConfigError(`workflow ${options.name}: onNoProgress must be a function`);
  if (options.policy !== undefined && typeof options.policy !== 'function')
    throw new ConfigError(`workflow ${options.name}: policy must be a function`);
  checkEnvironment(options.environment, options.name);
  limitsToSql(options.limits ?? {}, `workflow ${options.name}`);
  const redaction = Redaction.compile(options.redact, `workflow ${options.name}`);
  return Object.freeze({
    name: options.name,
    version,
    queue,
    maxRecoveryAttempts,
    inputSchema: options.input,
    limits: Object.freeze({ ...(options.limits ?? {}) }),
    fn,
    verify: options.verify,
    onNoProgress: options.onNoProgress,
    policy: options.policy,
    environment: options.environment,
    redaction,
    migrations,
    versionManifest: Object.freeze({
      ...RUNTIME_MANIFEST,
      workflow: workflowKey(options.name, version),
      ...(manifest === undefined ? {} : { manifest }),
    }),
  });
}

/** The largest manifest accepted, as JSON text: it is copied onto every run. */
export const MAX_MANIFEST_BYTES = 16 * 1024;

/** A manifest must be a plain JSON object, at most MAX_MANIFEST_BYTES; ConfigError otherwise. Returns its JSON form. */
function checkManifest(manifest: unknown, name: string): Record<string, unknown> | undefined {
  if (manifest === undefined) return undefined;
  if (manifest === null || typeof manifest !== 'object' || Array.isArray(manifest)) {
    throw new ConfigError(`workflow ${name}: manifest must be an object, not ${Array.isArray(manifest) ? 'an array' : String(manifest)}`);
  }
  let text: string | undefined;
  try {
    text = toJsonText(manifest, `workflow ${name}: manifest`);
  } catch (error) {
    throw new ConfigError(`workflow ${name}: manifest can't be stored as JSON: ${(error as Error).message}`, { cause: error });
  }
  const bytes = Buffer.byteLength(text ?? '');
  if (bytes > MAX_MANIFEST_BYTES)
    throw new ConfigError(`workflow ${name}: manifest is ${bytes} bytes of JSON, over the limit of ${MAX_MANIFEST_BYTES}`);
  return JSON.parse(text!) as Record<string, unknown>;
}

export function workflowKey(name: string, version: string): string {
  return `${name}@${version}`;
}
