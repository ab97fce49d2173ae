import type { Transaction } from 'kysely';
import type { Duration } from '../engine/core/duration.js';
import type { Execution } from '../engine/run/execution.js';
import type { Workflow } from '../engine/core/workflow.js';
import type { Jsonify } from '../engine/core/jsonify.js';
import * as waits from './waits.js';

import { runStep, type StepFunction, type StepOptions } from './step.js';
import { runOperation, type OperationFunction, type OperationOptions } from './operation.js';
import { runExec, type ExecOptions, type ExecResult } from './exec.js';
import { heartbeatCurrent } from './heartbeat.js';
import { runTransaction, type TransactionFunction } from './transaction.js';
import { openStream, type DurableStream } from './stream.js';
import { recordProgress, type ProgressResult, type ProgressSignals } from './progress.js';
import { chargeNow, remainingBudget } from './charge.js';
import { deprecatePatch, patched } from './patch.js';
import { toBudgetAmounts, type BudgetAmounts, type BudgetRemaining } from '../engine/core/budget.js';
import type { RedactSource } from '../engine/core/redaction.js';

/**
 * The step API of a workflow's context (the agent API is added on top of it by
 * src/agents/context.ts, whose WorkflowContext is what a workflow function receives):
 * explicit, no globals. Each call takes the
 * next step position; on replay a position with a checkpoint returns the
 * recorded result without running anything.
 *
 * Results come back in their stored JSON form, `Jsonify<T>` (a Date as its ISO string,
 * a class instance as its plain fields), on the first execution as on every replay.
 * `DB` is the Kysely database interface of `createEngine<DB>()`; it types `trx` in
 * `transaction`.
 */
export class StepContext<DB = any> {
  readonly #exec: Execution;

  constructor(exec: Execution) {
    this.#exec = exec;
  }

  /**
   * The execution behind this context, for the layers built on the step API
   * (src/agents reads its run's session and writes its stream through it). Not for
   * workflow code: it is not part of the documented ctx.
   */
  protected get execution(): Execution {
    return this.#exec;
  }

  /**
   * This run's id. A fork (fork_run) gets a new one; a retry keeps it. An idempotency key made
   * from it is new in a fork, so the fork calls the operation again: a second effect.
   */
  get runId(): string {
    return this.#exec.runId;
  }

  /**
   * The id of the run this run's chain of forks started from: the same in the run, in its
   * retries and recoveries, and in every fork of it (and fork of a fork); `runId` for a run
   * that was never forked. Make idempotency keys, and the keys of your own rows, from it
   * (`charge-${ctx.lineageId}`) when an effect must happen once however often the run is
   * forked: a fork then reuses the effect its source recorded. See docs/operations.md#forks-and-idempotency-keys.
   */
  get lineageId(): string {
    return this.#exec.lineageId;
  }

  /**
   * The fencing token this execution holds the run under (a decimal string of a bigint): it
   * grows each time a worker takes the run. A system of your own can refuse a write that
   * carries a lower token than the last one it saw, so an execution that lost its lease (a
   * stalled worker still running) cannot write after the one that replaced it.
   */
  get fencingToken(): string {
    return this.#exec.fencingToken.toString();
  }

  /** 1 for the first execution of the run; +1 for every recovery after a lost lease. */
  get attempt(): number {
    return this.#exec.attempt;
  }

  /** The run's environment manifest (the workflow's `environment`), once made or replayed; undefined without one. */
  get environment(): unknown {
    return this.#exec.environment;
  }

  /** Fires when the run is cancelled or this worker lost its lease. */
  get abortSignal(): AbortSignal {
    return this.#exec.abortController.signal;
  }

  /**
   * The value of secret `name`, from the engine's `secrets` resolver. Not a step: resolved
   * afresh by each execution (once per name; a recovered run resolves it again), never
   * checkpointed, logged or put in an error. A payload the run would write that holds it
   * is refused with SECRET_IN_PAYLOAD. See docs/security.md#secret-references.
   */
  secret(name: string): Promise<string> {
    return this.#exec.secret(name);
  }

  /** Runs `fn` at least once until its result is checkpointed, never again after; `retry` re-runs it on failure with backoff. */
  step<T>(name: string, fn: StepFunction<T>, options?: StepOptions): Promise<Jsonify<T>> {
    return this.#observed(
      { root: 'step', name },
      this.#exec.track('step', name, () => runStep(this.#exec, name, fn, options)),
    ) as Promise<Jsonify<T>>;
  }

  /**
   * An external side effect through the operation ledger: the intent and its
   * idempotency key commit before `fn` runs; the outcome commits with the checkpoint.
   * An outcome lost in a crash is UNKNOWN and settled by `reconcile`, by calling an
   * `idempotent` operation again with the same key, or by an operator.
   */
  operation<T>(name: string, options: OperationOptions<T>, fn: OperationFunction<T>): Promise<Jsonify<T>> {
    return this.#observed(
      { root: 'step', name },
      this.#exec.track('operation', name, () => runOperation(this.#exec, name, options, fn)),
    );
  }

  /**
   * Runs a child process as a step, in a process group of its own: on cancel, the run's
   * deadline, the attempt's `timeout` or a lost lease the group gets SIGTERM, then SIGKILL
   * after `grace` (default 5 s), and a cancelled run ends only once the kill is confirmed.
   * The result (exit code or signal, output tails, duration) is checkpointed; a non-zero exit
   * code is a result, not a failure. At least once, like a step.
   */
  exec(name: string, options: ExecOptions): Promise<ExecResult> {
    return this.#observed(
      { root: 'step', name },
      this.#exec.track('exec', name, () => runExec(this.#exec, name, options)),
    );
  }

  /** Inside a long step: renews the run's lease and records progress for an attempt that takes over. */
  heartbeat(progress?: unknown): Promise<void> {
    this.#exec.assertLive('ctx.heartbeat()');
    return heartbeatCurrent(this.#exec, progress);
  }

  /**
   * Runs `fn` inside one database transaction that also checks the fencing token
   * and writes the checkpoint: the writes made through `trx` happen exactly once.
   * `trx` is a `Transaction<DB>` of the engine's `DB` (or of `D`, when given).
   */
  transaction<T, D = DB>(name: string, fn: TransactionFunction<T, D>): Promise<Jsonify<T>> {
    return this.#observed(
      { root: 'step', name },
      this.#exec.track('transaction', name, () => runTransaction<T, D>(this.#exec, name, fn as (trx: Transaction<D>) => Promise<T>)),
    ) as Promise<Jsonify<T>>;
  }

  /** Waits until the duration has passed (or the date is reached), holding no worker. */
  sleep(name: string, duration: Duration | Date): Promise<void> {
    return this.#exec.track('sleep', name, () => waits.sleep(this.#exec, name, duration));
  }

  /**
   * Consumes exactly one signal sent to this run on `topic`; null if `timeout` passes first.
   * `T` is what senders pass; the payload arrives in its JSON form, `Jsonify<T>`.
   */
  waitForSignal<T = unknown>(topic: string, options?: waits.WaitForSignalOptions): Promise<Jsonify<T> | null> {
    return this.#observed(
      { root: 'signal', topic },
      this.#exec.track('waitForSignal', options?.name ?? topic, () => waits.waitForSignal<Jsonify<T>>(this.#exec, topic, options)),
    );
  }

  /** Asks a person to approve `action`; the decision, or null when the request expires undecided. */
  requestApproval(name: string, request: waits.ApprovalRequest): Promise<waits.ApprovalDecision | null> {
    return this.#exec.track('requestApproval', name, () => waits.requestApproval(this.#exec, name, request));
  }

  /** Starts a child run without waiting for it; its id is checkpointed with the child's creation. `input`: the schema's input type. */
  startChild<In>(workflow: Workflow<any, any, In>, input: In, options?: waits.ChildOptions): Promise<{ runId: string }> {
    return this.#exec.track('startChild', `${options?.name ?? `child:${workflow?.name}`}:start`, () =>
      waits.startChild(this.#exec, this.#exec.deps.registerWorkflow, workflow, input, options),
    );
  }

  /** Waits, holding nothing, for a child run started with startChild; its output, or ChildFailedError. */
  waitForChild<O = unknown>(childRunId: string, options: { name?: string } = {}): Promise<Jsonify<O>> {
    return this.#exec.track('waitForChild', options.name ?? `child:${childRunId}`, () =>
      waits.waitForChild<Jsonify<O>>(this.#exec, childRunId, options.name),
    );
  }

  /** Starts a child run and waits for it: its output (JSON form), or ChildFailedError when it did not succeed. */
  runChild<I, O, In>(workflow: Workflow<I, O, In>, input: In, options: waits.ChildOptions = {}): Promise<Jsonify<O>> {
    return this.#exec.track('runChild', options.name ?? `child:${workflow?.name}`, async () => {
      const { runId } = await this.startChild(workflow, input, options);
      return this.waitForChild<O>(runId, { name: options.name ?? `child:${workflow.name}` });
    });
  }

  /**
   * Charges budget units (tokens, money...). They commit with the next checkpoint (the
   * step they were charged in, usually); past the run's budget, that checkpoint ends the
   * run TERMINATED with reason BUDGET, and no further step starts.
   */
  charge(amount: number | BudgetAmounts): void {
    this.#exec.assertLive('ctx.charge()');
    this.#exec.addPendingCharge(toBudgetAmounts(amount, 'charge'));
  }

  /**
   * Charges and commits at once (its own fenced write), for spending a crash before the
   * next checkpoint must not lose: a model's usage, reported by the provider, is charged
   * so. Past a limit the run ends TERMINATED (BUDGET) and this call never returns.
   */
  chargeNow(amount: number | BudgetAmounts): Promise<void> {
    this.#exec.assertLive('ctx.chargeNow()');
    return chargeNow(this.#exec, toBudgetAmounts(amount, 'chargeNow'));
  }

  /**
   * The run's budgets: `ctx.budget.remaining()` per dimension (null where there is no
   * limit), as claimed plus this execution's charges, pending ones counted.
   */
  get budget(): { remaining(): BudgetRemaining } {
    const exec = this.#exec;
    return { remaining: () => remainingBudget(exec) };
  }

  /** A durable stream of this run (`write` chunks, `close`), read live by engine.readStream. */
  stream(topic: string): DurableStream {
    this.#exec.assertLive('ctx.stream()');
    return openStream(this.#exec, topic);
  }

  /**
   * Records what changed in this round (hashes of the observation, artifact, plan, state):
   * a checkpointed step. The workflow's noProgress limit counts rounds in a row that
   * brought nothing new; at the limit `onNoProgress` is called once, and the run ends
   * NO_PROGRESS if the next rounds bring nothing new either.
   */
  progress(signals: ProgressSignals): Promise<ProgressResult> {
    return this.#exec.track('progress', 'progress', () => recordProgress(this.#exec, signals));
  }

  /**
   * A change without a new version: `if (await ctx.patched('fix-1234')) { new } else { old }`
   * is true for runs that reach this point with the patch deployed (recorded as the marker
   * `@patch:fix-1234`), false on the replay of runs that passed it before. See docs/versions.md.
   */
  patched(id: string): Promise<boolean> {
    return this.#exec.track('patched', id, () => patched(this.#exec, id));
  }

  /** Once no run from before the patch can replay (runledger.patches): keeps the new code only, and replays runs that took the patch. */
  deprecatePatch(id: string): Promise<void> {
    return this.#exec.track('deprecatePatch', id, () => deprecatePatch(this.#exec, id));
  }

  /**
   * The values the workflow's redact paths select in a ctx call's result, noted before the
   * workflow's code sees it (the handler is attached before the promise is handed back).
   */
  #observed<T>(source: RedactSource, promise: Promise<T>): Promise<T> {
    const exec = this.#exec;
    if (exec.redaction)
      promise.then(
        (value) => exec.observe(source, value),
        () => undefined,
      );
    return promise;
  }

  /** The current time, recorded once and replayed: deterministic across recoveries. */
  now(name = 'now'): Promise<Date> {
    return this.#exec.track('now', name, async () => new Date(await runStep(this.#exec, `@${name}`, () => new Date().toISOString())));
  }
}
