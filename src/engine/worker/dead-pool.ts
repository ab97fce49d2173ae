import type pg from 'pg';

/**
 * The worker's view of the engine's pool: once `dead()` is true (a crash point fired),
 * every query and checkout it starts never settles, as for a process that was killed.
 * Queries already sent go on; a transaction left open is rolled back by its own code.
 */
export function deadAfterCrash(pool: pg.Pool, dead: () => boolean): pg.Pool {
  const never = new Promise<never>(() => {});
  return new Proxy(pool, {
    get(target, property, receiver) {
      if (property === 'query' || property === 'connect') {
        const original = Reflect.get(target, property, receiver) as (...args: unknown[]) => unknown;
        return (...args: unknown[]) => (dead() ? never : original.apply(target, args));
      }
      const value = Reflect.get(target, property, receiver);
      return typeof value === 'function' ? value.bind(target) : value;
    },
  });
}
