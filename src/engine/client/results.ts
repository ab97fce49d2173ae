import type pg from 'pg';
import { Wakers } from './wakers.js';
import type { LogFunction } from '../core/log.js';
import { TERMINAL_STATES, type RunStatus } from '../core/states.js';
import { FINISHED_CHANNEL, listen, type Listener } from '../db/listen.js';

/** How often a caller reads the run row while the LISTEN connection is down (lost, or not up yet): the fallback. */
export const FALLBACK_POLL_MS: readonly number[] = [50, 100, 250, 500, 1_000];
/** The longest setTimeout Node accepts; a longer wait is split. */
const MAX_TIMER_MS = 2_147_483_647;

/**
 * How callers learn that a run ended, without polling. One LISTEN connection per engine
 * (opened by the first caller that waits) hears `runledger_finished`, which every
 * terminal write announces with the run's id at commit; a worker of the same engine
 * wakes its callers directly (wake), without the round trip. A woken caller reads the
 * run row once. While the connection is down the callers read the row on a short
 * backoff instead, and when it comes back they all read once: a notification sent
 * meanwhile was missed.
 */
export class ResultWatch {
  readonly #config: pg.PoolConfig;
  readonly #log: LogFunction;
  #listener: Promise<Listener> | undefined;
  readonly #wakers = new Wakers();
  #closed = false;

  constructor(config: pg.PoolConfig, log: LogFunction) {
    this.#config = config;
    this.#log = log;
  }

  /** The run ended, or may have: its callers read its row again. */
  wake(runId: string): void {
    this.#wakers.wake(runId);
  }

  /** How many callers wait now (tests, metrics). */
  get waiting(): number {
    return this.#wakers.size;
  }

  /**
   * Reads the run (read) until it is terminal, missing, or timeoutMs has passed, and
   * returns the last row read. Reads once at the start, then once per wake-up.
   */
  async until<T extends { status: RunStatus }>(
    runId: string,
    read: () => Promise<T | undefined>,
    timeoutMs: number,
  ): Promise<T | undefined> {
    const listener = await this.#listen();
    const deadline = Date.now() + timeoutMs;
    let polls = 0;
    for (;;) {
      // Armed before the read: a notification that arrives while the row is read is not lost.
      let wake!: () => void;
      const woken = new Promise<void>((resolve) => (wake = resolve));
      this.#add(runId, wake);
      try {
        const run = await read();
        if (!run || TERMINAL_STATES.has(run.status) || this.#closed) return run;
        const remaining = deadline - Date.now();
        if (remaining <= 0) return run;
        const listening = listener.listening;
        polls = listening ? 0 : polls + 1;
        const pause = listening ? remaining : Math.min(remaining, FALLBACK_POLL_MS[Math.min(polls, FALLBACK_POLL_MS.length) - 1]!);
        await sleepUnless(woken, pause);
      } finally {
        this.#remove(runId, wake);
      }
    }
  }

  async close(): Promise<void> {
    this.#closed = true;
    this.#wakeAll();
    const listener = await this.#listener?.catch(() => undefined);
    await listener?.close();
  }

  #listen(): Promise<Listener> {
    this.#listener ??= listen(
      this.#config,
      this.#log,
      {
        [FINISHED_CHANNEL]: (payload) => {
          for (const runId of payload.split(',')) this.wake(runId);
        },
      },
      () => this.#wakeAll(), // back after a loss: what ended meanwhile was not announced to us
      () => this.#wakeAll(), // lost: the callers switch to reading on a backoff
    );
    return this.#listener;
  }

  #add(runId: string, wake: () => void): void {
    this.#wakers.add(runId, wake);
  }

  #remove(runId: string, wake: () => void): void {
    this.#wakers.remove(runId, wake);
  }

  #wakeAll(): void {
    this.#wakers.wakeAll();
  }
}

async function sleepUnless(woken: Promise<void>, ms: number): Promise<void> {
  await withinMs(woken, ms);
}

/** The promise's value, or undefined once ms have passed (Infinity: no limit). */
export async function withinMs<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  if (ms === Infinity) return promise;
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([
      promise,
      new Promise<undefined>((resolve) => (timer = setTimeout(() => resolve(undefined), Math.min(ms, MAX_TIMER_MS)))),
    ]);
  } finally {
    clearTimeout(timer);
  }
}
