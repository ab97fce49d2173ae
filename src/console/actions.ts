/**
 * The console's actions. Each is one call of the SQL function the CLI calls, through the
 * same TypeScript wrapper (src/engine/client/operator.ts, runs.ts, queues.ts), so a refusal
 * carries the same code the CLI prints (NOT_FOUND, INVALID_STATE, PERMISSION_DENIED ...).
 */
import type pg from 'pg';
import { decideApproval, cancelRun, forkRun, resolveOperation, sendSignal } from '../engine/client/operator.js';
import { retryRun } from '../engine/client/runs.js';
import { forkKeyWarnings, forkKeyWarningText } from '../engine/client/fork-keys.js';
import { setQueue, type QueueOptions } from '../engine/client/queues.js';
import type { Payloads } from '../engine/core/payloads.js';
import { unstorable } from './security.js';

export type Form = Record<string, string | undefined>;

/** A refusal decided here, before any SQL (a missing field, bad JSON), or an answer the CLI also refuses (ALREADY_DECIDED). */
export class ActionError extends Error {
  constructor(
    readonly code: string,
    message: string,
  ) {
    super(message);
  }
}

interface Action {
  run(pool: pg.Pool, form: Form, payloads: Payloads): Promise<string>;
}

const required = (form: Form, name: string): string => {
  const value = form[name]?.trim();
  if (!value) throw new ActionError('INVALID_INPUT', `${name} is required`);
  return value;
};

const optional = (form: Form, name: string): string | undefined => form[name]?.trim() || undefined;

function jsonField(form: Form, name: string): unknown {
  const raw = optional(form, name);
  if (raw === undefined) return undefined;
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (error) {
    throw new ActionError('INVALID_INPUT', `${name} is not valid JSON: ${(error as Error).message}`);
  }
  // An escape such as \u0000 or a lone \ud83d parses into what PostgreSQL's jsonb cannot hold.
  if (unstorable(value)) {
    throw new ActionError(
      'INVALID_INPUT',
      `${name} holds a NUL character or half of a UTF-16 surrogate pair, which PostgreSQL cannot store`,
    );
  }
  return value;
}

function intField(form: Form, name: string, min: number): number | null | undefined {
  const raw = form[name]?.trim();
  if (raw === undefined) return undefined;
  if (raw === '') return null;
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new ActionError('INVALID_INPUT', `${name} must be a whole number >= ${min}, got ${raw}`);
  return n;
}

export const ACTIONS: Record<string, Action> = {
  /** runledger.decide_approval; a different decision on a request already decided is ALREADY_DECIDED, as in `runledger approve`. */
  decide: {
    async run(pool, form, payloads) {
      const requestId = required(form, 'request_id');
      const decision = required(form, 'decision');
      if (decision !== 'approve' && decision !== 'reject') throw new ActionError('INVALID_INPUT', 'decision must be approve or reject');
      const approved = decision === 'approve';
      const decidedBy = required(form, 'by');
      const note = optional(form, 'note');
      const d = await decideApproval(pool, requestId, { approved, decidedBy, ...(note === undefined ? {} : { note }) }, payloads);
      if (d.approved === null) {
        const yes = (d.votes ?? []).filter((v) => v.approved).length;
        return d.recorded
          ? `${decidedBy}'s approval recorded: ${yes} of ${d.required} in, the run waits for the rest`
          : `${decidedBy} already decided: ${yes} of ${d.required} approvals in, nothing changed`;
      }
      const verdict = `${d.approved ? 'approved' : 'rejected'} by ${d.decidedBy}`;
      if (d.recorded) return `request ${requestId} ${verdict}; the run is woken and continues`;
      if (d.approved === approved) return `request ${requestId} was already ${verdict}: nothing changed`;
      throw new ActionError('ALREADY_DECIDED', `request ${requestId} was already ${verdict}; the first decision stands`);
    },
  },
  retry: {
    async run(pool, form) {
      const runId = required(form, 'run_id');
      const status = await retryRun(pool, runId);
      return `run ${runId} is ${status} again; a worker resumes it from its last checkpoint`;
    },
  },
  fork: {
    async run(pool, form) {
      const runId = required(form, 'run_id');
      const fromStep = intField(form, 'from_step', 0) ?? 0;
      const fork = await forkRun(pool, runId, fromStep, optional(form, 'version'));
      const warning = forkKeyWarningText(fork, runId, await forkKeyWarnings(pool, runId, fromStep));
      return `run ${runId} forked from step ${fromStep}: new run ${fork}${warning ? `. Warning: ${warning}` : ''}`;
    },
  },
  resolve: {
    async run(pool, form, payloads) {
      const operationId = required(form, 'operation_id');
      const status = required(form, 'status');
      if (status !== 'SUCCEEDED' && status !== 'FAILED') throw new ActionError('INVALID_INPUT', 'status must be SUCCEEDED or FAILED');
      const result = jsonField(form, 'result');
      const resolvedBy = optional(form, 'by');
      const settled = await resolveOperation(
        pool,
        operationId,
        { status, ...(result === undefined ? {} : { result }), ...(resolvedBy ? { resolvedBy } : {}) },
        payloads,
      );
      return `operation ${operationId} resolved as ${settled}`;
    },
  },
  cancel: {
    async run(pool, form) {
      const runId = required(form, 'run_id');
      const status = await cancelRun(pool, runId, optional(form, 'reason'));
      return `run ${runId} is ${status}`;
    },
  },
  signal: {
    async run(pool, form, payloads) {
      const runId = required(form, 'run_id');
      const topic = required(form, 'topic');
      const accepted = await sendSignal(pool, runId, topic, jsonField(form, 'payload') ?? null, undefined, payloads);
      return accepted ? `signal ${topic} sent to run ${runId}` : `signal ${topic} was already delivered: nothing changed`;
    },
  },
  /** runledger.set_queue: `paused` alone pauses or resumes; the limit fields, when sent, replace the limits (empty clears one). */
  queue: {
    async run(pool, form) {
      const name = required(form, 'name');
      const options: QueueOptions = {};
      if (form.paused !== undefined) options.paused = form.paused === 'true';
      const concurrency = intField(form, 'concurrency', 1);
      if (concurrency !== undefined) options.concurrency = concurrency;
      const perKey = intField(form, 'per_key', 1);
      if (perKey !== undefined) options.perKeyConcurrency = perKey;
      if (form.rate !== undefined) {
        const rate = form.rate.trim();
        const match = /^(\d+)\s*\/\s*(\d+)$/.exec(rate);
        if (rate !== '' && (!match || Number(match[1]) < 1 || Number(match[2]) < 1))
          throw new ActionError('INVALID_INPUT', `rate must be MAX/PERIOD_MS (e.g. 100/60000), got ${rate}`);
        options.rateLimit = match ? { max: Number(match[1]), periodMs: Number(match[2]) } : null;
      }
      const q = await setQueue(pool, name, options);
      return `queue ${q.name}: ${q.paused ? 'paused' : 'admitting'}; concurrency ${q.concurrency ?? 'none'}, per key ${
        q.perKeyConcurrency ?? 'none'
      }, rate ${q.rateLimitMax === null ? 'none' : `${q.rateLimitMax}/${q.rateLimitPeriodMs} ms`}`;
    },
  },
};

/** The code and message of a refusal, as the CLI prints them: `error [CODE]: message`. */
export function describeRefusal(thrown: unknown): { code: string; message: string; httpStatus: 400 | 403 | 404 | 409 | 500 } {
  const error = thrown as { code?: unknown; message?: unknown };
  let code = typeof error?.code === 'string' ? error.code : 'ERROR';
  let message = typeof error?.message === 'string' && error.message ? error.message : String(thrown);
  if (/^22[0-9A-Z]{3}$/.test(code)) {
    // A PostgreSQL data exception (class 22: a NUL, invalid text, a value out of range) is a refusal of the input.
    message = `${message} (SQLSTATE ${code})`;
    code = 'INVALID_INPUT';
  }
  const httpStatus =
    code === 'NOT_FOUND'
      ? 404
      : code === 'PERMISSION_DENIED' || code === 'NOT_ALLOWED'
        ? 403
        : code === 'INVALID_INPUT' || code === 'PAYLOAD_TOO_LARGE' || code === 'UNKNOWN_WORKFLOW'
          ? 400
          : code === 'INVALID_STATE' || code === 'ALREADY_DECIDED' || code === 'CONSTRAINT_VIOLATION'
            ? 409
            : 500;
  return { code, message, httpStatus };
}
