import type pg from 'pg';
import { serializeError } from '../core/errors.js';
import type { LogFunction } from '../core/log.js';
import { planToWrite, unwrapOutput, type MigrateFunction, type MigrationArgs, type RecordedCheckpoint } from '../core/migration.js';
import { MigrationFailedError } from '../core/errors.js';
import { workflowKey, type Workflow } from '../core/workflow.js';
import { NO_CODEC, type Payloads } from '../core/payloads.js';
import type { CrashHook } from '../core/crash-points.js';
import { Masker } from '../core/redaction.js';

/** What a worker registers for each migration it has: workflow@from>to. */
export function migrationKey(workflow: string, from: string, to: string): string {
  return `${workflowKey(workflow, from)}>${to}`;
}

interface Migration {
  workflow: Workflow<any, any>;
  migrate: MigrateFunction;
}

/** The migrations the workflows served define, by migrationKey. */
export function migrationsOf(workflows: ReadonlyArray<Workflow<any, any>>): Map<string, Migration> {
  const out = new Map<string, Migration>();
  for (const workflow of workflows) {
    for (const [from, migrate] of workflow.migrations) out.set(migrationKey(workflow.name, from, workflow.version), { workflow, migrate });
  }
  return out;
}

interface TakenRun {
  run_id: string;
  workflow_name: string;
  from_version: string;
  to_version: string;
  status: string;
  input: unknown;
  version_manifest: Record<string, unknown>;
  checkpoints: Array<{ seq: number; name: string; kind: string; status: string; output: unknown; error: unknown }>;
}

/**
 * A worker's migrator: applies the migrations it has to the runs migrate_run marked. Each
 * run is locked (_take_migration), the user's migrate runs, and its result is written
 * (_apply_migration) in that one transaction; a migrate that throws, or returns what
 * cannot be written, is rolled back and recorded (_migration_failed): the run is unchanged.
 * run() returns how many runs it migrated; a run() called while one is on its way makes
 * that one look again before it returns (a notification never falls between two passes).
 */
export function createMigrator(options: {
  pool: pg.Pool;
  workerId: string;
  migrations: Map<string, Migration>;
  maxPayloadBytes: number;
  log: LogFunction;
  /** The engine's codec: migrate sees the run in clear, and what it returns is stored encoded. */
  payloads?: Payloads;
  /** Tests: a crash point between the migration's write and its COMMIT. */
  crash?: CrashHook;
}): { run: () => Promise<number>; stop: () => Promise<void> } {
  const { pool, workerId, migrations, log } = options;
  const payloads = options.payloads ?? NO_CODEC;
  const pairs = [...migrations.keys()];
  let current: Promise<number> | undefined;
  let again = false;
  let stopped = false;
  const run = (): Promise<number> => {
    if (pairs.length === 0 || stopped) return Promise.resolve(0);
    if (current) {
      again = true;
      return current;
    }
    current = (async () => {
      let migrated = 0;
      do {
        again = false;
        migrated += await pass();
      } while (again);
      return migrated;
    })().finally(() => {
      current = undefined;
    });
    return current;
  };
  return {
    run,
    // The run on its way ends after the migration it is applying.
    stop: async () => {
      stopped = true;
      await current?.catch(() => undefined);
    },
  };

  /** Migrates marked runs until none is left (or the worker stops). */
  async function pass(): Promise<number> {
    let migrated = 0;
    while (!stopped) {
      const outcome = await migrateOne().catch((error) => {
        log('warn', 'migration pass failed; marked runs are tried again at the next sweep', { error: serializeError(error) });
        return 'none' as const;
      });
      if (outcome === 'none') break;
      if (outcome === 'migrated') migrated++;
    }
    return migrated;
  }

  async function migrateOne(): Promise<'none' | 'migrated' | 'failed'> {
    const client = await pool.connect();
    let broken = false;
    let failure: { run: TakenRun; error: unknown } | undefined;
    try {
      await client.query('begin');
      const taken = await client.query<TakenRun>(
        'select run_id, workflow_name, from_version, to_version, status, input, version_manifest, checkpoints from runledger._take_migration(p_pairs => $1)',
        [pairs],
      );
      const run = taken.rows[0];
      if (!run) {
        await client.query('commit');
        return 'none';
      }
      const migration = migrations.get(migrationKey(run.workflow_name, run.from_version, run.to_version))!;
      try {
        const write = await plan(run, migration);
        const applied = await client.query(
          'select runledger._apply_migration(p_run_id => $1, p_to_version => $2, p_input => $3::jsonb, p_checkpoints => $4::jsonb, p_manifest => $5::jsonb, p_worker_id => $6) as status',
          [run.run_id, run.to_version, write.input, write.checkpoints, JSON.stringify(migration.workflow.versionManifest), workerId],
        );
        if (options.crash?.hit('before-migration-commit', run.workflow_name)) {
          broken = true; // the connection is dropped with the transaction open: nothing of it commits
          return 'none';
        }
        await client.query('commit');
        log(
          'info',
          `run ${run.run_id}: migrated from ${run.workflow_name}@${run.from_version} to ${run.to_version} (${applied.rows[0].status})`,
          { runId: run.run_id, workflow: run.workflow_name, version: run.to_version },
        );
        return 'migrated';
      } catch (error) {
        failure = { run, error };
      }
    } catch (error) {
      await client.query('rollback').catch(() => (broken = true));
      throw error;
    } finally {
      if (failure) await client.query('rollback').catch(() => (broken = true));
      client.release(broken || undefined);
    }
    const { run, error } = failure;
    // The error of the user's migrate may quote the run's data: the workflow's redact paths apply to it.
    const recorded = redactionOf(migrations.get(migrationKey(run.workflow_name, run.from_version, run.to_version))!, run).mask(
      serializeError(error),
    );
    log('warn', `run ${run.run_id}: migration to version ${run.to_version} failed; the run is left as it was`, {
      runId: run.run_id,
      workflow: run.workflow_name,
      version: run.from_version,
      error: recorded,
    });
    await pool.query('select runledger._migration_failed(p_run_id => $1, p_to_version => $2, p_error => $3::jsonb, p_worker_id => $4)', [
      run.run_id,
      run.to_version,
      JSON.stringify(recorded),
      workerId,
    ]);
    return 'failed';
  }

  async function plan(run: TakenRun, migration: Migration) {
    // A payload this worker cannot decode fails the migration (recorded, the run left as it was).
    const input = payloads.decode(run.input);
    const args: MigrationArgs = {
      runId: run.run_id,
      fromVersion: run.from_version,
      input,
      checkpoints: run.checkpoints.map((c): RecordedCheckpoint => ({
        seq: c.seq,
        name: c.name,
        kind: c.kind,
        status: c.status,
        output: payloads.decodeStepOutput(c.kind, unwrapOutput(c.output)),
        error: c.error ?? null,
      })),
      manifest: run.version_manifest,
    };
    let result: unknown;
    try {
      result = await migration.migrate(args);
    } catch (error) {
      throw new MigrationFailedError(
        `migration of run ${run.run_id} from version ${run.from_version} to ${run.to_version} threw: ${(error as Error)?.message ?? String(error)}`,
        { cause: error },
      );
    }
    const write = planToWrite(result, args, options.maxPayloadBytes, payloads);
    const schema = migration.workflow.inputSchema;
    if (schema) {
      const checked = schema.safeParse(write.input === null ? input : write.clearInput);
      if (!checked.success) {
        throw new MigrationFailedError(
          `migration of run ${run.run_id}: the input does not match version ${run.to_version}'s schema: ${checked.error.message}`,
          { details: { issues: checked.error.issues } },
        );
      }
    }
    return write;
  }
}

/** The values the migrated workflow's redact paths select in the run's input and checkpoints (step results). */
function redactionOf(migration: Migration, run: TakenRun): Masker {
  const masker = new Masker();
  const redaction = migration.workflow.redaction;
  if (!redaction) return masker;
  masker.addRedacted(redaction.select({ root: 'input' }, run.input));
  for (const checkpoint of run.checkpoints) {
    const output = unwrapOutput(checkpoint.output);
    const value = checkpoint.kind === 'operation' ? (output as { value?: unknown } | undefined)?.value : output;
    masker.addRedacted(redaction.select({ root: 'step', name: checkpoint.name }, value));
  }
  return masker;
}
