import { StepFailedError, type SerializedError } from '../engine/core/errors.js';
import type { CheckpointRow, Execution } from '../engine/run/execution.js';
import { checkPayloadSize, toJsonText } from '../engine/core/json.js';

/** The value a recorded checkpoint stands for: its output, or its failure rethrown. */
export function replayCheckpoint<T>(recorded: CheckpointRow): T {
  const [, name, status, output, error] = recorded;
  if (status === 'FAILED') throw stepFailure(name, error as SerializedError);
  // Stored outputs come wrapped in a one-element array; null means the step returned undefined.
  return (Array.isArray(output) ? output[0] : undefined) as T;
}

export function stepFailure(name: string, recorded: SerializedError, cause?: unknown): StepFailedError {
  const error = new StepFailedError(`step ${JSON.stringify(name)} failed: ${recorded.message}`, recorded);
  if (cause !== undefined) Object.defineProperty(error, 'cause', { value: cause, enumerable: false });
  return error;
}

/**
 * Encodes a step's result for its checkpoint, or throws the error that fails the
 * step (not serialisable, too large). Returns the text to store (through the engine's
 * codec, when it has one) and the value a replay would return, so the first execution
 * and every replay see the same value.
 */
export function encodeOutput(exec: Execution, name: string, value: unknown): { text: string | undefined; value: unknown } {
  const what = `output of step ${JSON.stringify(name)}`;
  const clear = toJsonText(value, what);
  exec.checkPayload(clear, what);
  if (clear === undefined) return { text: undefined, value: undefined };
  checkPayloadSize(clear, what, exec.deps.maxPayloadBytes);
  // The limit is on what is stored: with a codec, the envelope.
  const text = exec.payloads.text(clear);
  if (text !== clear) checkPayloadSize(text, `${what} (encoded)`, exec.deps.maxPayloadBytes);
  return { text, value: JSON.parse(clear) };
}
