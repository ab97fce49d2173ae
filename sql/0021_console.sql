-- 0021_console: the index of the web console's run lists (runledger ui, docs/console.md).
--
--   runs_console (status, workflow_name, run_id): a page of runs in some statuses and of
--   some workflow, newest first, by keyset; the counts per status; the gauges' unfinished runs
--
-- The console lists runs by run_id descending (ULIDs: newest first) with `run_id < $before`,
-- never by OFFSET, so a deep page costs what the first one does. Without a status or workflow
-- filter the primary key serves. With one, the console reads this index one (status,
-- workflow) pair at a time, each a range already in run_id order, and merges the pairs' first
-- rows (src/console/queries.ts): with a workflow, the pairs are that workflow's statuses (at
-- most nine); without one, the workflows that have runs in the status are found in the index
-- itself, one probe each. The counts per status and the unfinished runs of the gauges are a
-- range of its leading column (index-only). Queue and concurrency-key filters go by the
-- primary key and skip rows that do not match (docs/console.md measures both).
--
-- One index, not one per filter: every run writes an entry when it starts and at every change
-- of status (the change is never a HOT update: status is in the predicates of the claim's
-- indexes). The two indexes this one replaces, (status, run_id) and (workflow_name, run_id),
-- cost a start_runs row 10,000 instructions more and a drained one-step run two more entries
-- (callgrind, PostgreSQL 15).
--
-- Partial on a predicate that is always true (created_at is set on insert) but that no
-- statement of the engine names, and the console's queries repeat it to use it. It holds
-- run_id as its last column, so a `run_id = ...` could be served by walking the whole index;
-- on a table the statistics call empty the planner finds that as cheap as the primary key.
-- The earlier indexes, each before it became partial, were taken for lookups of one run by
-- `run_id = ... and status in (...)` with a plan cached while the table was empty, and by the
-- group commit's completion UPDATE on a new database never analysed (test/plans.test.ts
-- caught both): a walk of every run per completion once the table has grown.
create index runs_console on runledger.runs (status, workflow_name, run_id) where created_at > '-infinity';
comment on index runledger.runs_console is
  'The console''s run lists and counts per status (src/console/queries.ts): one range per (status, workflow) pair, in run_id order. Partial on created_at > ''-infinity'' (always true), which only the console''s and the gauges'' queries name.';

insert into runledger.migrations (version, name) values (21, '0021_console');
