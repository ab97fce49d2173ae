import { afterAll, beforeAll } from 'vitest';
import { createEngine, type Engine, type EngineOptions, type Worker, type WorkerOptions } from '../../src/index.js';
import { createFixtureTables, defineFixtureWorkflows } from '../fixtures/workflows.js';
import { createTestDatabase, type TestDatabase } from './database.js';

export type FixtureWorkflows = ReturnType<typeof defineFixtureWorkflows>;

export interface TestEngineOptions {
  /** Creates the fixture tables and defines the fixture workflows (test/fixtures/workflows.ts) on the engine. */
  fixtures?: boolean;
  /**
   * Runs once the database exists, before the engine is created: tables, registrations,
   * services. A function it returns is called at the end, after the engines are closed
   * and before the database is dropped (a proxy the engine talks through, say).
   */
  prepare?: (db: TestDatabase) => Promise<void | (() => Promise<void>)>;
  /** Options of the file's engine (connected to the test database, silent by default); false: no engine. */
  engine?: false | Partial<EngineOptions> | ((db: TestDatabase) => Partial<EngineOptions>);
  /** Starts an in-process worker on the engine, once the fixtures are defined. */
  worker?: WorkerOptions;
}

export interface TestEngine {
  /** The file's database; the same object before and after beforeAll, so it can be destructured at the top of a file. */
  readonly db: TestDatabase;
  readonly engine: Engine;
  readonly fixtures: FixtureWorkflows;
  readonly worker: Worker;
  /** Another engine on the file's database (another process, in effect), closed after the file. */
  newEngine(options?: Partial<EngineOptions>): Engine;
}

/**
 * What a test file needs, made in beforeAll and torn down in afterAll: a database cloned
 * from the migrated template and, unless `engine: false`, an engine on it. Call it at the
 * top level of the file; the fields are there once the file's tests run.
 */
export function useTestEngine(options: TestEngineOptions = {}): TestEngine {
  const db = {} as TestDatabase;
  let created = false;
  let engine: Engine | undefined;
  let fixtures: FixtureWorkflows | undefined;
  let worker: Worker | undefined;
  let finish: (() => Promise<void>) | void;
  const others: Engine[] = [];
  const silent = { log: () => {} };

  beforeAll(async () => {
    Object.assign(db, await createTestDatabase());
    created = true;
    if (options.fixtures) await createFixtureTables(db.pool);
    finish = await options.prepare?.(db);
    if (options.engine === false) return;
    const extra = typeof options.engine === 'function' ? options.engine(db) : options.engine;
    engine = createEngine({ connectionString: db.url, ...silent, ...extra });
    if (options.fixtures) fixtures = defineFixtureWorkflows(engine);
    if (options.worker) worker = await engine.runWorker(options.worker);
  });

  afterAll(async () => {
    await Promise.all(others.map((e) => e.close()));
    await engine?.close();
    if (finish) await finish();
    if (created) await db.drop();
  });

  const present = <T>(value: T | undefined, what: string): T => {
    if (value === undefined) throw new Error(`useTestEngine: no ${what} (not asked for, or used before beforeAll)`);
    return value;
  };
  return {
    db,
    get engine() {
      return present(engine, 'engine');
    },
    get fixtures() {
      return present(fixtures, 'fixtures');
    },
    get worker() {
      return present(worker, 'worker');
    },
    newEngine(engineOptions = {}) {
      const e = createEngine({ connectionString: db.url, ...silent, ...engineOptions });
      others.push(e);
      return e;
    },
  };
}
