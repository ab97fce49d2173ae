import { ConfigError } from './errors.js';

/**
 * The engine option `secrets`: resolves a secret's name to its value at run time, for
 * ctx.secret. Called at most once per name and execution (a recovered run calls it again);
 * the value is never stored, logged or put in an error (docs/security.md).
 */
export type SecretResolver = (
  name: string,
  context: {
    runId: string;
    /** The run's workflow name. */
    workflow: string;
    /** The run's workflow version. */
    version: string;
    /** Fires when the run is cancelled or the worker lost its lease. */
    signal: AbortSignal;
  },
) => Promise<string | undefined | null> | string | undefined | null;

/** Secret names: plain names (they appear in errors and log lines as [secret:name]). */
export const SECRET_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$/;

export function checkSecretName(name: unknown): asserts name is string {
  if (typeof name !== 'string' || !SECRET_NAME_PATTERN.test(name)) {
    throw new ConfigError(
      `ctx.secret: invalid secret name ${JSON.stringify(name)}: 1-100 characters of letters, digits and _ . : / - (starting with a letter or digit)`,
    );
  }
}
