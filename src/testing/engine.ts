import { ConfigError } from '../engine/core/errors.js';
import { createEngine, POOL_MAX_DEFAULT, type Engine, type EngineOptions } from '../engine/index.js';
import { clockPool, type TestClock } from './clock.js';

export interface TestEngineOptions extends Omit<EngineOptions, 'pool'> {
  /** The test database (see createTestDatabase). */
  connectionString: string;
  /** A clock the engine's connections honour; default: the database's real clock. */
  clock?: TestClock;
}

/**
 * An engine for tests: silent unless given a log, on a pool that follows `clock`;
 * close() also ends that pool.
 */
export function createTestEngine<DB = any>(options: TestEngineOptions): Engine<DB> {
  if (!options.connectionString) throw new ConfigError('createTestEngine: connectionString is required');
  const { clock, ...engineOptions } = options;
  if (!clock) return createEngine<DB>({ log: () => {}, ...engineOptions });
  const pool = clockPool(clock, { connectionString: options.connectionString, max: options.poolMax ?? POOL_MAX_DEFAULT });
  pool.on('error', () => {});
  const { connectionString: _unused, ...rest } = engineOptions;
  const engine = createEngine<DB>({ log: () => {}, ...rest, pool });
  const close = engine.close.bind(engine);
  engine.close = async () => {
    await close();
    await pool.end();
  };
  return engine;
}
