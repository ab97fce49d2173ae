-- 0034_dead_letter_errors: a run that ends DEAD_LETTER carries the last error that put it there.
--
-- Redefines (released in 0002 and 0003; sql/README.md rule 3):
--   runledger._release_run(text, bigint, bigint, text, boolean, jsonb)
--       p_error: the error the worker gives the run back for (class, code, message, SQLSTATE), kept in the
--       event released and, past max_recovery_attempts, in runs.error and evidence.last_error of the dead letter
--   runledger._dead_letter_run(text, bigint, text, jsonb, text, jsonb)
--       p_error: the error the run is dead-lettered for (NON_DETERMINISM's), in runs.error and evidence.last_error
--   runledger._recover_expired(int)
--       a run dead-lettered after its lease expired once too often gets the error LEASE_EXPIRED likewise
-- A worker of the previous release calls the first two without p_error, as before (it defaults to null and is then
-- built from the reason).

drop function runledger._release_run(text, bigint, int, text, boolean);

create function runledger._release_run(p_run_id text, p_token bigint, p_delay_ms bigint, p_reason text,
  p_counts_attempt boolean default false, p_error jsonb default null)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run   runledger.runs;
  v_now   timestamptz := runledger.now();
  v_error jsonb := coalesce(p_error, jsonb_build_object('name', 'Released', 'code', upper(p_reason),
                     'message', format('the worker gave the run back: %s', p_reason)));
begin
  -- By its key, checked after (sql/README.md, "Plans that cannot go stale").
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.fencing_token is distinct from p_token or v_run.status <> 'RUNNING' then
    return false;
  end if;
  if p_counts_attempt and runledger._made_progress(p_run_id, p_token) then
    -- As in _recover_expired: the count is of failures since the run last made progress.
    v_run.recovery_attempts := 0;
  end if;
  if p_counts_attempt and v_run.recovery_attempts + 1 > v_run.max_recovery_attempts then
    -- An execution that keeps failing for infrastructure reasons must not loop forever; the
    -- dead letter says why the last one failed.
    perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, v_error,
      jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                         'last_release', p_reason, 'last_error', v_error),
      'runledger/1');
    return true;
  end if;
  update runledger.runs
     set status = 'PENDING', lease_owner = null, lease_expires_at = null, updated_at = v_now,
         recovery_attempts = v_run.recovery_attempts + case when p_counts_attempt then 1 else 0 end
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, 'released', jsonb_strip_nulls(jsonb_build_object('reason', p_reason, 'delay_ms', p_delay_ms,
                                                                     'counts_attempt', p_counts_attempt, 'error', p_error)),
          p_token, v_now);
  perform runledger._make_runnable(p_run_id, p_delay_ms);
  return true;
end;
$$;
comment on function runledger._release_run(text, bigint, bigint, text, boolean, jsonb) is
  'A worker gives a run back: RUNNING -> PENDING, re-dispatched after p_delay_ms. A graceful stop does not count a recovery attempt; an infrastructure failure does (p_counts_attempt; counting again from 1 when this execution committed a checkpoint, _made_progress), and past max_recovery_attempts the run is dead-lettered instead, with p_error (the error the worker released it for; built from p_reason when null) in runs.error and evidence.last_error. The event released keeps p_error too.';

drop function runledger._dead_letter_run(text, bigint, text, jsonb, text);

create function runledger._dead_letter_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb, p_policy_version text,
  p_error jsonb default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_error jsonb := coalesce(p_error, jsonb_build_object('name', 'DeadLettered', 'code', p_reason,
                     'message', coalesce(p_evidence->>'message', format('dead-lettered: %s', p_reason))));
begin
  perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', p_reason, null, v_error,
    coalesce(p_evidence, '{}'::jsonb) || jsonb_build_object('last_error', v_error), p_policy_version);
end;
$$;
comment on function runledger._dead_letter_run(text, bigint, text, jsonb, text, jsonb) is
  'Fenced move to DEAD_LETTER (e.g. NON_DETERMINISM) with evidence and the error that put it there (p_error, or one built from the reason and evidence.message) in runs.error and evidence.last_error; the run leaves the automatic path until retry_run.';

create or replace function runledger._recover_expired(p_limit int default 1000) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz := runledger.now();
  v_run   runledger.runs;
  v_count int := 0;
  v_attempts int;
  v_error    jsonb;
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
        -- The last error that put it here is the expiry itself (its owner died or hung):
        -- in runs.error and in the evidence, as _release_run records a worker's error.
        v_error := jsonb_build_object('name', 'LeaseExpired', 'code', 'LEASE_EXPIRED',
          'message', format('the lease of worker %s expired at %s without a checkpoint, %s times in a row (max_recovery_attempts %s)',
                            v_run.lease_owner, v_run.lease_expires_at, v_attempts + 1, v_run.max_recovery_attempts));
        perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, v_error,
          jsonb_build_object(
            'recovery_attempts', v_attempts,
            'max_recovery_attempts', v_run.max_recovery_attempts,
            'last_owner', v_run.lease_owner,
            'lease_expired_at', v_run.lease_expires_at,
            'last_error', v_error),
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
  'Sweeper, run by every live worker: each RUNNING run whose lease expired goes back to PENDING counting one recovery attempt and is re-dispatched, or, past max_recovery_attempts, to DEAD_LETTER with its termination record and the error LEASE_EXPIRED (runs.error, evidence.last_error) (through _finish_run: parent woken, queue slot freed). Attempts count expiries since the last progress: an expired execution that committed a checkpoint under its fencing token (_made_progress) starts the count again at 1. A CANCELLING one with compensations due is left without an owner for the next claim (counting an attempt; past max_recovery_attempts they are given up on, event compensations_abandoned); without, or given up on, it ends CANCELLED (or with its stop_record). Marks silent workers stopped. Returns how many runs it handled.';

select runledger._secure_functions();
-- The dropped functions lost their grants: the roles role_functions names get them back.
select runledger._give_back_grants(array['_release_run', '_dead_letter_run']);

insert into runledger.migrations (version, name) values (34, '0034_dead_letter_errors');
