-- 0003_recovery: workers, leases, recovery of crashed workers' runs, dead letter, retry.
--
--   runledger._register_workflow(...)  a (workflow, version) pair becomes startable from SQL
--   runledger._register_worker(...)    a worker process announces itself
--   runledger._heartbeat(...)          renews the worker and the leases of all its runs in one call
--   runledger._stop_worker(...)        graceful stop: gives back every run the worker still holds
--   runledger._recover_expired(...)    sweeper: runs whose lease expired go back to PENDING
--                                      (one recovery attempt) or, past the limit, to DEAD_LETTER
--   runledger.retry_run(run_id)        public: a DEAD_LETTER or FAILED run back to PENDING
--                                      (a failed operation at the dropped step back to PLANNED)

create function runledger._register_workflow(p_name text, p_version text, p_queue text, p_max_recovery_attempts int, p_limits jsonb default '{}',
  p_manifest jsonb default null)
returns void language sql volatile as $$
  insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts, limits, manifest)
  values (p_name, p_version, p_queue, p_max_recovery_attempts, coalesce(p_limits, '{}'), p_manifest)
  on conflict (workflow_name, workflow_version) do update
     set queue_name = excluded.queue_name, max_recovery_attempts = excluded.max_recovery_attempts,
         limits = excluded.limits, manifest = coalesce(excluded.manifest, runledger.workflows.manifest),
         registered_at = runledger.now()
$$;
comment on function runledger._register_workflow(text, text, text, int, jsonb, jsonb) is
  'Records a workflow (name, version) with its default queue, recovery limit, limits (deadline, max_steps, budget, no_progress) and version manifest, so start_run from SQL can resolve them (a run started from SQL records that manifest).';

create function runledger._register_worker(
  p_worker_id text, p_host text, p_pid int, p_workflows text[], p_queues text[], p_concurrency int, p_lease_ms int,
  p_migrations text[] default '{}')
returns void language sql volatile as $$
  insert into runledger.workers (worker_id, host, pid, workflows, queues, concurrency, lease_ms, migrations)
  values (p_worker_id, p_host, p_pid, p_workflows, p_queues, p_concurrency, p_lease_ms, coalesce(p_migrations, '{}'))
  on conflict (worker_id) do update
     set last_heartbeat_at = runledger.now(), stopped_at = null
$$;
comment on function runledger._register_worker(text, text, int, text[], text[], int, int, text[]) is
  'A worker process announces what it serves (workflow@version, queues), the run migrations it applies (workflow@from>to), its concurrency and lease length.';

-- A worker's group commit locks several of its runs in one transaction, in run_id order.
-- Its heartbeat, which renews all its leases in one statement, and its graceful stop lock
-- them in the same order, so they wait for each other instead of deadlocking.
create function runledger._heartbeat(p_worker_id text, p_lease_ms int, p_except text[] default '{}') returns text[]
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now  timestamptz := runledger.now();
  v_runs text[];
begin
  update runledger.workers set last_heartbeat_at = v_now, stopped_at = null where worker_id = p_worker_id;
  -- One statement renews every lease this worker holds. A run taken over by another
  -- worker has another lease_owner and is not renewed: the caller sees it missing.
  with held as (
    select r.run_id from runledger.runs r
     where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
       -- Runs inside a step that heartbeats itself are kept alive by that step only.
       and r.run_id <> all (p_except)
     order by r.run_id
     for update
  ), renewed as (
    update runledger.runs r
       set lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0)
      from held
     where r.run_id = held.run_id and r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
    returning r.run_id)
  select coalesce(array_agg(run_id), '{}') into v_runs from renewed;
  return v_runs;
end;
$$;
comment on function runledger._heartbeat(text, int, text[]) is
  'Worker heartbeat: marks the worker alive and renews the leases of all runs it owns, except p_except (runs whose current step heartbeats itself); returns the ids renewed.';

create function runledger._stop_worker(p_worker_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz := runledger.now();
  v_run   record;
  v_count int := 0;
begin
  for v_run in
    select r.run_id, r.fencing_token, r.status, r.queue_name from runledger.runs r
     where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
     order by r.run_id
     for update
  loop
    if v_run.status = 'RUNNING' then
      if runledger._release_run(v_run.run_id, v_run.fencing_token, 0, 'worker_stopped', false) then
        v_count := v_count + 1;
      end if;
    else
      -- Stopped while cancelling (a compensation still running): still CANCELLING, without
      -- an owner, for the next claim to finish the cancel at once, as _recover_expired does
      -- after a lease expiry, but without counting a recovery attempt (nothing failed).
      update runledger.runs set lease_owner = null, lease_expires_at = null, updated_at = v_now
       where run_id = v_run.run_id;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'released', jsonb_build_object('reason', 'worker_stopped', 'delay_ms', 0, 'counts_attempt', false,
                                                           'cancelling', true), v_run.fencing_token, v_now);
      perform runledger._dispatch(v_run.run_id, v_run.queue_name);
      v_count := v_count + 1;
    end if;
  end loop;
  update runledger.workers set stopped_at = v_now where worker_id = p_worker_id;
  return v_count;
end;
$$;
comment on function runledger._stop_worker(text) is
  'Graceful worker stop: every run the worker still holds is given back at once (event released, not a recovery attempt): a RUNNING one goes back to PENDING, a CANCELLING one stays CANCELLING without an owner for the next claim to finish its cancel. Marks the worker stopped; returns how many runs it released.';

create function runledger._recover_expired(p_limit int default 1000) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz := runledger.now();
  v_run   runledger.runs;
  v_count int := 0;
  v_attempts int;
begin
  -- SKIP LOCKED: several workers sweep at once without blocking on each other or on
  -- a run whose owner is committing a checkpoint right now.
  for v_run in
    select * from runledger.runs r
     where r.status in ('RUNNING', 'CANCELLING') and r.lease_expires_at < v_now
     order by r.lease_expires_at
     limit p_limit
     for update skip locked
  loop
    v_count := v_count + 1;
    if v_run.status = 'CANCELLING' and runledger._compensations_due(v_run.run_id)
       and v_run.recovery_attempts < v_run.max_recovery_attempts then
      -- Its owner died while cancelling (or stopping), with compensations still to run:
      -- another worker takes the run (still CANCELLING) and finishes them; it never
      -- resumes the work. Each expiry counts an attempt, so a compensation that kills its
      -- worker every time is given up on after max_recovery_attempts (below).
      update runledger.runs set lease_owner = null, lease_expires_at = null, updated_at = v_now,
                                recovery_attempts = v_run.recovery_attempts + 1
       where run_id = v_run.run_id;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'lease_expired', jsonb_build_object('last_owner', v_run.lease_owner, 'cancelling', true,
                                                                'recovery_attempts', v_run.recovery_attempts + 1), v_run.fencing_token, v_now);
      perform runledger._dispatch(v_run.run_id, v_run.queue_name);
    elsif v_run.status = 'CANCELLING' then
      -- Its owner died while cancelling: complete the cancellation instead of resuming the
      -- work (a stopping run ends with its stop_record, see _finish_run). Compensations
      -- still due here were given up on: the evidence and the event say which.
      if runledger._compensations_due(v_run.run_id) then
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        values (v_run.run_id, 'compensations_abandoned',
                jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                                   'compensations', runledger._compensation_summary(v_run.run_id)), v_run.fencing_token, v_now);
      end if;
      perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'CANCELLED', 'CANCELLED', null, null,
        jsonb_build_object('reason', v_run.cancel_reason, 'requested_at', v_run.cancel_requested_at,
                           'completed_by', 'recovery', 'last_owner', v_run.lease_owner), null);
    else
      -- Attempts count the lease expiries since the run last made progress: an execution
      -- that committed a checkpoint under its fencing token starts the count again.
      v_attempts := case when runledger._made_progress(v_run.run_id, v_run.fencing_token) then 0 else v_run.recovery_attempts end;
      if v_attempts + 1 > v_run.max_recovery_attempts then
        -- Through _finish_run (and _finished): the event, the parent's wake-up and the
        -- admission of the next run of a limited queue, in this transaction.
        perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, null,
          jsonb_build_object(
            'recovery_attempts', v_attempts,
            'max_recovery_attempts', v_run.max_recovery_attempts,
            'last_owner', v_run.lease_owner,
            'lease_expired_at', v_run.lease_expires_at),
          'runledger/1');
      else
        update runledger.runs
           set status = 'PENDING', recovery_attempts = v_attempts + 1, updated_at = v_now,
               lease_owner = null, lease_expires_at = null
         where run_id = v_run.run_id;
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        values (v_run.run_id, 'lease_expired',
                jsonb_strip_nulls(jsonb_build_object('last_owner', v_run.lease_owner, 'lease_expired_at', v_run.lease_expires_at,
                                   'recovery_attempt', v_attempts + 1,
                                   'progress_reset', case when v_attempts <> v_run.recovery_attempts then true end)),
                v_run.fencing_token, v_now);
        perform runledger._make_runnable(v_run.run_id, 0);
      end if;
    end if;
  end loop;

  -- A worker silent for two lease lengths is dead; its runs were (or are being) recovered above.
  update runledger.workers w set stopped_at = v_now
   where w.stopped_at is null and w.last_heartbeat_at < v_now - make_interval(secs => 2 * w.lease_ms / 1000.0);
  return v_count;
end;
$$;
comment on function runledger._recover_expired(int) is
  'Sweeper, run by every live worker: each RUNNING run whose lease expired goes back to PENDING counting one recovery attempt and is re-dispatched, or, past max_recovery_attempts, to DEAD_LETTER with its termination record (through _finish_run: parent woken, queue slot freed). Attempts count expiries since the last progress: an expired execution that committed a checkpoint under its fencing token (_made_progress) starts the count again at 1. A CANCELLING one with compensations due is left without an owner for the next claim (counting an attempt; past max_recovery_attempts they are given up on, event compensations_abandoned); without, or given up on, it ends CANCELLED (or with its stop_record). Marks silent workers stopped. Returns how many runs it handled.';

create function runledger._retry_run(p_run_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run     runledger.runs;
  v_dropped jsonb;
  v_reset   jsonb;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('retry_run: run %L not found', p_run_id);
  end if;
  if v_run.status not in ('DEAD_LETTER', 'FAILED') then
    raise exception using errcode = 'RL005',
      message = format('retry_run: run %s is %s; only DEAD_LETTER and FAILED runs can be retried', p_run_id, v_run.status);
  end if;
  -- The failed step that ended the run is run again; every successful checkpoint stays.
  delete from runledger.steps s
   where s.run_id = p_run_id and s.status = 'FAILED'
     and s.seq = (select max(seq) from runledger.steps where run_id = p_run_id)
  returning jsonb_build_object('seq', s.seq, 'name', s.name, 'error', s.error) into v_dropped;
  -- A failed operation at that step is callable again: the ledger row goes back to PLANNED
  -- (same operation_id and idempotency key, no attempt made yet); the failure it held is
  -- kept in the 'retried' event. An UNKNOWN one stays UNKNOWN (reconcile or an operator settles it).
  update runledger.operations o
     set status = 'PLANNED', attempts = 0, error = null, result = null, finished_at = null, resolved_by = null,
         updated_at = runledger.now()
    from (select * from runledger.operations
           where run_id = p_run_id and seq = (v_dropped->>'seq')::int and status = 'FAILED' for update) old
   where o.operation_id = old.operation_id
  returning jsonb_build_object('operation_id', old.operation_id, 'name', old.name, 'idempotency_key', old.idempotency_key,
                               'attempts', old.attempts, 'error', old.error, 'resolved_by', old.resolved_by) into v_reset;

  update runledger.runs
     set status = 'PENDING', error = null, output = null, finished_at = null, updated_at = runledger.now(),
         recovery_attempts = 0, termination_reason = null, termination_evidence = null,
         terminated_at = null
   where run_id = p_run_id;
  -- The old termination record is kept in the history.
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'retried', jsonb_strip_nulls(jsonb_build_object(
            'previous_status', v_run.status, 'termination_reason', v_run.termination_reason,
            'termination_evidence', v_run.termination_evidence, 'error', v_run.error,
            'dropped_failed_step', v_dropped, 'reset_operation', v_reset)), v_run.fencing_token);
  perform runledger._make_runnable(p_run_id, 0);
  return 'PENDING';
end;
$$;
comment on function runledger._retry_run(text) is
  'The action behind runledger.retry_run (which records it in audit_log): Operator action: a DEAD_LETTER or FAILED run goes back to PENDING with its successful checkpoints intact (the last failed step runs again; a FAILED operation at that step goes back to PLANNED, called again with the same idempotency key) and recovery attempts reset; the old termination record and the operation''s failure stay in events. Returns the new status.';

insert into runledger.migrations (version, name) values (3, '0003_recovery');
