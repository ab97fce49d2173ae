import { StepTimeoutError } from '../engine/core/errors.js';
import type { Execution } from '../engine/run/execution.js';

/**
 * One attempt of a step's body. Without a timeout its signal is the execution's (the run
 * cancelled, the lease lost). With one, the attempt has a signal of its own that also fires
 * when the timeout passes, and the attempt fails then with STEP_TIMEOUT whether or not the
 * body heeds its signal: the step does not wait for a body that ignores it (what such a body
 * goes on doing is not recorded, and a retry may overlap it).
 */
export async function attemptWithTimeout<T>(
  exec: Execution,
  name: string,
  attempt: number,
  timeoutMs: number | undefined,
  body: (signal: AbortSignal) => Promise<T> | T,
): Promise<T> {
  const outer = exec.abortController.signal;
  if (timeoutMs === undefined) return body(outer);
  const controller = new AbortController();
  const forward = () => controller.abort(outer.reason);
  if (outer.aborted) forward();
  else outer.addEventListener('abort', forward, { once: true });
  let timer: NodeJS.Timeout | undefined;
  const timedOut = new Promise<never>((_, reject) => {
    timer = setTimeout(() => {
      const error = new StepTimeoutError(`step ${JSON.stringify(name)} attempt ${attempt} ran past its timeout of ${timeoutMs} ms`, {
        step: name,
        attempt,
        timeoutMs,
      });
      controller.abort(error);
      reject(error);
    }, timeoutMs);
  });
  try {
    return await Promise.race([Promise.resolve().then(() => body(controller.signal)), timedOut]);
  } finally {
    clearTimeout(timer);
    outer.removeEventListener('abort', forward);
  }
}
