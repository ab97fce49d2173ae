export { createEngine, MAX_PAYLOAD_BYTES_DEFAULT } from './engine/engine.js';
export type { Engine, EngineOptions, LogFunction, LogLevel } from './engine/engine.js';
export { defineWorkflow } from './engine/workflow.js';
export type { Workflow, WorkflowFunction, WorkflowLimits, WorkflowOptions } from './engine/workflow.js';
export type { RunHandle, StartOptions } from './engine/start.js';
export type { ListRunsOptions, RunRecord, StepRecord } from './engine/runs.js';
export type { Worker, WorkerOptions } from './engine/worker.js';
export { LEASE_MS_DEFAULT, CONCURRENCY_DEFAULT } from './engine/worker.js';
export { RUN_STATES, TERMINAL_STATES, TERMINATION_REASONS } from './engine/states.js';
export type { RunStatus, TerminationReason } from './engine/states.js';
export { loadMigrations } from './engine/migrate.js';
export { WorkflowContext } from './steps/context.js';
export type { StepFunction, StepInfo, StepOptions } from './steps/step.js';
export type { OperationFunction, OperationOptions, ReconcileAnswer } from './steps/operation.js';
export type { RetryPolicy } from './steps/retry.js';
export type { TransactionFunction } from './steps/transaction.js';
export type { ApprovalDecision, ApprovalRequest, ChildOptions, WaitForSignalOptions } from './steps/waits.js';
export type { DecisionInput, DecisionRecord } from './engine/operator.js';
export type { Duration } from './engine/duration.js';
export type { QueueOptions, QueueRecord } from './engine/queues.js';
export type { Schedule, ScheduleOptions } from './engine/schedules.js';
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
  RunFailedError,
  StepFailedError,
  NotAllowedError,
  ChildFailedError,
  NonRetryableError,
} from './errors.js';
export type { ErrorCode, SerializedError } from './errors.js';
