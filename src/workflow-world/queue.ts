/**
 * The World's queue on runledger: each message the Workflow SDK queues is a run of the
 * runledger workflow 'workflow-world', so runledger's queue limits (concurrency, per-key
 * concurrency, rate), leases, recovery and dead letters apply to it, and an operator sees and
 * repairs it from psql and the console like any run. The run delivers the message to the app's
 * handler over HTTP (POST /.well-known/workflow/v1/flow, as the SDK's own worlds do); when the
 * handler answers { timeoutSeconds }, the run sleeps durably (holding no worker) and delivers
 * it again.
 */
import { WorkflowWorldError } from '@workflow/errors';
import { MessageId, parseQueueName, type Queue, type QueuePayload, type ValidQueueName } from '@workflow/world';
import type pg from 'pg';
import { monotonicFactory } from 'ulid';
import type { Engine, Workflow } from '../index.js';
import { decodeValue, encodeValue } from './codec.js';
import { inTransaction } from './transaction.js';
import { invalid, storable } from './invalid.js';

/** The runledger workflow whose runs deliver the SDK's messages. */
export const DELIVERY_WORKFLOW = 'workflow-world';

/** What a delivery run holds: the message (its JSON, with the codec's tags) and where it goes. */
export interface DeliveryInput {
  queueName: string;
  messageId: string;
  /** The SDK run the message is for (the view workflow_world_runs groups deliveries by it). */
  runId: string | null;
  stepId: string | null;
  idempotencyKey: string | null;
  headers: Record<string, string> | null;
  body: string;
}

export interface QueueConfig {
  /** The runledger queue the deliveries run on. */
  queue: string;
  /** Where the app's handlers listen; read at each delivery (an app may learn its port late). */
  baseUrl: () => string | undefined;
  /** Attempts of one delivery before its run fails (then runledger retry, or the dead-letter view). */
  deliveryAttempts: number;
}

interface Reply {
  timeoutSeconds?: number;
}

/** Terminal runledger statuses: a delivery in any other is still live (its idempotency key taken). */
const ENDED = `('SUCCEEDED', 'FAILED', 'CANCELLED', 'DEAD_LETTER', 'TERMINATED')`;

function handlerPath(queueName: string): 'flow' | 'step' {
  return parseQueueName(queueName as ValidQueueName).kind === 'workflow' ? 'flow' : 'step';
}

/** POSTs the message to the app's handler; a non-2xx answer throws (the step's retry policy decides). */
async function deliver(config: QueueConfig, message: DeliveryInput, attempt: number, signal: AbortSignal): Promise<Reply> {
  const base = config.baseUrl();
  if (!base)
    throw new WorkflowWorldError(
      'runledger/workflow-world: no URL to deliver to: set WORKFLOW_RUNLEDGER_BASE_URL (or PORT, for http://localhost:$PORT), or createWorld({ baseUrl })',
      { code: 'CONFIG' },
    );
  const url = `${base.replace(/\/+$/, '')}/.well-known/workflow/v1/${handlerPath(message.queueName)}`;
  const response = await fetch(url, {
    method: 'POST',
    headers: {
      ...(message.headers ?? {}),
      'content-type': 'application/json',
      'x-vqs-queue-name': message.queueName,
      'x-vqs-message-id': message.messageId,
      'x-vqs-message-attempt': String(attempt),
    },
    body: message.body,
    signal,
  });
  const text = await response.text();
  if (!response.ok) throw new Error(`${url} answered ${response.status}: ${text.slice(0, 500)}`);
  try {
    const timeoutSeconds = Number((JSON.parse(text) as Reply).timeoutSeconds);
    if (Number.isFinite(timeoutSeconds) && timeoutSeconds >= 0) return { timeoutSeconds };
  } catch {
    // Not JSON: a plain acknowledgement.
  }
  return {};
}

/**
 * The delivery workflow: deliver, and while the handler asks to be called again later, sleep
 * that long (a durable timer: no worker held) and deliver again. Each delivery is a step with
 * retries, so an app that is down is tried again with backoff, and a worker that dies mid-
 * delivery is replaced (the SDK's handlers are idempotent: its event log dedupes).
 */
export function defineDelivery(engine: Engine, config: QueueConfig): Workflow<DeliveryInput, { deliveries: number }> {
  return engine.workflow({ name: DELIVERY_WORKFLOW, queue: config.queue }, async (ctx, message: DeliveryInput) => {
    for (let delivery = 1; ; delivery++) {
      const reply = await ctx.step(`deliver-${delivery}`, ({ signal }) => deliver(config, message, delivery, signal), {
        retry: { maxAttempts: config.deliveryAttempts, initialDelayMs: 1_000, maxDelayMs: 60_000 },
      });
      if (reply.timeoutSeconds === undefined) return { deliveries: delivery };
      if (reply.timeoutSeconds > 0) await ctx.sleep(`redeliver-${delivery}`, Math.round(reply.timeoutSeconds * 1000));
    }
  });
}

/**
 * Queue.queue: starts a delivery run. A message with an idempotency key is dropped while a
 * delivery with that key is live (queued, running or sleeping), and queued again once it
 * ended: the lifetime the SDK expects of a key. The check and the start are one transaction
 * under an advisory lock on the key, so two senders of one key start one delivery.
 */
export function createEnqueue(pool: pg.Pool, config: QueueConfig, ready: () => Promise<void>): Queue['queue'] {
  const ulid = monotonicFactory();
  return async (queueName, message, opts) => {
    await ready();
    const payload = message as QueuePayload & { runId?: string; workflowRunId?: string; stepId?: string };
    const messageId = MessageId.parse(`msg_${ulid()}`);
    const input: DeliveryInput = {
      queueName,
      messageId,
      runId: payload.runId ?? payload.workflowRunId ?? null,
      stepId: payload.stepId ?? null,
      idempotencyKey: opts?.idempotencyKey ?? null,
      headers: opts?.headers ?? null,
      body: encodeValue(message) ?? 'null',
    };
    const delaySeconds = opts?.delaySeconds ?? 0;
    if (typeof delaySeconds !== 'number' || !Number.isFinite(delaySeconds) || delaySeconds < 0)
      throw invalid(`delaySeconds must be a number >= 0, got ${String(delaySeconds)}`);
    // The delivery's input is jsonb: its names and keys must be strings jsonb holds (the message itself is JSON text in it).
    for (const field of ['queueName', 'runId', 'stepId', 'idempotencyKey', 'headers'] as const) storable(field, input[field]);
    const options: Record<string, unknown> = { queue: config.queue };
    if (delaySeconds > 0) options.run_in_ms = Math.round(delaySeconds * 1000);
    // Invocations of one SDK run (not its background steps) share a concurrency key, for a
    // queue whose perKeyConcurrency is 1 to take them one at a time as the SDK's Postgres world does.
    if (input.runId && !input.stepId) options.concurrency_key = input.runId;
    const live = await inTransaction(pool, async (tx) => {
      if (input.idempotencyKey) {
        await tx.query(`select pg_advisory_xact_lock(hashtextextended('workflow-world:' || $1, 0))`, [input.idempotencyKey]);
        const { rows } = await tx.query<{ message_id: string }>(
          `select input ->> 'messageId' as message_id from runledger.runs
            where workflow_name = '${DELIVERY_WORKFLOW}' and input ->> 'idempotencyKey' = $1 and status not in ${ENDED} limit 1`,
          [input.idempotencyKey],
        );
        if (rows[0]) return rows[0].message_id;
      }
      await tx.query(`select runledger.start_run(p_workflow => $1, p_input => $2::jsonb, p_options => $3::jsonb)`, [
        DELIVERY_WORKFLOW,
        JSON.stringify(input),
        JSON.stringify(options),
      ]);
      return undefined;
    });
    return { messageId: live === undefined ? messageId : MessageId.parse(live) };
  };
}

/** The headers a delivery carries (x-vqs-*), as the SDK's queue handlers read them. */
function messageHeaders(req: Request): { queueName: string; messageId: string; attempt: number } | undefined {
  const queueName = req.headers.get('x-vqs-queue-name');
  const messageId = req.headers.get('x-vqs-message-id');
  const attempt = Number(req.headers.get('x-vqs-message-attempt'));
  if (!queueName || !messageId || !Number.isInteger(attempt) || attempt < 1) return undefined;
  return { queueName, messageId, attempt };
}

/**
 * Queue.createQueueHandler: the app's side of a delivery. Reads the message, calls the SDK's
 * handler, and answers { timeoutSeconds } (deliver again after that long) or { ok: true }; a
 * handler that throws is a 500, which the delivery run retries.
 */
export const createQueueHandler: Queue['createQueueHandler'] = (prefix, handler) => async (req: Request) => {
  const headers = messageHeaders(req);
  if (!headers || !req.body)
    return Response.json({ error: req.body ? 'Missing required x-vqs-* headers' : 'Missing request body' }, { status: 400 });
  if (!headers.queueName.startsWith(prefix)) return Response.json({ error: `Unhandled queue ${headers.queueName}` }, { status: 400 });
  let body: unknown;
  try {
    body = decodeValue(await req.text());
  } catch (error) {
    return Response.json({ error: `The message is not JSON: ${String(error)}` }, { status: 400 });
  }
  try {
    const result = await handler(body, {
      attempt: headers.attempt,
      queueName: headers.queueName as ValidQueueName,
      messageId: MessageId.parse(headers.messageId),
    });
    const timeoutSeconds = (result as Reply | undefined | void)?.timeoutSeconds;
    return typeof timeoutSeconds === 'number' ? Response.json({ timeoutSeconds }) : Response.json({ ok: true });
  } catch (error) {
    return Response.json({ error: String(error) }, { status: 500 });
  }
};
