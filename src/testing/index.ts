/**
 * runledger/testing: what a user's own tests need to prove their workflows survive
 * crashes and long waits, without sleeping and without spawning processes.
 *
 * - createTestDatabase(): a fresh database cloned from a migrated template;
 * - createTestClock() and createTestEngine({ clock }): an engine whose connections
 *   honour a clock the test moves (`clock.advance('2h')`);
 * - runWorker({ manual: true }): a worker that claims only in runOnce() / drain();
 * - the engine option crashAt: a worker dies at a chosen point of a chosen step.
 *
 * See docs/testing.md.
 */
export { createTestDatabase, ensureTestTemplate, templateName, withDatabase } from './database.js';
export type { TestDatabase, TestDatabaseOptions } from './database.js';
export { clockPool, createTestClock } from './clock.js';
export type { TestClock } from './clock.js';
export { createTestEngine } from './engine.js';
export type { TestEngineOptions } from './engine.js';
export { CRASH_WHEN } from '../engine/core/crash-points.js';
export type { CrashPoint, CrashWhen } from '../engine/core/crash-points.js';
