import { ago, print, renderTable, shortJson, timestamp } from '../format.js';
import { CliError, cliPayloads, intOption, parse, withPool, type Command } from '../shared.js';

interface SessionRow {
  session_id: string;
  holder_run_id: string | null;
  holder_status: string | null;
  holder_workflow: string | null;
  held_at: Date | null;
  waiting_run_ids: string[];
  waiters: number;
  entries: number;
  last_holder_run_id: string | null;
  release_reason: string | null;
  released_at: Date | null;
  created_at: Date;
}

interface BudgetRow {
  budget: Record<string, number> | null;
  spent: Record<string, number>;
  remaining: Record<string, number>;
  exhausted: boolean;
}

/** "tokens 30 of 50 (20 left), cost_usd 0.4 of 20 (19.6 left)": each dimension of the budget. */
function budgetLine(b: BudgetRow): string {
  const limits = Object.entries(b.budget ?? {});
  if (limits.length === 0) return `none (spent ${shortJson(b.spent, 200)})`;
  const parts = limits.map(
    ([dim, limit]) => `${dim} ${Number(b.spent[dim] ?? 0)} of ${Number(limit)} (${Number(b.remaining[dim] ?? 0)} left)`,
  );
  return `${parts.join(', ')}${b.exhausted ? ', used up' : ''}`;
}

interface EntryRow {
  seq: number;
  role: string;
  content: unknown;
  run_id: string;
  step_position: number;
  created_at: Date;
}

/**
 * One agent session: the runledger.session_list row (holder, queue, entry count) and its
 * history from runledger.session_history(), the same rows psql shows.
 */
export const session: Command = {
  summary: 'an agent session: its holder, the runs queued for it, its history in order',
  usage: 'runledger session SESSION_ID [--json] [--width N (content characters per entry, default 100)]',
  args: [['SESSION_ID', 'the id the workflows gave ctx.session']],
  examples: ['runledger session support-7', 'runledger session support-7 --json | jq .entries'],
  async run(args) {
    const parsed = parse(
      session,
      args,
      {
        json: { type: 'boolean', help: 'print one JSON document: the session and all its entries, whole' },
        width: { type: 'string', value: 'N', help: "characters of each entry's content in the table (default 100)" },
      },
      { min: 1, max: 1 },
    );
    if (!parsed) return;
    const sessionId = parsed.positionals[0]!;
    const width = intOption(parsed.values, 'width', 10) ?? 100;
    const payloads = cliPayloads();
    const { row, entries, budget } = await withPool(parsed.values, async (pool) => {
      // session_history checks the id (RL003) and refuses an unknown session (RL002).
      const history = await pool.query<EntryRow>(
        'select seq, role, content, run_id, step_position, created_at from runledger.session_history(p_session_id => $1) order by seq',
        [sessionId],
      );
      // A session id is one session per tenant: the one of the tenant this connection names
      // (runledger.tenant, e.g. PGOPTIONS='-c runledger.tenant=acme'; none: runs without a tenant), as session_history reads.
      const found = await pool.query<SessionRow>(
        `select * from runledger.session_list
          where session_id = $1 and coalesce(tenant_id, '') = coalesce(current_setting('runledger.tenant', true), '')`,
        [sessionId],
      );
      if (!found.rows[0]) throw new CliError('NOT_FOUND', `session ${sessionId} not found`, 1);
      // Its budget across the runs that hold it (sql/0021_session_budgets.sql), if it has one.
      const budgets = await pool.query<BudgetRow>(
        `select budget, spent, remaining, exhausted from runledger.session_budgets
          where session_id = $1 and coalesce(tenant_id, '') = coalesce(current_setting('runledger.tenant', true), '')`,
        [sessionId],
      );
      return {
        row: found.rows[0],
        entries: history.rows.map((e) => ({ ...e, content: payloads.decode(e.content) })),
        budget: budgets.rows[0] ?? null,
      };
    });
    if (parsed.values.json) {
      print(
        JSON.stringify(
          {
            sessionId: row.session_id,
            holder: row.holder_run_id && {
              runId: row.holder_run_id,
              status: row.holder_status,
              workflow: row.holder_workflow,
              heldAt: row.held_at,
            },
            waiting: row.waiting_run_ids,
            lastRelease: row.last_holder_run_id && { runId: row.last_holder_run_id, reason: row.release_reason, at: row.released_at },
            createdAt: row.created_at,
            budget: budget && { limits: budget.budget, spent: budget.spent, remaining: budget.remaining, exhausted: budget.exhausted },
            entries: entries.map((e) => ({
              seq: e.seq,
              role: e.role,
              content: e.content,
              runId: e.run_id,
              stepPosition: e.step_position,
              createdAt: e.created_at,
            })),
          },
          null,
          2,
        ),
      );
      return;
    }
    print(`session     ${row.session_id}  (created ${timestamp(row.created_at)})`);
    print(
      row.holder_run_id
        ? `held by     ${row.holder_run_id} (${row.holder_status ?? 'no such run'}${row.holder_workflow ? `, ${row.holder_workflow}` : ''}) since ${ago(row.held_at)}`
        : `free        ${row.last_holder_run_id ? `last held by ${row.last_holder_run_id}, let go (${row.release_reason}) ${ago(row.released_at)}` : 'never held'}`,
    );
    print(`queued      ${row.waiters === 0 ? 'nobody' : `${row.waiters}: ${row.waiting_run_ids.join(', ')}`}`);
    if (budget) print(`budget      ${budgetLine(budget)}`);
    print();
    print(`entries (${entries.length})`);
    if (entries.length === 0) return;
    const rows = entries.map((e) => [
      String(e.seq),
      e.role,
      e.run_id,
      String(e.step_position),
      ago(e.created_at),
      shortJson(e.content, width),
    ]);
    print(renderTable(['SEQ', 'ROLE', 'RUN', 'STEP', 'AT', 'CONTENT'], rows, { shrink: [5, 2], right: [0, 3], indent: 2 }));
    print("\nwhole entries: runledger session SESSION_ID --json, or select * from runledger.session_history('SESSION_ID')");
  },
};
