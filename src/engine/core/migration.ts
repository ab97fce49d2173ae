import { ConfigError, MigrationFailedError } from './errors.js';
import { toJsonText } from './json.js';
import { NO_CODEC, type Payloads } from './payloads.js';

/** A checkpoint of the run being migrated, as the old version recorded it. */
export interface RecordedCheckpoint {
  /** Its position (runledger show, fork --from). */
  seq: number;
  name: string;
  /** step, transaction, operation, wait, child, ... */
  kind: string;
  /** SUCCEEDED, FAILED, or WAITING for the position a waiting run waits at. */
  status: string;
  /** What the step returned (undefined when it returned nothing). */
  output: unknown;
  /** The recorded failure of a FAILED step, else null. */
  error: unknown;
}

/** What `migrate` receives: the run as the old version left it. */
export interface MigrationArgs {
  runId: string;
  fromVersion: string;
  input: unknown;
  checkpoints: RecordedCheckpoint[];
  /** The run's version manifest (runtime, checkpoint schema, workflow@version, the old version's manifest). */
  manifest: Record<string, unknown>;
}

/** A checkpoint to keep: a recorded one (possibly changed), positioned by its index in the list. */
export type MigratedCheckpoint = Pick<RecordedCheckpoint, 'name' | 'output'> &
  Partial<Pick<RecordedCheckpoint, 'kind' | 'status' | 'error'>>;

/**
 * What the run continues with on the new version; every field is optional (nothing: the
 * same input and every checkpoint). `checkpoints` replaces the history (positions 0..n-1 in
 * list order); `continueFrom: n` keeps the first n checkpoints as they are. Not both.
 */
export interface MigrationPlan {
  input?: unknown;
  checkpoints?: MigratedCheckpoint[];
  continueFrom?: number;
}

export type MigrateFunction = (args: MigrationArgs) => MigrationPlan | void | Promise<MigrationPlan | void>;

/** What _apply_migration takes: JSON texts (as stored: through the codec), or null for "unchanged". */
export interface MigrationWrite {
  input: string | null;
  checkpoints: string | null;
  /** The new input in clear (its JSON form), for the new version's schema; undefined when unchanged. */
  clearInput?: unknown;
}

/** `migrations: { '1': migrate }` checked at definition: known version names, functions, not the workflow's own version. */
export function checkMigrations(
  migrations: unknown,
  name: string,
  version: string,
  versionPattern: RegExp,
): ReadonlyMap<string, MigrateFunction> {
  if (migrations === undefined) return new Map();
  if (migrations === null || typeof migrations !== 'object' || Array.isArray(migrations)) {
    throw new ConfigError(`workflow ${name}: migrations must be an object of { fromVersion: migrate }`);
  }
  const map = new Map<string, MigrateFunction>();
  for (const [from, fn] of Object.entries(migrations)) {
    if (!versionPattern.test(from)) throw new ConfigError(`workflow ${name}: migrations: ${JSON.stringify(from)} is not a version name`);
    if (from === version) throw new ConfigError(`workflow ${name}: migrations: a migration from version ${from} to itself`);
    if (typeof fn !== 'function') throw new ConfigError(`workflow ${name}: migrations[${JSON.stringify(from)}] must be a function`);
    map.set(from, fn as MigrateFunction);
  }
  return map;
}

/** Stored step outputs come wrapped in a one-element array; null stands for undefined. */
export function unwrapOutput(stored: unknown): unknown {
  return Array.isArray(stored) ? stored[0] : undefined;
}

/**
 * Turns what migrate returned into the write, or throws MIGRATION_FAILED naming what is wrong
 * (the run is then left as it was).
 */
export function planToWrite(plan: unknown, args: MigrationArgs, maxPayloadBytes: number, payloads: Payloads = NO_CODEC): MigrationWrite {
  const what = `migration of run ${args.runId} from version ${args.fromVersion}`;
  if (plan === undefined || plan === null) return { input: null, checkpoints: null };
  if (typeof plan !== 'object' || Array.isArray(plan)) {
    throw new MigrationFailedError(`${what}: migrate must return { input?, checkpoints?, continueFrom? } or nothing`);
  }
  const { input, checkpoints, continueFrom, ...rest } = plan as MigrationPlan;
  const unknownKeys = Object.keys(rest);
  if (unknownKeys.length > 0) throw new MigrationFailedError(`${what}: migrate returned unknown field(s) ${unknownKeys.join(', ')}`);
  if (checkpoints !== undefined && continueFrom !== undefined) {
    throw new MigrationFailedError(`${what}: migrate returned both checkpoints and continueFrom; give one`);
  }
  let kept: MigratedCheckpoint[] | undefined = checkpoints;
  if (continueFrom !== undefined) {
    if (!Number.isInteger(continueFrom) || continueFrom < 0 || continueFrom > args.checkpoints.length) {
      throw new MigrationFailedError(
        `${what}: continueFrom must be a whole number between 0 and ${args.checkpoints.length}, not ${String(continueFrom)}`,
      );
    }
    kept = args.checkpoints.slice(0, continueFrom);
  }
  let checkpointsText: string | null = null;
  if (kept !== undefined) {
    if (!Array.isArray(kept)) throw new MigrationFailedError(`${what}: checkpoints must be an array`);
    const rows = kept.map((c, i) => {
      if (c === null || typeof c !== 'object' || typeof c.name !== 'string' || c.name.length === 0) {
        throw new MigrationFailedError(`${what}: checkpoint ${i} needs a name`);
      }
      const kind = c.kind ?? 'step';
      return {
        name: c.name,
        kind,
        status: c.status ?? 'SUCCEEDED',
        output: c.output === undefined ? null : [c.output],
        error: c.error ?? null,
      };
    });
    checkpointsText = jsonOrFail(rows, `${what}: checkpoints`);
    if (payloads.enabled) {
      // Checked as JSON in clear above; stored as the codec has them (their payload fields, by kind).
      const stored = (JSON.parse(checkpointsText) as typeof rows).map((row) => ({
        ...row,
        output: row.output === null ? null : [payloads.encodeStepOutput(row.kind, row.output[0])],
      }));
      checkpointsText = JSON.stringify(stored);
    }
  }
  const inputText = input === undefined ? null : jsonOrFail(input, `${what}: input`);
  if (inputText !== null) checkSize(inputText, `${what}: input`, maxPayloadBytes);
  kept?.forEach((c, i) => checkSize(jsonOrFail(c.output, `${what}: checkpoint ${i}`), `${what}: checkpoint ${i}`, maxPayloadBytes));
  if (inputText === null) return { input: null, checkpoints: checkpointsText };
  return { input: payloads.text(inputText), checkpoints: checkpointsText, clearInput: JSON.parse(inputText) };
}

/** The same limit a step's output and a run's input meet. */
function checkSize(text: string, what: string, maxPayloadBytes: number): void {
  const bytes = Buffer.byteLength(text);
  if (bytes > maxPayloadBytes) throw new MigrationFailedError(`${what} is ${bytes} bytes, over the limit of ${maxPayloadBytes}`);
}

function jsonOrFail(value: unknown, what: string): string {
  try {
    return toJsonText(value, what) ?? 'null';
  } catch (error) {
    throw new MigrationFailedError(`${what} can't be stored as JSON: ${(error as Error).message}`, { cause: error });
  }
}
