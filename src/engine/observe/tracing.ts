/**
 * OpenTelemetry traces (docs/observability.md#traces). `@opentelemetry/api` is an optional
 * peer dependency: it is loaded lazily, once, and without it every hook here is a no-op.
 * With it, spans go to the tracer provider given as the engine option `tracerProvider`, or
 * else to the one the application registered globally; nothing is ever registered here.
 * While no provider records, an execution gets no trace object at all (the first span it
 * opens says it does not record), so the engine's hot path pays one noop span per execution.
 *
 * Spans: `runledger.run <workflow>` per execution of a run, parented by the traceparent the
 * run was started under (runs.traceparent), so every execution of one run, after crashes and
 * on other workers, is in one trace, and linked to the previous execution's span
 * (runs.execution_traceparent); `runledger.step <name>` and `runledger.operation <name>` per
 * attempt, as its children; `runledger.group_commit` per batch, linked to the runs it served.
 */
import { createRequire } from 'node:module';
import type * as OtelApi from '@opentelemetry/api';
import { RUNTIME_VERSION } from '../core/version.js';

/** What runledger needs of a tracer provider (an OpenTelemetry TracerProvider). */
export interface TracerProviderLike {
  getTracer(name: string, version?: string): unknown;
}

/** A span's identity, as a link target: the parts of an OpenTelemetry SpanContext runledger reads. */
export interface SpanRef {
  traceId: string;
  spanId: string;
  traceFlags: number;
}

/** The run row fields a claim returns that the execution span describes. */
export interface TracedRun {
  run_id: string;
  workflow_name: string;
  workflow_version: string;
  fencing_token: string;
  traceparent?: string | null;
  execution_traceparent?: string | null;
}

export const TRACER_NAME = 'runledger';
const TRACEPARENT = /^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;
const ZERO_TRACE = '0'.repeat(32);
const ZERO_SPAN = '0'.repeat(16);

type Api = typeof OtelApi;
let loaded: Api | null | undefined;

/** `@opentelemetry/api`, or null when it is not installed (loaded once, synchronously). */
function otel(): Api | null {
  if (loaded === undefined) {
    try {
      loaded = createRequire(import.meta.url)('@opentelemetry/api') as Api;
    } catch {
      loaded = null;
    }
  }
  return loaded;
}

/** True for a W3C traceparent of version 00 with non-zero ids (what runledger._is_traceparent accepts). */
export function isTraceparent(value: unknown): value is string {
  if (typeof value !== 'string') return false;
  const match = TRACEPARENT.exec(value);
  return match !== null && match[1] !== ZERO_TRACE && match[2] !== ZERO_SPAN;
}

/** A span context as a W3C traceparent (what the W3C propagator injects). */
export function toTraceparent(span: SpanRef): string {
  return `00-${span.traceId}-${span.spanId}-${(span.traceFlags & 0xff).toString(16).padStart(2, '0')}`;
}

function fromTraceparent(value: string | null | undefined): SpanRef | undefined {
  if (!isTraceparent(value)) return undefined;
  const [, traceId, spanId, flags] = TRACEPARENT.exec(value)!;
  return { traceId: traceId!, spanId: spanId!, traceFlags: parseInt(flags!, 16) };
}

/**
 * The traceparent of the caller's active span (context.active()), or undefined when there
 * is none, or no OpenTelemetry api: what engine.start stores on the run.
 */
export function activeTraceparent(): string | undefined {
  const api = otel();
  if (!api) return undefined;
  const span = api.trace.getSpanContext(api.context.active());
  if (!span || !api.isSpanContextValid(span)) return undefined;
  return toTraceparent(span);
}

/** An error as a span records it: an Error as the exception, anything else by its message. */
function recordError(api: Api, span: OtelApi.Span, error: unknown): void {
  const message = error instanceof Error ? error.message : typeof error === 'string' ? error : JSON.stringify(error);
  span.recordException(error instanceof Error ? error : { name: 'Error', message });
  span.setStatus({ code: api.SpanStatusCode.ERROR, message });
}

/** The span of one execution of a run, and the spans of its steps (declared without the api's types: it is optional). */
export interface ExecutionTrace {
  /** This execution's span, as a link target (group commits link to it). */
  readonly ref: SpanRef;
  /** This execution's span as a traceparent (stored in runs.execution_traceparent, and given to child runs). */
  readonly traceparent: string;
  /** Runs fn with this execution's span active (the workflow function: the application's own spans nest under it). */
  within<T>(fn: () => T): T;
  /**
   * One attempt of a step or operation in a child span `runledger.<kind> <name>`, active
   * while fn runs (the application's spans inside the step nest under it); ERROR if fn throws.
   */
  child<T>(kind: 'step' | 'operation' | 'transaction', name: string, seq: number, attempt: number, fn: () => Promise<T> | T): Promise<T>;
  /** A point in the execution, as an event on its span (a wait that parks the run, a wait that ended at once...). */
  event(name: string, attributes: Record<string, string | number | boolean>): void;
  /** The run fails (or is dead-lettered) in this execution: ERROR, with the error recorded. */
  fail(error: unknown): void;
  /** The execution is over (completed, parked, released, lost its lease): `outcome` says how; 'failed' once fail() was called. */
  end(outcome: string): void;
}

/** The span of one batch (group commit). */
export interface BatchTrace {
  /** The batch's transaction answered: with the error that failed it, or how many runs a claim riding on it took. */
  end(error?: unknown, claimed?: number): void;
}

/** An engine's tracing: its tracer, from the given provider or the global one. */
export class Tracing {
  private constructor(
    private readonly api: Api,
    private readonly provider: TracerProviderLike | undefined,
  ) {}

  /** The engine's tracing, or undefined without `@opentelemetry/api` (every hook is then skipped). */
  static create(provider?: TracerProviderLike): Tracing | undefined {
    const api = otel();
    return api ? new Tracing(api, provider) : undefined;
  }

  /** Asked per execution, so a provider the application registers after createEngine is used. */
  private tracer(): OtelApi.Tracer {
    return (
      (this.provider?.getTracer(TRACER_NAME, RUNTIME_VERSION) as OtelApi.Tracer | undefined) ??
      this.api.trace.getTracer(TRACER_NAME, RUNTIME_VERSION)
    );
  }

  /**
   * The span of one execution of a claimed run, under the traceparent it was started with
   * and linked to the previous execution's span; undefined while nothing records.
   */
  startExecution(run: TracedRun, attempt: number): ExecutionTrace | undefined {
    const { api } = this;
    const parent = fromTraceparent(run.traceparent);
    const parentContext = parent ? api.trace.setSpanContext(api.ROOT_CONTEXT, { ...parent, isRemote: true }) : api.ROOT_CONTEXT;
    const previous = fromTraceparent(run.execution_traceparent);
    const tracer = this.tracer();
    const span = tracer.startSpan(
      `runledger.run ${run.workflow_name}`,
      {
        kind: api.SpanKind.CONSUMER,
        attributes: {
          'runledger.run_id': run.run_id,
          'runledger.workflow': run.workflow_name,
          'runledger.version': run.workflow_version,
          'runledger.attempt': attempt,
          'runledger.fencing_token': run.fencing_token,
        },
        ...(previous ? { links: [{ context: previous, attributes: { 'runledger.link': 'previous_execution' } }] } : {}),
      },
      parentContext,
    );
    if (!span.isRecording()) return undefined;
    return new ExecutionSpan(api, tracer, span, api.trace.setSpan(parentContext, span));
  }

  /** The span of one group commit of `size` items, linked to the execution spans it wrote for; undefined while nothing records. */
  startGroupCommit(size: number, links: SpanRef[], claims: boolean): BatchTrace | undefined {
    const { api } = this;
    const span = this.tracer().startSpan(
      'runledger.group_commit',
      {
        kind: api.SpanKind.CLIENT,
        attributes: { 'runledger.batch_size': size, 'runledger.claims': claims },
        links: links.map((context) => ({ context })),
      },
      api.ROOT_CONTEXT,
    );
    if (!span.isRecording()) return undefined;
    return new BatchSpan(api, span);
  }
}

class BatchSpan implements BatchTrace {
  constructor(
    private readonly api: Api,
    private readonly span: OtelApi.Span,
  ) {}

  end(error?: unknown, claimed?: number): void {
    if (error !== undefined) recordError(this.api, this.span, error);
    if (claimed !== undefined) this.span.setAttribute('runledger.claimed', claimed);
    this.span.end();
  }
}

class ExecutionSpan implements ExecutionTrace {
  private failed = false;
  private ended = false;

  constructor(
    private readonly api: Api,
    private readonly tracer: OtelApi.Tracer,
    private readonly span: OtelApi.Span,
    private readonly context: OtelApi.Context,
  ) {}

  /** This execution's span, as a link target (group commits link to it). */
  get ref(): SpanRef {
    return this.span.spanContext();
  }

  /** This execution's span as a traceparent (stored in runs.execution_traceparent, and given to child runs). */
  get traceparent(): string {
    return toTraceparent(this.span.spanContext());
  }

  /** Runs fn with this execution's span active (the workflow function: the application's own spans nest under it). */
  within<T>(fn: () => T): T {
    return this.api.context.with(this.context, fn);
  }

  /**
   * One attempt of a step or operation in a child span `runledger.<kind> <name>`, active
   * while fn runs (the application's spans inside the step nest under it); ERROR if fn throws.
   */
  async child<T>(
    kind: 'step' | 'operation' | 'transaction',
    name: string,
    seq: number,
    attempt: number,
    fn: () => Promise<T> | T,
  ): Promise<T> {
    const span = this.tracer.startSpan(
      `runledger.${kind} ${name}`,
      { attributes: { 'runledger.step': name, 'runledger.step_kind': kind, 'runledger.seq': seq, 'runledger.attempt': attempt } },
      this.context,
    );
    try {
      return await this.api.context.with(this.api.trace.setSpan(this.context, span), fn);
    } catch (error) {
      recordError(this.api, span, error);
      throw error;
    } finally {
      span.end();
    }
  }

  /** A point in the execution, as an event on its span (a wait that parks the run, a wait that ended at once...). */
  event(name: string, attributes: Record<string, string | number | boolean>): void {
    this.span.addEvent(name, attributes);
  }

  /** The run fails (or is dead-lettered) in this execution: ERROR, with the error recorded. */
  fail(error: unknown): void {
    if (this.failed) return;
    this.failed = true;
    recordError(this.api, this.span, error);
  }

  /** The execution is over (completed, parked, released, lost its lease): `outcome` says how; 'failed' once fail() was called. */
  end(outcome: string): void {
    if (this.ended) return;
    this.ended = true;
    this.span.setAttribute('runledger.outcome', this.failed ? 'failed' : outcome);
    this.span.end();
  }
}
