-- 0011_views: the views psql users read.
--
-- indexes: runs_console
-- views: active, dead_letter, run_timeline, waiting, approval_inbox, unknown_operations, queue_stats,
--   live_workers, stranded_runs, version_stats, patches

create view runledger.active as
select r.run_id, r.workflow_name, r.workflow_version, r.queue_name, r.status, r.wait_kind, r.wake_at,
       r.lease_owner, r.lease_expires_at,
       r.lease_expires_at - runledger.now() as lease_remaining,
       r.fencing_token, r.recovery_attempts, r.max_recovery_attempts,
       (select count(*) from runledger.steps s where s.run_id = r.run_id) as steps_done,
       r.created_at, r.updated_at,
       runledger.now() - r.created_at as age
  from runledger.runs r
 where r.status in ('PENDING', 'RUNNING', 'WAITING', 'CANCELLING');
comment on view runledger.active is
  'Runs not yet finished (PENDING, RUNNING, WAITING, CANCELLING): owner, lease remaining, fencing token, recovery attempts, checkpoints written.';

create view runledger.dead_letter as
select r.run_id, r.workflow_name, r.workflow_version, r.queue_name,
       r.termination_reason, r.termination_evidence, r.terminated_at,
       r.recovery_attempts, r.max_recovery_attempts, r.error,
       (select count(*) from runledger.steps s where s.run_id = r.run_id) as steps_done,
       r.created_at,
       -- Its effects are not undone on their own: retry_run (after a fix) or compensate_run.
       runledger._compensations_due(r.run_id) as compensations_due
  from runledger.runs r
 where r.status = 'DEAD_LETTER';
comment on view runledger.dead_letter is
  'Runs out of the automatic path (max recovery attempts, non-determinism, ...), with the termination reason and evidence. Bring one back with select runledger.retry_run(run_id); compensations_due says it did things not undone yet (runledger.compensate_run(run_id) undoes them).';

create view runledger.run_timeline as
select e.run_id, e.at, 'event'::text as entry, e.kind as what, null::int as seq, null::text as status,
       e.detail, e.fencing_token, null::numeric as duration_ms
  from runledger.events e
union all
select s.run_id, s.finished_at, 'step', s.name, s.seq, s.status,
       coalesce(s.error, jsonb_build_object('kind', s.kind, 'attempts', s.attempts)),
       s.fencing_token, round(extract(epoch from s.finished_at - s.started_at)::numeric * 1000, 1)
  from runledger.steps s;
comment on view runledger.run_timeline is
  'History of runs: lifecycle events and step checkpoints. Use: select * from runledger.run_timeline where run_id = ''...'' order by at.';

create view runledger.waiting as
select r.run_id, r.workflow_name, r.queue_name, r.wait_kind,
       case r.wait_kind when 'signal' then 'signal ' || r.wait_key
                        when 'approval' then 'approval ' || r.wait_key
                        when 'child' then 'child run ' || r.wait_key
                        when 'timer' then 'timer' else r.wait_kind end as waiting_for,
       s.name as step_name, s.seq as step_seq, s.started_at as since, r.wake_at as until,
       r.deadline_at, runledger.now() - s.started_at as waited
  from runledger.runs r
  left join lateral (select st.name, st.seq, st.started_at from runledger.steps st
                      where st.run_id = r.run_id and st.status = 'WAITING' order by st.seq desc limit 1) s on true
 where r.status = 'WAITING';
comment on view runledger.waiting is
  'Runs waiting, holding no worker: what for (timer, signal topic, approval request, child run), at which step, since when and until when (timeout or deadline).';

create view runledger.approval_inbox as
select a.request_id, a.run_id, r.workflow_name, a.name, a.action, a.evidence, a.approvers, a.requested_at, a.expires_at
  from runledger.approvals a
  join runledger.runs r on r.run_id = a.run_id
 where a.decision is null and (a.expires_at is null or a.expires_at > runledger.now())
   and r.status = 'WAITING';
comment on view runledger.approval_inbox is
  'Pending approval requests: the action asked for, its evidence, who may decide and until when. Decide with select runledger.decide_approval(request_id, true|false, ''name'', ''note'').';

create view runledger.unknown_operations as
select o.operation_id, o.run_id, r.workflow_name, o.name, o.idempotency_key, o.attempts, o.started_at,
       o.updated_at as unknown_since, runledger.now() - o.updated_at as unknown_for, r.status as run_status, r.wait_kind
  from runledger.operations o
  join runledger.runs r on r.run_id = o.run_id
 where o.status = 'UNKNOWN';
comment on view runledger.unknown_operations is
  'External operations whose outcome is UNKNOWN (the worker died between the call and recording its result): which run, since when, with which idempotency key. Settle one with select runledger.resolve_operation(operation_id, ''SUCCEEDED''|''FAILED'', result).';

create view runledger.queue_stats as
select r.queue_name,
       case when grouping(r.concurrency_key) = 1 then null else coalesce(r.concurrency_key, '') end as concurrency_key,
       grouping(r.concurrency_key) = 1 as queue_total,
       count(*) filter (where r.status = 'PENDING' and not r.admitted) as waiting_admission,
       count(*) filter (where r.status = 'PENDING' and r.admitted) as dispatched,
       count(*) filter (where r.status in ('RUNNING', 'CANCELLING')) as running,
       count(*) filter (where r.status = 'WAITING') as waiting,
       runledger.now() - min(r.created_at) filter (where r.status = 'PENDING') as oldest_pending_age,
       max(q.concurrency) as concurrency, max(q.per_key_concurrency) as per_key_concurrency,
       max(q.rate_limit_max) as rate_limit_max, max(q.rate_limit_period_ms) as rate_limit_period_ms,
       bool_or(q.paused) as paused
  from runledger.runs r
  left join runledger.queues q on q.name = r.queue_name
 where r.status in ('PENDING', 'RUNNING', 'CANCELLING', 'WAITING')
 group by grouping sets ((r.queue_name), (r.queue_name, r.concurrency_key));
comment on view runledger.queue_stats is
  'Per queue (queue_total = true) and per concurrency key: runs waiting for admission, dispatched, running, waiting, the oldest pending age, and the queue''s limits. For dashboards and alerts.';

-- Live workers: not stopped, heard from within their lease. A worker that stops
-- gracefully sets stopped_at at once, so its versions stop being served at once.
create view runledger.live_workers as
select w.*
  from runledger.workers w
 where w.stopped_at is null
   and w.last_heartbeat_at > runledger.now() - make_interval(secs => w.lease_ms / 1000.0);
comment on view runledger.live_workers is
  'Worker processes that are live: not stopped, and heard from within their lease. What they serve (workflows, as workflow@version) decides which runs are stranded.';

create view runledger.stranded_runs as
select r.run_id, r.workflow_name, r.workflow_version, r.status, r.wait_kind, r.queue_name, r.created_at, r.updated_at,
       r.version_manifest,
       (select array_agg(distinct split_part(v, '@', 2) order by split_part(v, '@', 2))
          from runledger.live_workers w, unnest(w.workflows) v
         where split_part(v, '@', 1) = r.workflow_name) as served_versions
  from runledger.runs r
 where r.status in ('PENDING', 'WAITING')
   and not exists (select 1 from runledger.live_workers w
                    where (r.workflow_name || '@' || r.workflow_version) = any(w.workflows));
comment on view runledger.stranded_runs is
  'PENDING and WAITING runs whose (workflow, version) no live worker serves: they wait for a worker of their version (or a migration), and are never failed by the engine for it. served_versions: the versions of the same workflow live workers do serve.';

create view runledger.version_stats as
select s.workflow_name, s.workflow_version, s.runtime,
       sum(s.n)::bigint as runs,
       coalesce(sum(s.n) filter (where s.status in ('PENDING', 'RUNNING', 'WAITING', 'CANCELLING')), 0)::bigint as active,
       jsonb_object_agg(s.status, s.n) as statuses,
       min(s.oldest_waiting) as oldest_waiting_since,
       lw.live_workers
  from (select r.workflow_name, r.workflow_version, r.version_manifest->>'runtime' as runtime, r.status::text as status,
               count(*) as n, min(r.created_at) filter (where r.status in ('PENDING', 'WAITING')) as oldest_waiting
          from runledger.runs r
         group by 1, 2, 3, 4) s
  -- (A second relation in FROM keeps the columns qualified when the view is printed, so
  -- PostgreSQL 15 and 17 print the same definition for the schema snapshot.)
  cross join lateral (select count(*) as live_workers from runledger.live_workers w
                       where (s.workflow_name || '@' || s.workflow_version) = any(w.workflows)) lw
 group by s.workflow_name, s.workflow_version, s.runtime, lw.live_workers;
comment on view runledger.version_stats is
  'Runs per (workflow, version, runtime version): how many, how many are still active, the count per status, the oldest PENDING or WAITING run, and how many live workers serve that version. A version with no active runs can be retired; one with active runs and no live worker has stranded runs.';

create view runledger.patches as
with taken as (
  select r.workflow_name, r.workflow_version, substr(s.name, 8) as patch,
         count(*) as runs_taken,
         count(*) filter (where r.status not in ('SUCCEEDED', 'CANCELLED', 'TERMINATED')) as replayable_taken,
         min(s.finished_at) as first_taken_at
    from runledger.steps s
    join runledger.runs r on r.run_id = s.run_id
   where s.name like '@patch:%'
   group by r.workflow_name, r.workflow_version, substr(s.name, 8))
select t.workflow_name, t.workflow_version, t.patch, t.runs_taken, t.replayable_taken, t.first_taken_at,
       b.replayable_before
  from taken t
  cross join lateral (
    select count(*) as replayable_before
      from runledger.runs o
     where o.workflow_name = t.workflow_name and o.workflow_version = t.workflow_version
       and o.status not in ('SUCCEEDED', 'CANCELLED', 'TERMINATED') and o.created_at < t.first_taken_at
       and not exists (select 1 from runledger.steps p where p.run_id = o.run_id and p.name = '@patch:' || t.patch)) b;
comment on view runledger.patches is
  'Per workflow version and patch (ctx.patched): runs that took it, how many of them may still execute or replay (not SUCCEEDED, CANCELLED or TERMINATED), when it was first taken, and replayable_before: runs from before the patch that did not take it and may still replay, so still need the old branch. At replayable_before = 0 the old branch can go (ctx.deprecatePatch); at replayable_taken = 0 the deprecatePatch call can go too.';

-- The index of the web console's run lists (runledger ui, docs/console.md):
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
-- indexes), so every index here is paid by every run.
--
-- Partial on a predicate that is always true (created_at is set on insert) but that no
-- statement of the engine names, and the console's queries repeat it to use it. It holds
-- run_id as its last column, so a `run_id = ...` could be served by walking the whole index;
-- on a table the statistics call empty the planner finds that as cheap as the primary key.
-- Not partial, such an index is taken for lookups of one run by `run_id = ... and status in
-- (...)` with a plan cached while the table was empty, and by the group commit's completion
-- UPDATE on a new database never analysed (test/plans.slow.test.ts checks both): a walk of every
-- run per completion once the table has grown.
create index runs_console on runledger.runs (status, workflow_name, run_id) where created_at > '-infinity';
comment on index runledger.runs_console is
  'The console''s run lists and counts per status (src/console/queries.ts): one range per (status, workflow) pair, in run_id order. Partial on created_at > ''-infinity'' (always true), which only the console''s and the gauges'' queries name.';

insert into runledger.migrations (version, name) values (11, '0011_views');
