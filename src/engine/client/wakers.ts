/**
 * Callers waiting on a run, by run id: what a LISTEN notification (or this process's own
 * worker) wakes. Shared by the result watch (runledger_finished) and the stream readers
 * (runledger_stream).
 */
export class Wakers {
  readonly #byRun = new Map<string, Set<() => void>>();

  add(runId: string, wake: () => void): void {
    let wakers = this.#byRun.get(runId);
    if (!wakers) this.#byRun.set(runId, (wakers = new Set()));
    wakers.add(wake);
  }

  remove(runId: string, wake: () => void): void {
    const wakers = this.#byRun.get(runId);
    wakers?.delete(wake);
    if (wakers?.size === 0) this.#byRun.delete(runId);
  }

  /** Wakes the callers of one run. */
  wake(runId: string): void {
    const wakers = this.#byRun.get(runId);
    if (wakers) for (const wake of [...wakers]) wake();
  }

  /** Wakes every caller (the connection came back, or was lost: a notification may have been missed). */
  wakeAll(): void {
    for (const wakers of this.#byRun.values()) for (const wake of [...wakers]) wake();
  }

  /** How many callers wait now (tests, metrics). */
  get size(): number {
    let n = 0;
    for (const wakers of this.#byRun.values()) n += wakers.size;
    return n;
  }
}
