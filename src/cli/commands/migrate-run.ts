import { awaitMigration, migrateRun as migrateOne, migrateRuns, type MigrationOutcome } from '../../engine/client/migrations.js';
import { RunledgerError } from '../../engine/core/errors.js';
import { print } from '../format.js';
import { CliError, EXIT_FAILED, intOption, parse, requiredOption, withPool, type Command } from '../shared.js';

interface Result {
  runId: string;
  /** skipped: migrate_runs left the run on its version (error says why: locked at that moment, or compensated). */
  outcome: 'migrated' | 'requested' | 'failed' | 'skipped';
  status?: string;
  error?: string;
}

/**
 * Through runledger.migrate_run (one run) or runledger.migrate_runs (--all-of: every
 * PENDING, WAITING and DEAD_LETTER run of a version, or the oldest --limit of them for a
 * canary). Then waits for the workers to apply each migration and reports each outcome,
 * and each run of the selection migrate_runs left on its version (skipped, with why);
 * exit 1 when one failed or was skipped (its run is left as it was).
 */
export const migrateRun: Command = {
  summary: 'move a run (or the runs of a version) to another version of its workflow, through its registered migration',
  usage:
    'runledger migrate-run RUN_ID --to V [--no-wait] [--timeout SECONDS] [--json]\n' +
    '       runledger migrate-run --workflow W --all-of V --to V [--limit N] [--no-wait] [--timeout SECONDS] [--json]',
  args: [['RUN_ID', 'one PENDING, WAITING or DEAD_LETTER run to move (or --all-of)']],
  examples: [
    'runledger migrate-run 01J9Z3K4X8Q2W5E7R1T6Y0U3IO --to 2',
    'runledger migrate-run --workflow order --all-of 1 --to 2 --limit 10   # a canary',
    'runledger migrate-run --workflow order --all-of 1 --to 2 --json',
  ],
  async run(args) {
    const parsed = parse(
      migrateRun,
      args,
      {
        to: { type: 'string', value: 'V', help: 'the version to move to; a live worker of it must have the migration (required)' },
        'all-of': { type: 'string', value: 'V', help: 'every PENDING, WAITING and DEAD_LETTER run of this version (with --workflow)' },
        workflow: { type: 'string', value: 'W', help: 'the workflow, with --all-of' },
        limit: { type: 'string', value: 'N', help: 'with --all-of, only the N oldest runs (a canary)' },
        'no-wait': { type: 'boolean', help: 'mark the runs and return; workers apply the migrations' },
        timeout: { type: 'string', value: 'SECONDS', help: 'how long to wait for the workers to apply them (default 30)' },
        json: {
          type: 'boolean',
          help: 'print one JSON document: an array of {runId, outcome, status, error} (outcome skipped: error says why)',
        },
      },
      { min: 0, max: 1 },
    );
    if (!parsed) return;
    const to = requiredOption(migrateRun, parsed.values, 'to');
    const allOf = parsed.values['all-of'] as string | undefined;
    const runId = parsed.positionals[0];
    if ((runId === undefined) === (allOf === undefined)) {
      throw new CliError(
        'USAGE',
        `give a RUN_ID or --all-of VERSION (with --workflow), not ${runId ? 'both' : 'neither'}\nusage: ${migrateRun.usage}`,
      );
    }
    const limit = intOption(parsed.values, 'limit', 1);
    if (limit !== undefined && allOf === undefined) throw new CliError('USAGE', `--limit goes with --all-of\nusage: ${migrateRun.usage}`);
    const timeoutMs = (intOption(parsed.values, 'timeout', 0) ?? 30) * 1000;
    const wait = parsed.values['no-wait'] !== true;
    const json = parsed.values.json === true;
    const say = (text: string) => {
      if (!json) print(text);
    };

    const results = await withPool(parsed.values, async (pool) => {
      if (runId !== undefined) {
        const outcome = await settle(() => migrateOne(pool, runId, to, { wait, timeoutMs }), runId);
        return [outcome];
      }
      const workflow = requiredOption(migrateRun, parsed.values, 'workflow');
      const { marked, skipped } = await migrateRuns(pool, { workflow, fromVersion: allOf!, toVersion: to, ...(limit ? { limit } : {}) });
      say(`marked ${marked.length} run(s) of ${workflow}@${allOf} for version ${to}${limit ? ` (at most ${limit}: a canary)` : ''}`);
      if (skipped.length > 0) say(`skipped ${skipped.length} run(s) of the selection, left on version ${allOf} (listed below)`);
      const out: Result[] = skipped.map((s) => ({ runId: s.runId, outcome: 'skipped', error: s.reason }));
      const deadline = Date.now() + timeoutMs;
      for (const [i, id] of marked.entries()) {
        const left = wait ? Math.max(0, deadline - Date.now()) : 0;
        out.push(await settle(() => awaitMigration(pool, id, allOf!, to, left), id));
        if (wait && ((i + 1) % 50 === 0 || i + 1 === marked.length)) say(`  ${i + 1} of ${marked.length} settled`);
      }
      return out;
    });

    if (json) {
      print(JSON.stringify(results, null, 2));
    } else {
      for (const r of results) {
        const what =
          r.outcome === 'migrated'
            ? `migrated to version ${to}, now ${r.status}`
            : r.outcome === 'requested'
              ? `marked for version ${to}; a worker with the migration applies it`
              : r.outcome === 'skipped'
                ? `skipped, still on version ${allOf}: ${r.error}`
                : `not migrated: ${r.error}`;
        print(`${r.runId}  ${what}`);
      }
      const failed = results.filter((r) => r.outcome === 'failed').length;
      const skippedRuns = results.filter((r) => r.outcome === 'skipped').length;
      if (results.length > 1) {
        const migrated = results.filter((r) => r.outcome === 'migrated').length;
        print(
          `${migrated} migrated, ${failed} failed, ${results.length - migrated - failed - skippedRuns} still marked` +
            (skippedRuns > 0 ? `, ${skippedRuns} skipped` : ''),
        );
      }
    }
    const failures = results.filter((r) => r.outcome === 'failed').length;
    const skips = results.filter((r) => r.outcome === 'skipped').length;
    if (failures > 0)
      throw new CliError('MIGRATION_FAILED', `${failures} migration(s) failed; those runs were left as they were`, EXIT_FAILED);
    if (skips > 0) {
      throw new CliError(
        'MIGRATION_SKIPPED',
        `${skips} run(s) of ${parsed.values.workflow}@${allOf} were not marked and stay on version ${allOf}; run the command again for those locked at that moment`,
        EXIT_FAILED,
      );
    }
  },
};

/** A failed migration (MIGRATION_FAILED) is a result to report; other errors stop the command. */
async function settle(attempt: () => Promise<MigrationOutcome>, runId: string): Promise<Result> {
  try {
    const outcome = await attempt();
    return { runId, outcome: outcome.outcome, status: outcome.status };
  } catch (error) {
    if (error instanceof RunledgerError && error.code === 'MIGRATION_FAILED') return { runId, outcome: 'failed', error: error.message };
    throw error;
  }
}
