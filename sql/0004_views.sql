-- 0004_views: what operators read in psql.
--
--   runledger.active        runs not yet finished, with their owner and lease
--   runledger.dead_letter   runs parked out of the automatic path, with why
--   runledger.run_timeline  one run's history: events and step checkpoints in time order

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
       r.created_at
  from runledger.runs r
 where r.status = 'DEAD_LETTER';
comment on view runledger.dead_letter is
  'Runs out of the automatic path (max recovery attempts, non-determinism, ...), with the termination reason and evidence. Bring one back with select runledger.retry_run(run_id).';

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

insert into runledger.migrations (version, name) values (4, '0004_views');
