import pg from 'pg';
import { toMs, type Duration } from '../engine/core/duration.js';
import { ConfigError } from '../engine/core/errors.js';

/**
 * A clock for tests that the database honours: runledger.now(), which every runledger
 * function uses for leases, timers, deadlines and retries, reads the session setting
 * runledger.fake_now, in a database whose owner switched the test clock on
 * (runledger.owner_settings.test_clock; createTestDatabase does). A pool made by `clockPool` sets it on each connection it hands out
 * whenever the clock changed since that connection last saw it, so a test moves time
 * for the engine's every query with `clock.advance('2h')` instead of sleeping.
 *
 * While set, the clock stands still: time moves only when the test moves it.
 */
export interface TestClock {
  /** The clock's time, or undefined when it follows the real clock. */
  now(): Date | undefined;
  set(at: Date | string): void;
  /** Moves the clock forward (from the real time, when it was not set). */
  advance(by: Duration): void;
  /** Back to the database's real clock. */
  reset(): void;
  /** Changes so far; a connection that saw an older one is brought up to date at checkout. */
  readonly version: number;
}

export function createTestClock(start?: Date | string): TestClock {
  let at: Date | undefined;
  let version = 0;
  const set = (value: Date | string | undefined) => {
    const date = value === undefined ? undefined : new Date(value);
    if (date && Number.isNaN(date.getTime())) throw new ConfigError(`clock: ${JSON.stringify(value)} is not a time`);
    at = date;
    version++;
  };
  if (start !== undefined) set(start);
  return {
    now: () => (at ? new Date(at) : undefined),
    set: (value) => set(value),
    advance: (by) => set(new Date((at ?? new Date()).getTime() + toMs(by, 'clock.advance'))),
    reset: () => set(undefined),
    get version() {
      return version;
    },
  };
}

type ConnectCallback = (error: Error | undefined, client: pg.PoolClient | undefined, done: (release?: unknown) => void) => void;

/**
 * A pg.Pool whose connections follow `clock` (runledger.fake_now), for createEngine({ pool }).
 * The database must honour the test clock: its owner switched it on
 * (runledger.owner_settings.test_clock, as in every database createTestDatabase makes);
 * elsewhere the first connection that sets the clock throws a ConfigError.
 */
export function clockPool(clock: TestClock, config: pg.PoolConfig): pg.Pool {
  const seen = new WeakMap<pg.PoolClient, number>();
  let honoured = false;
  class ClockPool extends pg.Pool {
    // pg-pool's own query() checks out through connect(callback), so both forms go through here.
    override connect(callback?: ConnectCallback): any {
      const connected = (async () => {
        const client = await super.connect();
        if (seen.get(client) !== clock.version) {
          try {
            const at = clock.now();
            await client.query(`select set_config('runledger.fake_now', $1, false)`, [at ? at.toISOString() : '']);
            if (at && !honoured) {
              const { rows } = await client.query<{ now: Date }>('select runledger.now() as now');
              if (rows[0]!.now.getTime() !== at.getTime()) {
                throw new ConfigError(
                  'clock: this database does not honour the test clock (runledger.owner_settings.test_clock is off). ' +
                    'createTestDatabase switches it on; on another test database its owner runs ' +
                    '`update runledger.owner_settings set test_clock = true` (never on a deployment: docs/testing.md)',
                );
              }
              honoured = true;
            }
            seen.set(client, clock.version);
          } catch (error) {
            client.release(error as Error);
            throw error;
          }
        }
        return client;
      })();
      if (!callback) return connected;
      connected.then(
        (client) => callback(undefined, client, (release) => client.release(release as Error | undefined)),
        (error: Error) => callback(error, undefined, () => {}),
      );
      return undefined;
    }
  }
  return new ClockPool(config);
}
