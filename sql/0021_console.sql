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

-- The predicate is always true (created_at is set on insert) but no statement of the engine
-- names it, so no lookup of one run by `run_id = ... and status in (...)` can take this index
-- over the primary key, not even with a plan cached while the table was empty (test/plans.test.ts
-- caught it); the console's queries repeat the predicate to use it.
create index runs_console_status on runledger.runs (status, run_id) where created_at > '-infinity';
create index runs_console_workflow on runledger.runs (workflow_name, run_id);

insert into runledger.migrations (version, name) values (21, '0021_console');
