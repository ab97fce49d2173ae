export { createEngine, MAX_PAYLOAD_BYTES_DEFAULT } from './engine/index.js';
export type {
  Engine,
  EngineOptions,
  LogFunction,
  LogLevel,
  LogOption,
  Logger,
  MeterProviderLike,
  SecretResolver,
  TracerProviderLike,
} from './engine/index.js';
export { REDACTED } from './engine/core/redaction.js';
/** Why a string cannot be stored in PostgreSQL (a NUL, a lone surrogate), or undefined: for adapters that check their input. */
export { unstorableReason } from './engine/core/storable.js';
export { defineWorkflow } from './engine/core/workflow.js';
export { aesGcmCodec, isAesGcmEnvelope } from './engine/core/codec.js';
export type { AesGcmCodecOptions, AesGcmEnvelope, JsonValue, PayloadCodec } from './engine/core/codec.js';
export type {
  Workflow,
  WorkflowFunction,
  WorkflowLimits,
  WorkflowOptions,
  Verdict,
  VerifyFunction,
  NoProgressEvidence,
} from './engine/core/workflow.js';
export { BUDGET_DIMENSIONS } from './engine/core/budget.js';
export type { BudgetAmounts, BudgetDimension, BudgetRemaining } from './engine/core/budget.js';
export type { ProgressResult, ProgressSignals } from './steps/progress.js';
export type { RunHandle, StartManyOptions, StartOptions } from './engine/client/start.js';
export type { ListRunsOptions, OperationRecord, RunRecord, StepRecord } from './engine/client/runs.js';
export type { Jsonify } from './engine/core/jsonify.js';
export { RUNLEDGER_TABLES } from './engine/db/schema.js';
export type { RunledgerDatabase } from './engine/db/schema.js';
export type { Worker, WorkerOptions } from './engine/worker/worker.js';
export { LEASE_MS_DEFAULT, CONCURRENCY_DEFAULT, SHUTDOWN_TIMEOUT_MS_DEFAULT } from './engine/worker/worker.js';
export {
  RUN_STATES,
  RUN_TRANSITIONS,
  TERMINAL_STATES,
  TERMINATION_REASONS,
  STEP_KINDS,
  STEP_STATUSES,
  WAIT_KINDS,
  OPERATION_STATUSES,
  COMPENSATION_STATUSES,
} from './engine/core/states.js';
export type {
  RunStatus,
  TerminationReason,
  StepKind,
  StepStatus,
  WaitKind,
  OperationStatus,
  CompensationStatus,
} from './engine/core/states.js';
export { CRASH_WHEN } from './engine/core/crash-points.js';
export type { CrashPoint, CrashWhen } from './engine/core/crash-points.js';
export { loadMigrations } from './engine/db/migrate.js';
export { StepContext } from './steps/context.js';
export * from './agents/index.js';
export type { StepFunction, StepInfo, StepOptions } from './steps/step.js';
export type { ExecOptions, ExecResult, ExecOutputArtifact, CommandControl, CommandResult } from './steps/command.js';
export { MAX_KEPT_OUTPUT_BYTES } from './steps/command.js';
export { runCommand } from './steps/command.js';
export type { PolicyAction, PolicyFunction, PolicyVerdict } from './engine/core/policy.js';
export type { OperationFunction, OperationOptions, ReconcileAnswer } from './steps/operation.js';
export type { RetryPolicy } from './steps/retry.js';
export type { TransactionFunction } from './steps/transaction.js';
export type { ApprovalDecision, ApprovalRequest, ChildOptions, WaitForSignalOptions } from './steps/waits.js';
export type { DecisionInput, DecisionRecord } from './engine/client/operator.js';
export type { DurableStream } from './steps/stream.js';
export type { ReadStreamOptions, StreamChunk } from './engine/client/streams.js';
export { streamToSse } from './engine/client/sse.js';
export type { SseOptions, SseSource } from './engine/client/sse.js';
export { DEFAULT_STREAM_TOPIC } from './engine/core/stream-topic.js';
export type { Duration } from './engine/core/duration.js';
export type { QueueOptions, QueueRecord } from './engine/client/queues.js';
export type { RateLimitOptions, RateLimitRecord } from './engine/client/rate-limits.js';
export { RetryAfterError } from './steps/retry-after.js';
export type { Schedule, ScheduleOptions } from './engine/client/schedules.js';
export {
  RunledgerError,
  LeaseLostError,
  NotFoundError,
  InvalidInputError,
  PayloadTooLargeError,
  InvalidStateError,
  UnknownWorkflowError,
  NonDeterminismError,
  NotSerializableError,
  SchemaTooNewError,
  ConfigError,
  NotInWorkflowError,
  StepNotAwaitedError,
  RunFailedError,
  StepFailedError,
  NotAllowedError,
  PermissionDeniedError,
  ChildFailedError,
  NonRetryableError,
  MigrationMismatchError,
  ConstraintViolationError,
  InvalidReconcileAnswerError,
  UnverifiedError,
  InvalidVerdictError,
  MigrationFailedError,
  SecretInPayloadError,
  SecretNotFoundError,
  PayloadKeyMissingError,
  PayloadUnreadableError,
  StepTimeoutError,
} from './engine/core/errors.js';
export type { MigrateFunction, MigrationArgs, MigrationPlan, MigratedCheckpoint, RecordedCheckpoint } from './engine/core/migration.js';
export type { MigrateRunOptions, MigrateRunsResult, MigrationOutcome } from './engine/client/migrations.js';
export type { ErrorCode, SerializedError } from './engine/core/errors.js';
