import { inject } from 'vitest';
import { createTestDatabase as createFromTemplate, type TestDatabase } from '../../src/testing/index.js';

export type { TestDatabase };

/** A fresh database cloned from the suite's migrated template (runledger/testing); dropped (with force) by drop(). */
export function createTestDatabase(): Promise<TestDatabase> {
  return createFromTemplate({ adminUrl: inject('adminUrl'), template: inject('templateDatabase') });
}

/** Polls `check` until it returns a truthy value; fails with `what` after timeoutMs. Conditions, not sleeps. */
export async function waitFor<T>(what: string, check: () => Promise<T>, timeoutMs = 30_000): Promise<NonNullable<T>> {
  const deadline = Date.now() + timeoutMs;
  let last: unknown;
  for (let interval = 10; ; interval = Math.min(250, interval * 2)) {
    try {
      const value = await check();
      if (value) return value as NonNullable<T>;
      last = value;
    } catch (error) {
      last = error;
    }
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what} (last: ${String(last)})`);
    await new Promise((resolve) => setTimeout(resolve, interval));
  }
}
