import { pgCode } from '../../engine/db/pg-errors.js';
import { print, printJson, renderTable } from '../format.js';
import { CliError, intOption, JSON_OPTION, parse, withPool, type Command, cliIo } from '../shared.js';

/** PostgreSQL's "that is not an interval" SQLSTATEs: a typo in --older-than is a usage error. */
const BAD_INTERVAL = ['22007', '22008', '22P02', '22015'];
/** Calls of runledger.prune_due one `runledger prune` makes at most (the next one goes on). */
const BATCHES_MAX = 10_000;
/** A prune that needs more batches says how far it got on stderr: after its first batch, then at most this often. */
const PROGRESS_EVERY_MS = 2000;

/**
 * Without --older-than: applies runledger.retention (runledger.prune_due, in batches until
 * nothing is due), or with --dry-run prints per kind what would go. With --older-than:
 * runledger.prune, finished runs only, with everything they own (--dry-run counts them).
 */
export const prune: Command = {
  summary: 'delete what runledger.retention says is due (or, with --older-than, finished runs older than INTERVAL)',
  usage:
    "runledger prune [--dry-run] [--batch N] [--json]   |   runledger prune --older-than INTERVAL [--dry-run]   (INTERVAL: '30 days', '12h')",
  details: [
    'Without --older-than, applies the retention rules (runledger retention; docs/retention.md) as the workers do on',
    'their own: runledger.prune_due in batches of N rows per kind until no kind fills a batch, then prints what went',
    'per kind. --dry-run prints per kind what would go and changes nothing. A run that is not finished, whose parent,',
    'child or forks are not finished, or whose idempotency key a rule still holds is never removed.',
    'With --older-than, deletes every finished run older than INTERVAL with everything it owns, whatever the rules say.',
    'A prune that needs more than one batch prints how far it got on stderr after the first, then every 2 s.',
  ].join('\n'),
  examples: [
    'runledger prune --dry-run',
    'runledger prune --dry-run --json',
    'runledger prune --batch 500',
    "runledger prune --older-than '30 days'",
    'runledger prune --older-than 12h --dry-run',
  ],
  async run(args) {
    const parsed = parse(prune, args, {
      'older-than': {
        type: 'string',
        value: 'INTERVAL',
        help: 'delete runs that finished longer ago than this PostgreSQL interval, ignoring the retention rules',
      },
      'dry-run': { type: 'boolean', help: 'print what would be removed; remove nothing' },
      batch: { type: 'string', value: 'N', help: 'rows per kind per batch when applying the rules (default 1000)' },
      json: JSON_OPTION,
    });
    if (!parsed) return;
    const dryRun = parsed.values['dry-run'] === true;
    const olderThan = parsed.values['older-than'] as string | undefined;
    const batch = intOption(parsed.values, 'batch', 1) ?? 1000;
    if (olderThan !== undefined) {
      if (olderThan.length === 0) throw new CliError('USAGE', `--older-than needs an interval\nusage: ${prune.usage}`);
      if (parsed.values.batch !== undefined) throw new CliError('USAGE', '--batch applies to the retention rules, not to --older-than');
      const removed = await withPool(parsed.values, async (pool) => {
        try {
          const result = dryRun
            ? await pool.query(
                `select count(*)::int8 as n from runledger.runs
                  where status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
                    and finished_at < runledger.now() - $1::interval`,
                [olderThan],
              )
            : await pool.query('select runledger.prune(p_older_than => $1::interval)::int8 as n', [olderThan]);
          return Number(result.rows[0].n);
        } catch (error) {
          if (BAD_INTERVAL.includes(pgCode(error) ?? '')) {
            throw new CliError('USAGE', `--older-than ${JSON.stringify(olderThan)} is not a PostgreSQL interval (e.g. '30 days', '12h')`);
          }
          throw error;
        }
      });
      if (parsed.values.json) {
        printJson({ dryRun, olderThan, runs: removed });
        return;
      }
      print(
        dryRun
          ? `would remove ${removed} finished run(s) older than ${olderThan}, with their steps, events, operations, signals and approvals`
          : `removed ${removed} finished run(s) older than ${olderThan}, with their steps, events, operations, signals and approvals`,
      );
      return;
    }
    const { totals, batches } = await withPool(parsed.values, async (pool) => {
      const totals = new Map<string, number>();
      let batches = 0;
      let reportedAt: number | undefined;
      for (let full = true; full && batches < BATCHES_MAX;) {
        if (batches > 0 && (reportedAt === undefined || Date.now() - reportedAt >= PROGRESS_EVERY_MS)) {
          // A long prune is not silent; stderr, so that --json's stdout stays one document.
          const sofar = [...totals].flatMap(([kind, n]) => (n > 0 ? [`${kind} ${n}`] : [])).join(', ');
          cliIo().stderr.write(`prune: ${batches} batch(es) so far, removed ${sofar}; going on\n`);
          reportedAt = Date.now();
        }
        const result = await pool.query<{ kind: string; removed: string }>(
          'select kind, removed from runledger.prune_due(p_batch => $1, p_dry_run => $2)',
          [batch, dryRun],
        );
        batches++;
        full = false;
        for (const row of result.rows) {
          const n = Number(row.removed);
          totals.set(row.kind, (totals.get(row.kind) ?? 0) + n);
          if (n >= batch && !dryRun) full = true;
        }
      }
      return { totals, batches };
    });
    if (parsed.values.json) {
      printJson({ dryRun, ...(dryRun ? {} : { batches }), removed: Object.fromEntries(totals) });
      return;
    }
    print(
      renderTable(
        ['KIND', dryRun ? 'WOULD REMOVE' : 'REMOVED'],
        [...totals].map(([kind, n]) => [kind, String(n)]),
        { right: [1] },
      ),
    );
    if (dryRun) print('\nnothing was removed (dry run); the rules: runledger retention');
    else print(`\n${batches} batch(es) of at most ${batch} row(s) per kind`);
  },
};
