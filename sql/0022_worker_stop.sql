-- 0022_worker_stop: a graceful stop gives back the CANCELLING runs it holds too (docs/operations.md#stopping-a-worker-sigterm-the-grace-period-exit-codes).
--
-- Redefines (released in 0003; sql/README.md rule 3):
--   runledger._stop_worker(text)   also a CANCELLING run the stopping worker holds: left without an owner for the next claim
-- The signature and result are unchanged: a worker of the previous release calls it as before.

create or replace function runledger._stop_worker(p_worker_id text) returns int
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

-- create or replace drops SECURITY DEFINER and the fixed search_path: set them again.
select runledger._secure_functions();

insert into runledger.migrations (version, name) values (22, '0022_worker_stop');
