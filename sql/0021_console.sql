-- 0021_console: indexes for the web console's run list (runledger ui, docs/console.md).
--
--   runs_console_status    (status, run_id): a page of runs in some statuses, newest first, by keyset
--   runs_console_workflow  (workflow_name, run_id): a page of one workflow's runs, newest first, by keyset
--
-- The console lists runs by run_id descending (ULIDs: newest first) with `run_id < $before`,
-- never by OFFSET, so a deep page costs what the first one does. Without a status or workflow
-- filter the primary key serves; these two serve the filtered lists, and the counts per
-- status read runs_console_status alone (an index-only scan). Queue and concurrency-key
-- filters go by the primary key and skip rows that do not match (docs/console.md measures both).

-- Both are partial on a predicate that is always true (created_at is set on insert) but that
-- no statement of the engine names, and the console's queries repeat it to use them. Each
-- holds run_id as its second column, so any `run_id = ...` could be served by walking the
-- whole index; on a table the statistics call empty the planner finds that as cheap as the
-- primary key. runs_console_status was taken for lookups of one run by `run_id = ... and
-- status in (...)`, with a plan cached while the table was empty; runs_console_workflow,
-- when it covered every row, by the group commit's completion UPDATE on a new database never
-- analysed (test/plans.test.ts caught both): a walk of every run per completion once the
-- table has grown.
create index runs_console_status on runledger.runs (status, run_id) where created_at > '-infinity';
create index runs_console_workflow on runledger.runs (workflow_name, run_id) where created_at > '-infinity';

insert into runledger.migrations (version, name) values (21, '0021_console');
