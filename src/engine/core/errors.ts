/**
 * Every error runledger raises is a RunledgerError with a stable `code`. The SQL
 * functions raise the same codes as SQLSTATEs (RL001...), and `fromPgError` maps
 * them back, so a failure reads the same from TypeScript and from psql.
 */
import { storableText } from './storable.js';

export type ErrorCode =
  | 'LEASE_LOST'
  | 'NOT_FOUND'
  | 'INVALID_INPUT'
  | 'PAYLOAD_TOO_LARGE'
  | 'INVALID_STATE'
  | 'UNKNOWN_WORKFLOW'
  | 'NON_DETERMINISM'
  | 'OUTPUT_NOT_SERIALIZABLE'
  | 'SCHEMA_TOO_NEW'
  | 'CONFIG'
  | 'RUN_FAILED'
  | 'STEP_FAILED'
  | 'NOT_IN_WORKFLOW'
  | 'NOT_ALLOWED'
  | 'PERMISSION_DENIED'
  | 'CHILD_FAILED'
  | 'NON_RETRYABLE'
  | 'NOT_IN_STEP'
  | 'MIGRATION_MISMATCH'
  | 'CONSTRAINT_VIOLATION'
  | 'STEP_NOT_AWAITED'
  | 'INVALID_RECONCILE_ANSWER'
  | 'UNVERIFIED'
  | 'INVALID_VERDICT'
  | 'AGENT_INCOMPLETE'
  | 'MODEL_ERROR'
  | 'SESSION_NOT_HELD'
  | 'SESSION_TIMEOUT'
  | 'STEP_TIMEOUT'
  | 'RETRY_AFTER'
  | 'MIGRATION_FAILED'
  | 'SECRET_IN_PAYLOAD'
  | 'SECRET_NOT_FOUND'
  | 'PAYLOAD_KEY_MISSING'
  | 'PAYLOAD_UNREADABLE';

export class RunledgerError extends Error {
  readonly code: ErrorCode;
  readonly details: Record<string, unknown> | undefined;

  constructor(code: ErrorCode, message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = new.target.name;
    this.code = code;
    this.details = options.details;
  }
}

export class LeaseLostError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('LEASE_LOST', message, options);
  }
}
export class NotFoundError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('NOT_FOUND', message, options);
  }
}
export class InvalidInputError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('INVALID_INPUT', message, options);
  }
}
export class PayloadTooLargeError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('PAYLOAD_TOO_LARGE', message, options);
  }
}
export class InvalidStateError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('INVALID_STATE', message, options);
  }
}
export class UnknownWorkflowError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('UNKNOWN_WORKFLOW', message, options);
  }
}
export class NonDeterminismError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('NON_DETERMINISM', message, { details });
  }
}
/** A run migration failed: the workflow's migrate threw or returned what cannot be written. The run was left as it was. */
export class MigrationFailedError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('MIGRATION_FAILED', message, options);
  }
}
/**
 * A stored payload is encrypted with a key the engine's codec does not have (createEngine's
 * `codec`): `details.keyId` names it. Nothing was changed: configure the key and read again.
 */
export class PayloadKeyMissingError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('PAYLOAD_KEY_MISSING', message, options);
  }
}
/** A stored payload could not be decoded: its envelope does not authenticate (changed, or another key under its id), or the codec threw. */
export class PayloadUnreadableError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('PAYLOAD_UNREADABLE', message, options);
  }
}
/** The workflow's verify refused its output: the run ends FAILED, termination reason UNVERIFIED. */
export class UnverifiedError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('UNVERIFIED', message, { details });
  }
}
/** verify returned something that is not `{ ok: true, evidence? }` or `{ ok: false, reason }`. */
export class InvalidVerdictError extends RunledgerError {
  constructor(message: string) {
    super('INVALID_VERDICT', message);
  }
}
/** A value that cannot be stored: not JSON (bigint, cycle...), or a text PostgreSQL refuses (NUL, lone surrogate, SQLSTATE class 22). */
export class NotSerializableError extends RunledgerError {
  constructor(message: string, options: { cause?: unknown; details?: Record<string, unknown> } = {}) {
    super('OUTPUT_NOT_SERIALIZABLE', message, options);
  }
}
export class SchemaTooNewError extends RunledgerError {
  constructor(message: string) {
    super('SCHEMA_TOO_NEW', message);
  }
}
export class ConfigError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('CONFIG', message, options);
  }
}
export class NotInWorkflowError extends RunledgerError {
  constructor(message: string) {
    super('NOT_IN_WORKFLOW', message);
  }
}

/**
 * The workflow function returned (or threw) while a ctx call it started was still in
 * flight: a step, operation or wait that was not awaited. The run fails with it;
 * `details.calls` names each call and its step position.
 */
export class StepNotAwaitedError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>, options: { cause?: unknown } = {}) {
    super('STEP_NOT_AWAITED', message, { details, ...options });
  }
}

export class NotAllowedError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('NOT_ALLOWED', message, options);
  }
}

/**
 * The database refused the connection's role (SQLSTATE 42501): a function or table its
 * runledger role is not granted (docs/security.md), or, with tenant isolation on, an
 * action on what every tenant shares.
 */
export class PermissionDeniedError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown }) {
    super('PERMISSION_DENIED', message, options);
  }
}

/** What `ctx.runChild` throws when the child run did not succeed; the same on every replay. */
export class ChildFailedError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('CHILD_FAILED', message, { details });
  }
}

/**
 * Throw it (or an error with `nonRetryable: true`) from a step or operation to fail
 * it at once, whatever its retry policy says.
 */
export class NonRetryableError extends RunledgerError {
  readonly nonRetryable = true;
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('NON_RETRYABLE', message, options);
  }
}

/** A run ended FAILED (or another non-success terminal state); `details` holds the stored error and record. */
export class RunFailedError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('RUN_FAILED', message, { details });
  }
}

/** What a failed step rethrows on replay: the recorded name, message and code of the original error. */
export class StepFailedError extends RunledgerError {
  readonly originalName: string;
  readonly originalCode: unknown;
  constructor(message: string, recorded: SerializedError) {
    super('STEP_FAILED', message, { details: { ...recorded } });
    this.originalName = recorded.name;
    this.originalCode = recorded.code;
  }
}

/**
 * A `reconcile` of `ctx.operation` answered something other than the three shapes it may
 * answer. The operation stays UNKNOWN in the ledger; the operation step fails with it.
 */
export class InvalidReconcileAnswerError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('INVALID_RECONCILE_ANSWER', message, { details });
  }
}

/**
 * A session call (`append`, `history`, `release`) on a session this run does not hold:
 * released by it, taken from it by an operator (runledger.release_session), or never
 * opened. Nothing was stored. SQL raises it as RL005 from runledger._session_append.
 */
export class SessionNotHeldError extends RunledgerError {
  constructor(message: string, options?: { cause?: unknown; details?: Record<string, unknown> }) {
    super('SESSION_NOT_HELD', message, options);
  }
}

/** `ctx.session(id, { timeout })`: another run held the session for longer than the timeout; this run left the queue. */
export class SessionTimeoutError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('SESSION_TIMEOUT', message, { details });
  }
}

/** A step's attempt ran past its `timeout`: it was aborted (its signal fired) and failed into the step's retry policy. */
export class StepTimeoutError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('STEP_TIMEOUT', message, { details });
  }
}

/**
 * A payload the run was about to write (a step, transaction or operation result, the run's
 * output, a stream chunk, a session entry, approval evidence, a child's input, heartbeat
 * progress, an artifact, an idempotency key) contains the value of a secret this execution
 * resolved with ctx.secret. Nothing of it was stored. `details.secret` names the secret
 * (never its value), `details.payload` the write. Not retried: the same code returns the
 * same value again.
 */
export class SecretInPayloadError extends RunledgerError {
  readonly nonRetryable = true;
  constructor(message: string, details: { secret: string; payload: string }) {
    super('SECRET_IN_PAYLOAD', message, { details });
  }
}

/**
 * ctx.secret(name): the engine's `secrets` resolver has no secret of that name (it
 * answered undefined or null), or it threw (the cause). `details.secret` names it.
 */
export class SecretNotFoundError extends RunledgerError {
  constructor(message: string, options: { cause?: unknown; details: { secret: string } }) {
    super('SECRET_NOT_FOUND', message, options);
  }
}

/**
 * migrate() found a migration applied to the database whose text differs from this
 * build's file of the same number: the database was migrated by a different build.
 */
export class MigrationMismatchError extends RunledgerError {
  constructor(message: string, details: Record<string, unknown>) {
    super('MIGRATION_MISMATCH', message, { details });
  }
}

/**
 * A write of a step (an operation's ledger row, a transaction's commit) broke a
 * database constraint (SQLSTATE class 23, e.g. 23505 unique_violation). Running it
 * again would break it again, so it is not an infrastructure failure: the run ends
 * FAILED with this error, recorded in its `failed` event. `details` has the
 * `sqlstate`, `constraint`, `detail` and `step`.
 */
export class ConstraintViolationError extends RunledgerError {
  constructor(message: string, options: { cause?: unknown; details: Record<string, unknown> }) {
    super('CONSTRAINT_VIOLATION', message, options);
  }
}

export interface SerializedError {
  name: string;
  message: string;
  code?: unknown;
  stack?: string;
}

/**
 * Every SQLSTATE the SQL functions raise, in one table: the error table of docs/errors.md
 * and sql/ are checked against it (test/contracts.test.ts). The first seven reach
 * callers as RunledgerError classes; the last three are answers to the worker about
 * a run it executes, handled in run/halts.ts, never shown to callers.
 */
export const SQLSTATES = {
  RL001: { code: 'LEASE_LOST', meaning: 'a write with a stale fencing token, or for a run that is no longer executing' },
  RL002: { code: 'NOT_FOUND', meaning: 'an unknown run, approval request, operation or child run' },
  RL003: { code: 'INVALID_INPUT', meaning: 'a bad argument to a SQL function' },
  RL004: { code: 'PAYLOAD_TOO_LARGE', meaning: 'an input or signal payload over the size limit' },
  RL005: { code: 'INVALID_STATE', meaning: 'the run, request or operation is not in a state that allows this' },
  RL006: { code: 'UNKNOWN_WORKFLOW', meaning: 'a workflow (or version) that no engine or worker has registered' },
  RL007: { code: 'NOT_ALLOWED', meaning: 'a decision by someone who is not an approver' },
  RL008: { code: null, meaning: 'a step that started after the cancel request tries to record its result' },
  RL009: { code: null, meaning: "a write after the run's deadline" },
  RL010: { code: null, meaning: 'a checkpoint for a position that already has one' },
} as const satisfies Record<string, { code: ErrorCode | null; meaning: string }>;

export type Sqlstate = keyof typeof SQLSTATES;

/** The named SQLSTATEs the worker reacts to (run/halts.ts, run/finish.ts). */
export const SQLSTATE = {
  LEASE_LOST: 'RL001',
  CANCEL_REQUESTED: 'RL008',
  PAST_DEADLINE: 'RL009',
  CHECKPOINT_EXISTS: 'RL010',
} as const satisfies Record<string, Sqlstate>;

const CLASS_OF_CODE: Partial<Record<ErrorCode, new (message: string, options?: { cause?: unknown }) => RunledgerError>> = {
  LEASE_LOST: LeaseLostError,
  NOT_FOUND: NotFoundError,
  INVALID_INPUT: InvalidInputError,
  PAYLOAD_TOO_LARGE: PayloadTooLargeError,
  INVALID_STATE: InvalidStateError,
  UNKNOWN_WORKFLOW: UnknownWorkflowError,
  NOT_ALLOWED: NotAllowedError,
};

/** PostgreSQL's own SQLSTATE for a role refused a function or table (runledger's roles, sql/0014_security.sql). */
const INSUFFICIENT_PRIVILEGE = '42501';

/** Maps a pg error raised by a runledger SQL function to its RunledgerError; other errors pass through. */
export function fromPgError(error: unknown): unknown {
  const code = (error as { code?: unknown } | null)?.code;
  if (code === INSUFFICIENT_PRIVILEGE) return new PermissionDeniedError((error as Error).message, { cause: error });
  if (typeof code === 'string' && code in SQLSTATES) {
    const Class = CLASS_OF_CODE[SQLSTATES[code as Sqlstate].code ?? ('' as ErrorCode)];
    if (Class) return new Class((error as Error).message, { cause: error });
  }
  return error;
}

/** Normalises anything thrown into an Error. */
export function coerceError(thrown: unknown): Error {
  if (thrown instanceof Error) return thrown;
  return new Error(typeof thrown === 'string' ? thrown : `non-error thrown: ${safeString(thrown)}`);
}

/**
 * An error as stored. Its texts are diagnostics, kept rather than refused: a character
 * PostgreSQL cannot store (NUL, a lone surrogate) becomes U+FFFD (core/storable.ts), so a
 * thrown message holding one still records why the step or run failed.
 */
export function serializeError(thrown: unknown): SerializedError {
  const error = coerceError(thrown);
  const code = (error as { code?: unknown }).code;
  return {
    name: storableText(String(error.name)),
    message: storableText(String(error.message)),
    ...(code === undefined ? {} : { code: typeof code === 'number' ? code : storableText(String(code)) }),
    ...(error.stack === undefined ? {} : { stack: storableText(String(error.stack)) }),
  };
}

function safeString(value: unknown): string {
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}
