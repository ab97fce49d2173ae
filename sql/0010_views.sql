-- 0010_views: what operators read in psql.
--
--   runledger.active              runs not yet finished, with their owner and lease
--   runledger.dead_letter         runs parked out of the automatic path, with why
--   runledger.run_timeline        one run's history: events and step checkpoints in time order
--   runledger.waiting             runs waiting, holding no worker: for what, since and until when
--   runledger.approval_inbox      pending approval requests
--   runledger.unknown_operations  external operations whose outcome is UNKNOWN
--   runledger.queue_stats         per queue and key: depth, running, oldest pending, limits
--   runledger.live_workers        workers not stopped and heard from within their lease
--   runledger.stranded_runs       PENDING and WAITING runs whose version no live worker serves
--   runledger.version_stats       runs per workflow, version and runtime: per status, oldest waiting, live workers

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

insert into runledger.migrations (version, name) values (10, '0010_views');
