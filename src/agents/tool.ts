import { z, type ZodType } from 'zod';
import { ConfigError, StepFailedError } from '../engine/core/errors.js';
import { toMs, type Duration } from '../engine/core/duration.js';
import type { Jsonify } from '../engine/core/jsonify.js';
import { UNREADABLE, type Execution } from '../engine/run/execution.js';
import type { StepContext } from '../steps/context.js';
import { stepTimeoutMs } from '../steps/step.js';
import { checkRateLimitKey } from '../steps/rate-limit.js';
import { fromToolCall, type ReconcileAnswer } from '../steps/operation.js';
import { allowedByPolicy } from '../steps/policy.js';
import type { RetryPolicy } from '../steps/retry.js';
import { loadLarge } from './artifact.js';
import { encodeToolResult } from './tool-result.js';

/**
 * What a tool does to the world (the source document's side_effect and idempotency_mode):
 * - 'none': reads or computes only; a step (at least once until its checkpoint).
 * - 'idempotent': has an effect, and calling again with the same idempotency key is safe;
 *   through the operation ledger, an outcome lost in a crash is settled by calling again.
 * - 'external': has an effect that must not be repeated blindly; through the operation
 *   ledger, an outcome lost in a crash is settled by `reconcile`, else by an operator.
 */
export type SideEffect = 'none' | 'idempotent' | 'external';
export const SIDE_EFFECTS: readonly SideEffect[] = ['none', 'idempotent', 'external'];

export interface ToolRunInfo {
  runId: string;
  /** ctx.lineageId: the run this run's chain of forks started from (runId for a run never forked). */
  lineageId: string;
  /**
   * The call's idempotency key: pass it to the provider. Given (CallToolOptions), from the
   * tool's `idempotencyKey(args)`, or derived, `<runId>:<position>:<tool name>`, stable
   * across attempts and recoveries of this call.
   */
  idempotencyKey: string;
  /** Fires when the run is cancelled or this worker lost its lease. */
  signal: AbortSignal;
  /** 1 on the first attempt of this call; grows with retries. */
  attempt: number;
  /** Renews the run's lease from inside a long tool and records progress. */
  heartbeat: (progress?: unknown) => Promise<void>;
}

/** A tool as a model sees it: name, description and the JSON schema of its arguments. */
export interface ToolSpec {
  name: string;
  description: string;
  parameters: Record<string, unknown>;
}

/**
 * Why a tool call did not give a result, as the model is told:
 * - INVALID_TOOL_ARGUMENTS: the arguments failed the tool's schema (or were not JSON);
 * - UNKNOWN_TOOL: the model named a tool it was not offered (set by ctx.generate);
 * - TOOL_REJECTED: the approval it needs was refused, or expired undecided;
 * - TOOL_FAILED: the tool threw (after its retries), or its operation is FAILED in the ledger;
 * - DUPLICATE_TOOL_CALL: the run already called it under the same idempotency key.
 */
export type ToolErrorCode = 'INVALID_TOOL_ARGUMENTS' | 'UNKNOWN_TOOL' | 'TOOL_REJECTED' | 'TOOL_FAILED' | 'DUPLICATE_TOOL_CALL';

export interface ToolError {
  code: ToolErrorCode;
  message: string;
  details?: Record<string, unknown>;
}

/** What the model sees of a tool call: its result (stored JSON form), or why it did not run. */
export type ToolResult<R> = { ok: true; result: Jsonify<R> } | { ok: false; error: ToolError };

/** The tool contract: what `defineTool` takes. `A` is what `run` receives (the schema's output). */
export interface ToolDefinition<A, R> {
  /** What the model calls it: 1-64 letters, digits, '_' or '-' (function-calling names). */
  name: string;
  description: string;
  /** The arguments' schema (zod); its JSON schema is what the model is shown. */
  input: ZodType<A, any>;
  sideEffect: SideEffect;
  /** Asks for an approval (the arguments as evidence) before each call, or before the calls it returns true for. */
  needsApproval?: boolean | ((args: A) => boolean);
  /** Who may approve; default anyone. */
  approvers?: string[];
  /** How long an approval may wait; past it the call is TOOL_REJECTED. Default: as long as it takes. */
  approvalTimeout?: Duration;
  /**
   * The idempotency key from the arguments (e.g. `pr-${args.pr}-merge`): the effect happens
   * once for this key across the run, its recoveries and its forks. Default: one key per
   * call, `<runId>:<position>:<name>`. 'idempotent' and 'external' tools only.
   */
  idempotencyKey?: (args: A) => string;
  run(args: A, info: ToolRunInfo): Promise<R> | R;
  /** 'external': asks the provider what happened to a call whose outcome was lost (UNKNOWN in the ledger). */
  reconcile?: (info: { idempotencyKey: string; operationId: string; args: A }) => Promise<ReconcileAnswer<NoInfer<R>>>;
  /** Undoes a succeeded call if the run later fails or is cancelled (saga); recorded, never run twice. Its key is the call's + ':compensate'. */
  compensate?: (info: { result: Jsonify<R>; idempotencyKey: string; args: A; signal: AbortSignal }) => Promise<unknown> | unknown;
  /** The result's schema: an operator's resolve_operation result is checked against it. */
  output?: ZodType<R>;
  /** Names the external resource the call created, for the ledger. */
  externalResourceId?: (result: Jsonify<R>) => string | undefined;
  retry?: RetryPolicy;
  /**
   * How long one call may run; past it the call is aborted (STEP_TIMEOUT). A 'none' tool's
   * attempt fails into `retry`; a call with an effect may have happened: an 'idempotent' one is
   * called again within `retry`, an 'external' one is UNKNOWN in the ledger (`reconcile` or an
   * operator settles it), as after a crash.
   */
  timeout?: Duration;
  /** A shared rate limit key (engine.setRateLimit): each call waits for a permit on it, across every run and worker; a Retry-After pauses it for all. */
  rateLimit?: string;
  /** 'observe' (default): a failure is the observation TOOL_FAILED; 'throw': it fails the call (StepFailedError), so the run unless caught. */
  onError?: 'observe' | 'throw';
}

export interface Tool<A = unknown, R = unknown> extends Readonly<ToolDefinition<A, R>> {
  /** What generate offers the model. */
  readonly spec: ToolSpec;
}

export interface CallToolOptions {
  /** The operation's idempotency key; default the tool's `idempotencyKey(args)`, else derived from the run and the call's position. */
  idempotencyKey?: string;
  /** Step name; default `tool:<tool name>`. */
  name?: string;
}

/** Tool names as function calling takes them. */
export const TOOL_NAME_PATTERN = /^[A-Za-z0-9_-]{1,64}$/;

/** A tool: its contract checked, its JSON schema computed once. Bad definitions are ConfigErrors. */
export function defineTool<A, R>(tool: ToolDefinition<A, R>): Tool<A, R> {
  const what = `defineTool(${JSON.stringify(tool?.name)})`;
  if (typeof tool?.name !== 'string' || !TOOL_NAME_PATTERN.test(tool.name)) {
    throw new ConfigError(`${what}: the name must be 1-64 letters, digits, '_' or '-'`);
  }
  if (typeof tool.description !== 'string' || tool.description.trim() === '') throw new ConfigError(`${what}: a description is required`);
  if (typeof (tool.input as { safeParse?: unknown } | undefined)?.safeParse !== 'function') {
    throw new ConfigError(`${what}: input must be a zod schema`);
  }
  if (!SIDE_EFFECTS.includes(tool.sideEffect)) throw new ConfigError(`${what}: sideEffect must be one of ${SIDE_EFFECTS.join(', ')}`);
  if (typeof tool.run !== 'function') throw new ConfigError(`${what}: run must be a function`);
  for (const key of ['reconcile', 'compensate', 'idempotencyKey', 'externalResourceId'] as const) {
    if (tool[key] !== undefined && typeof tool[key] !== 'function') throw new ConfigError(`${what}: ${key} must be a function`);
    if (tool[key] !== undefined && tool.sideEffect === 'none') {
      throw new ConfigError(`${what}: ${key} is for tools with a side effect ('idempotent' or 'external'), not 'none'`);
    }
  }
  if (tool.needsApproval !== undefined && typeof tool.needsApproval !== 'boolean' && typeof tool.needsApproval !== 'function') {
    throw new ConfigError(`${what}: needsApproval must be a boolean or a function of the arguments`);
  }
  if (tool.approvers !== undefined && (!Array.isArray(tool.approvers) || tool.approvers.some((a) => typeof a !== 'string' || a === ''))) {
    throw new ConfigError(`${what}: approvers must be a list of names`);
  }
  if (tool.approvalTimeout !== undefined) toMs(tool.approvalTimeout, `${what}: approvalTimeout`);
  if (tool.timeout !== undefined) stepTimeoutMs(tool.timeout, `${what}: timeout`);
  checkRateLimitKey(tool.rateLimit, what);
  if (tool.onError !== undefined && tool.onError !== 'observe' && tool.onError !== 'throw') {
    throw new ConfigError(`${what}: onError must be 'observe' or 'throw'`);
  }
  let parameters: Record<string, unknown>;
  try {
    parameters = z.toJSONSchema(tool.input as z.ZodType, { io: 'input' }) as Record<string, unknown>;
  } catch (error) {
    throw new ConfigError(`${what}: its input schema has no JSON schema to show the model (${(error as Error).message})`, { cause: error });
  }
  delete parameters.$schema;
  return Object.freeze({ ...tool, spec: Object.freeze({ name: tool.name, description: tool.description, parameters }) });
}

/** A defined tool's spec, or a ConfigError for anything else. */
export function toolSpecOf(tool: unknown, what: string): ToolSpec {
  const spec = (tool as Tool | null)?.spec;
  if (!spec || typeof (tool as Tool).run !== 'function' || typeof spec.name !== 'string') {
    throw new ConfigError(`${what}: a tool must be made with defineTool`);
  }
  return spec;
}

/**
 * `ctx.callTool(tool, args)`: one call under the tool's contract. The arguments are checked
 * against the schema: a bad one is the observation INVALID_TOOL_ARGUMENTS, recorded as the
 * call's step (so replays line up, and the model's mistake shows in the run's timeline).
 * A tool that needs approval asks first (the arguments as evidence); a rejection or an
 * expiry is the observation TOOL_REJECTED. Then 'none' runs as a step, 'idempotent' and
 * 'external' as an operation with the call's idempotency key. A tool that throws is the
 * observation TOOL_FAILED, after the step's retries (onError: 'throw' fails the call
 * instead). An outcome lost in a crash is never an observation: the operation stays
 * UNKNOWN in the ledger and the run waits for reconcile or an operator.
 *
 * Each call is charged `{ toolCalls: 1 }` when its work first starts (before the tool
 * runs, the approval excepted), committed with the call's checkpoint; with no tool call
 * left in the budget the charge is written at once and ends the run before anything is
 * asked, recorded or called. A call whose checkpoint a crash lost is counted by its re-run.
 */
export async function callTool<A, R>(
  ctx: StepContext,
  exec: Execution,
  tool: Tool<A, R>,
  args: unknown,
  options: CallToolOptions = {},
): Promise<ToolResult<R>> {
  // No await before the first ctx call (but for a charge that ends the run): positions
  // are taken in the order the calls are made, as for every ctx call.
  toolSpecOf(tool, 'ctx.callTool');
  if (options.name !== undefined && (typeof options.name !== 'string' || options.name === '')) {
    throw new ConfigError(`ctx.callTool(${tool.name}): name must be a non-empty string`);
  }
  const name = options.name ?? `tool:${tool.name}`;
  let charged = false;
  // Called right before each ctx call whose body charges: a recorded position there means
  // an earlier execution ran that body, charge included.
  const chargedIfRecorded = () => {
    if (exec.checkpoints[exec.stepsTaken] !== undefined) charged = true;
  };
  const charge = async () => {
    if (charged) return;
    charged = true;
    // The call that would pass the limit ends the run before it runs (a write of its own,
    // with the evidence); any other is charged with the call's own checkpoint, at no
    // extra round trip.
    if ((ctx.budget.remaining().toolCalls ?? 1) < 1) await ctx.chargeNow({ toolCalls: 1 });
    else ctx.charge({ toolCalls: 1 });
  };
  // A fresh call (nothing recorded at its first position) with no tool call left: the
  // charge ends the run here, before an approval is asked or a ledger intent recorded.
  if (exec.checkpoints[exec.stepsTaken] === undefined && (ctx.budget.remaining().toolCalls ?? 1) < 1) await charge();

  const parsed = tool.input.safeParse(args);
  if (!parsed.success) {
    const issues = parsed.error.issues.map((issue) => `${issue.path.join('.') || '(arguments)'}: ${issue.message}`).join('; ');
    const observation: ToolResult<R> = {
      ok: false,
      error: { code: 'INVALID_TOOL_ARGUMENTS', message: `the arguments of ${tool.name} do not match its schema: ${issues}` },
    };
    chargedIfRecorded();
    return ctx.step(name, async () => {
      await charge();
      return observation;
    }) as Promise<ToolResult<R>>;
  }
  const data = parsed.data;
  const givenKey = businessKey(tool, data, options);
  // The workflow's policy, asked before the call's first position (its approval, key check or call) is taken.
  if (!allowedByPolicy(exec, { kind: 'tool', name: tool.name, args: data, sideEffect: tool.sideEffect })) return exec.suspend();

  if (typeof tool.needsApproval === 'function' ? tool.needsApproval(data) : tool.needsApproval) {
    const decision = await ctx.requestApproval(`${name}:approval`, {
      action: tool.name,
      evidence: { tool: tool.name, arguments: args, ...(givenKey ? { idempotencyKey: givenKey } : {}) },
      ...(tool.approvers ? { approvers: tool.approvers } : {}),
      ...(tool.approvalTimeout !== undefined ? { timeout: tool.approvalTimeout } : {}),
    });
    if (decision === null) {
      return {
        ok: false,
        error: { code: 'TOOL_REJECTED', message: `the approval of ${tool.name} expired undecided`, details: { expired: true } },
      };
    }
    if (!decision.approved) {
      const note = decision.note ? `: ${decision.note}` : '';
      return {
        ok: false,
        error: {
          code: 'TOOL_REJECTED',
          message: `${decision.decidedBy} rejected the call of ${tool.name}${note}`,
          details: { decidedBy: decision.decidedBy, note: decision.note, requestId: decision.requestId },
        },
      };
    }
  }

  if (tool.sideEffect === 'none') {
    const key = `${exec.runId}:${exec.stepsTaken}:${tool.name}`;
    chargedIfRecorded();
    return observed(
      ctx,
      tool,
      ctx.step(
        name,
        async (info) => {
          await charge();
          const value = await tool.run(data, {
            runId: exec.runId,
            lineageId: exec.lineageId,
            idempotencyKey: key,
            signal: info.signal,
            attempt: info.attempt,
            heartbeat: info.heartbeat,
          });
          return encodeToolResult(ctx, tool.name, value);
        },
        {
          ...(tool.retry ? { retry: tool.retry } : {}),
          ...(tool.timeout !== undefined ? { timeout: tool.timeout } : {}),
          ...(tool.rateLimit !== undefined ? { rateLimit: tool.rateLimit } : {}),
        },
      ),
    );
  }

  if (givenKey !== undefined) {
    // A key from the arguments can come again in this run (a model repeats a call): the
    // ledger allows one operation per key, so a repeat is told, not attempted.
    chargedIfRecorded();
    const earlier = await ctx.step(`${name}:key`, async () => {
      await charge();
      return earlierUse(exec, givenKey);
    });
    if (earlier) {
      return {
        ok: false,
        error: {
          code: 'DUPLICATE_TOOL_CALL',
          message: `${tool.name} was already called in this run with idempotency key ${JSON.stringify(givenKey)} (step ${earlier.seq}, ${earlier.status}); one key stands for one effect, so it is not called again`,
          details: { idempotencyKey: givenKey, ...earlier },
        },
      };
    }
  }
  const key = givenKey ?? `${exec.runId}:${exec.stepsTaken}:${tool.name}`;
  const reconcile = tool.reconcile;
  const compensate = tool.compensate;
  chargedIfRecorded();
  return observed(
    ctx,
    tool,
    ctx.operation<unknown>(
      name,
      fromToolCall<unknown>({
        idempotencyKey: key,
        idempotent: tool.sideEffect === 'idempotent',
        ...(tool.retry ? { retry: tool.retry } : {}),
        ...(tool.rateLimit !== undefined ? { rateLimit: tool.rateLimit } : {}),
        ...(tool.timeout !== undefined ? { timeout: tool.timeout } : {}),
        ...(tool.output ? { result: tool.output } : {}),
        ...(tool.externalResourceId ? { externalResourceId: tool.externalResourceId as (result: unknown) => string | undefined } : {}),
        ...(reconcile
          ? {
              reconcile: async ({ idempotencyKey, operationId }) => {
                const answer = await reconcile({ idempotencyKey, operationId, args: data });
                if (answer?.status !== 'succeeded') return answer;
                return { ...answer, result: await encodeToolResult(ctx, tool.name, answer.result) };
              },
            }
          : {}),
        ...(compensate
          ? {
              compensate: ({ result, idempotencyKey, signal }) =>
                compensate({ result: result as Jsonify<R>, idempotencyKey, args: data, signal }),
            }
          : {}),
      }),
      async (info) => {
        await charge();
        const value = await tool.run(data, {
          runId: exec.runId,
          lineageId: exec.lineageId,
          idempotencyKey: info.idempotencyKey,
          signal: info.signal,
          attempt: info.attempt,
          heartbeat: info.heartbeat,
        });
        return encodeToolResult(ctx, tool.name, value);
      },
    ),
  );
}

function businessKey<A>(tool: Tool<A, any>, args: A, options: CallToolOptions): string | undefined {
  if (options.idempotencyKey !== undefined) {
    if (tool.sideEffect === 'none') {
      throw new ConfigError(`ctx.callTool(${tool.name}): an idempotency key is for tools with a side effect, not 'none'`);
    }
    if (typeof options.idempotencyKey !== 'string' || options.idempotencyKey === '') {
      throw new ConfigError(`ctx.callTool(${tool.name}): idempotencyKey must be a non-empty string`);
    }
    return options.idempotencyKey;
  }
  if (!tool.idempotencyKey) return undefined;
  const key = tool.idempotencyKey(args);
  if (typeof key !== 'string' || key === '') {
    throw new ConfigError(`tool ${tool.name}: idempotencyKey(args) returned ${JSON.stringify(key)}, not a non-empty string`);
  }
  return key;
}

/** The operation of this run that used `key` already, if one did (index: operations (run_id, seq)). */
async function earlierUse(
  exec: Execution,
  key: string,
): Promise<{ operationId: string; seq: number; status: string; result: unknown } | null> {
  const found = await exec.deps.pool.query(
    'select operation_id, seq, status, result from runledger.operations where run_id = $1 and idempotency_key = $2 order by seq limit 1',
    [exec.runId, key],
  );
  const row = found.rows[0];
  if (!row) return null;
  // A result this worker cannot decode halts the execution (the run is given back), like every payload read.
  const result = exec.readable(() => exec.payloads.decode(row.result));
  if (result === UNREADABLE) return exec.suspend();
  return { operationId: row.operation_id, seq: row.seq, status: row.status, result };
}

/**
 * A tool's own failure as its observation. Not observed: errors that are not the tool's
 * step failing (a bad call, the run stopping), a reconcile that answered nonsense (the
 * ledger stays UNKNOWN: the model must not try the effect again under a new key), and
 * tools declared onError: 'throw'.
 */
/** The call's result for the model (a large result read back from its artifact), or its failure as an observation. */
async function observed<R>(ctx: StepContext, tool: Tool<any, R>, call: Promise<unknown>): Promise<ToolResult<R>> {
  try {
    return { ok: true, result: (await loadLarge(ctx, await call)) as Jsonify<R> };
  } catch (error) {
    if (!(error instanceof StepFailedError) || error.originalCode === 'INVALID_RECONCILE_ANSWER' || tool.onError === 'throw') throw error;
    const recorded = (error.details ?? {}) as { message?: string };
    return {
      ok: false,
      error: {
        code: 'TOOL_FAILED',
        message: `${tool.name} failed: ${recorded.message ?? error.message}`,
        details: { errorName: error.originalName, ...(error.originalCode !== undefined ? { errorCode: error.originalCode } : {}) },
      },
    };
  }
}
