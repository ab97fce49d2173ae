-- 0031_int8_delays_and_argument_checks: delays in int8 milliseconds, instants checked, and
-- coded errors for arguments that raised a raw SQLSTATE (docs/waits.md#how-far-ahead).
--
-- Defines:
--   runledger._ms_after(from, ms, what)     from + ms milliseconds; RL003 unless ms is from 0 to 2^53 - 1
--                                           and the result is a time PostgreSQL holds
--   runledger._instant(text, what)          a text as a finite timestamptz; RL003 for anything else
--                                           ('infinity', '-infinity', unparsable text)
--   runledger._give_back_grants(functions)  for a migration that dropped and created functions again:
--                                           the roles role_functions names get execute on them back
-- Redefines (released in 0004, 0006, 0007, 0008, 0016; sql/README.md rule 3):
--   runledger._dispatch, runledger._make_runnable,
--   runledger._operation_park, runledger._retry_wait, runledger._record_retry
--                                           their delay parameter is bigint (was int); dropped and
--                                           created again, their grants given back
--                                           (_release_run's is bigint in 0034_dead_letter_errors.sql,
--                                           which redefines it)
--   runledger._wait                         its wake time through _ms_after / _instant, its timer's
--                                           delay a bigint
--   runledger._send_signal                  RL003 for a signal id that is not 1 to 200 characters
--   runledger.resolve_operation             RL003 for a null status
-- (0019_tracing.sql's _start_template, _start and start_runs take the same rules in place:
-- run_at and deadline through _instant, run_in_ms through _ms_after, bigint delays, and
-- RL003 for an option they do not know.)
--
-- Every delay was an int of milliseconds, so anything more than 2^31 ms (24.86 days) ahead
-- overflowed its cast (22003): a wait of 25 days, a signal or approval timeout of 30, any
-- wait of a run whose deadline was further away, a retry backoff, a delayed start. The
-- worker took the failed wait for an infrastructure failure and released the run, again
-- and again, until it was dead-lettered; start_run raised 22003. A worker of the previous
-- build keeps working on this schema: it calls these functions with named parameters, and
-- an int argument casts to bigint.

create function runledger._ms_after(p_from timestamptz, p_ms numeric, p_what text) returns timestamptz
language plpgsql stable as $$
begin
  if p_ms is null then
    return null;
  end if;
  -- NaN compares above every number, so it fails the upper bound. 2^53 - 1 is the largest
  -- whole number a JSON number (a JavaScript one) holds exactly: about 285,000 years.
  if not (p_ms >= 0 and p_ms <= 9007199254740991) then
    raise exception using errcode = 'RL003',
      message = format('%s: %s ms is not a duration (milliseconds from 0 to 9007199254740991, about 285,000 years)', p_what, p_ms);
  end if;
  -- make_interval does not check its range on every server: the bound is checked here,
  -- against the last instant timestamptz holds (294276-12-31, 9224318016000 s after 1970).
  if extract(epoch from p_from) * 1000 + p_ms >= 9224318016000000 then
    raise exception using errcode = 'RL003',
      message = format('%s: %s ms after %s is later than any time PostgreSQL holds (294276-12-31)', p_what, p_ms, p_from);
  end if;
  return p_from + make_interval(secs => p_ms / 1000.0);
end;
$$;
comment on function runledger._ms_after(timestamptz, numeric, text) is
  'p_from plus p_ms milliseconds (null for a null p_ms). RL003, naming p_what, for a p_ms that is negative, NaN or over 9007199254740991 (2^53 - 1), or a result past the last time timestamptz holds (294276-12-31): every duration the engine turns into a time goes through it.';

create function runledger._instant(p_value text, p_what text) returns timestamptz
language plpgsql stable as $$
declare
  v_at timestamptz;
begin
  if p_value is null then
    return null;
  end if;
  begin
    v_at := p_value::timestamptz;
  exception when data_exception then
    raise exception using errcode = 'RL003', message = format('%s: %L is not a timestamp', p_what, p_value);
  end;
  if not isfinite(v_at) then
    raise exception using errcode = 'RL003',
      message = format('%s: %L is not a finite timestamp (infinity and -infinity are refused)', p_what, p_value);
  end if;
  return v_at;
end;
$$;
comment on function runledger._instant(text, text) is
  'p_value read as a timestamptz (null for null). RL003, naming p_what, for text that is not a timestamp and for infinity and -infinity.';

-- The delays become bigint: a new signature, so each function is dropped and created again
-- (its grants with it, given back at the end).
drop function runledger._dispatch(text, text, int);
create function runledger._dispatch(p_run_id text, p_queue text, p_delay_ms bigint default 0) returns void
language plpgsql volatile as $$
declare
  v_due timestamptz;
begin
  if p_delay_ms > 0 then
    -- A delayed PENDING run becomes claimable at not_before; a WAITING run already has its wake_at.
    v_due := runledger._ms_after(runledger.now(), p_delay_ms, '_dispatch');
    update runledger.runs set not_before = v_due
     where run_id = p_run_id and status = 'PENDING' and (not_before is null or not_before < v_due);
  end if;
  -- Workers serving the queue claim at once, or arm a timer for the delay ("queue+ms"):
  -- a delay, not a time, so a worker's clock never meets the database's. A worker arms
  -- at most setTimeout's ceiling (24.8 days) and finds a later one by claiming then.
  -- Identical notifications in one transaction are delivered once.
  perform pg_notify('runledger_runnable', p_queue || case when p_delay_ms > 0 then '+' || p_delay_ms else '' end);
end;
$$;
comment on function runledger._dispatch(text, text, bigint) is
  'Announces that a run of queue p_queue is (or after p_delay_ms will be) runnable: sets not_before for a delayed PENDING run and notifies runledger_runnable with the queue name (and "+" the delay in ms). Workers claim from the runs table; a lost notification only delays a run until the next poll.';

drop function runledger._make_runnable(text, int);
create function runledger._make_runnable(p_run_id text, p_delay_ms bigint default 0) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  select * into v_run from runledger.runs where run_id = p_run_id;
  if runledger._queue_limited(v_run.queue_name) then
    update runledger.runs
       set admitted = false,
           not_before = case when p_delay_ms > 0 then runledger._ms_after(runledger.now(), p_delay_ms, '_make_runnable') else not_before end
     where run_id = p_run_id;
    perform runledger._admit(v_run.queue_name);
  else
    if not v_run.admitted then
      update runledger.runs set admitted = true where run_id = p_run_id;
    end if;
    perform runledger._dispatch(p_run_id, v_run.queue_name, p_delay_ms);
  end if;
end;
$$;
comment on function runledger._make_runnable(text, bigint) is
  'Every move of a run into PENDING ends here: dispatched at once (after p_delay_ms) in a queue without limits, else left to admission.';

drop function runledger._operation_park(text, bigint, int, text, int);
create function runledger._operation_park(p_run_id text, p_token bigint, p_seq int, p_operation_id text, p_retry_in_ms bigint)
returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_retry_in_ms, '_operation_park: p_retry_in_ms');
begin
  -- Never a silent retry of a call that may have happened: the run waits (holding nothing)
  -- for resolve_operation, or until the next reconcile attempt when a reconciler said "unknown".
  update runledger.runs
     set status = 'WAITING', wait_kind = 'reconcile', wait_key = p_operation_id, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'waiting_for_reconcile', jsonb_build_object('operation_id', p_operation_id, 'seq', p_seq, 'retry_in_ms', p_retry_in_ms), p_token);
  if least(v_wake, v_run.deadline_at) is not null then
    perform runledger._dispatch(p_run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
  end if;
end;
$$;
comment on function runledger._operation_park(text, bigint, int, text, bigint) is
  'Fenced: an UNKNOWN operation that cannot be settled automatically parks the run WAITING (wait_kind reconcile) until resolve_operation, or until p_retry_in_ms for the next reconcile.';

drop function runledger._record_retry(text, bigint, int, text, int, jsonb, int);
create function runledger._record_retry(p_run_id text, p_token bigint, p_seq int, p_name text, p_attempt int, p_error jsonb, p_delay_ms bigint)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  if v_run.retry_budget is not null and v_run.retries_used + 1 > v_run.retry_budget then
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'retry_budget_exhausted', jsonb_build_object('seq', p_seq, 'name', p_name, 'attempt', p_attempt,
            'retries_used', v_run.retries_used, 'retry_budget', v_run.retry_budget, 'error', p_error), p_token);
    return false;
  end if;
  update runledger.runs set retries_used = retries_used + 1 where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'attempt_failed', jsonb_build_object('seq', p_seq, 'name', p_name, 'attempt', p_attempt, 'error', p_error,
          'retry_in_ms', p_delay_ms), p_token);
  return true;
end;
$$;
comment on function runledger._record_retry(text, bigint, int, text, int, jsonb, bigint) is
  'Fenced: records a failed attempt of a step (its error and the backoff before the next) and spends one retry of the run''s retry budget; false when the budget is used up (the step then fails).';

drop function runledger._retry_wait(text, bigint, int, text, text, int, int);
create function runledger._retry_wait(p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_attempt int, p_delay_ms bigint)
returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run  runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_delay_ms, '_retry_wait: p_delay_ms');
begin
  -- The step position keeps a WAITING row with the attempt reached; the next attempt after
  -- the backoff reads it. The worker is freed meanwhile.
  insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
  values (p_run_id, p_seq, p_name, p_kind, 'WAITING', jsonb_build_object('attempt', p_attempt, 'wake_at', v_wake), p_attempt,
          runledger.now(), runledger.now(), p_token)
  on conflict (run_id, seq) do update set output = excluded.output, attempts = excluded.attempts, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING';
  update runledger.runs
     set status = 'WAITING', wait_kind = 'retry', wait_key = p_name, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  perform runledger._dispatch(p_run_id, v_run.queue_name,
    greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
end;
$$;
comment on function runledger._retry_wait(text, bigint, int, text, text, int, bigint) is
  'Fenced: a backoff too long to sleep in memory becomes a durable wait (wait_kind retry): the step keeps a WAITING row with the attempt reached and the run waits, holding no worker, until the next attempt is due.';

create or replace function runledger._wait(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_spec jsonb)
returns table (done boolean, output jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now      timestamptz := runledger.now();
  v_run      runledger.runs;
  v_step     runledger.steps;
  v_wake_at  timestamptz;
  v_key      text;
  v_signal   runledger.signals;
  v_approval runledger.approvals;
  v_child    runledger.runs;
begin
  perform runledger._fence(p_run_id, p_token);
  select * into v_run from runledger.runs where run_id = p_run_id;

  -- First encounter: the wake time (timeout) is computed once, on the database clock, and kept.
  select * into v_step from runledger.steps where run_id = p_run_id and seq = p_seq;
  if not found then
    if p_spec ? 'until' then
      v_wake_at := runledger._instant(p_spec->>'until', format('run %s: %s %s until', p_run_id, p_kind, p_name));
    elsif p_spec ? 'timeout_ms' then
      if jsonb_typeof(p_spec->'timeout_ms') <> 'number' then
        raise exception using errcode = 'RL003',
          message = format('run %s: %s %s: timeout_ms must be a number of milliseconds, not %s', p_run_id, p_kind, p_name, p_spec->'timeout_ms');
      end if;
      v_wake_at := runledger._ms_after(v_now, (p_spec->>'timeout_ms')::numeric, format('run %s: %s %s timeout_ms', p_run_id, p_kind, p_name));
    end if;
    if p_kind = 'sleep' and v_wake_at is null then
      -- A timer without a wake-up time would wait forever.
      raise exception using errcode = 'RL003', message = format('run %s: sleep %s has no duration or time (spec %s)', p_run_id, p_name, p_spec);
    end if;
    insert into runledger.steps (run_id, seq, name, kind, status, output, started_at, finished_at, fencing_token)
    values (p_run_id, p_seq, p_name, p_kind, 'WAITING',
            jsonb_strip_nulls(jsonb_build_object('wake_at', v_wake_at, 'spec', p_spec)), v_now, v_now, p_token)
    returning * into v_step;
    if p_kind = 'approval' then
      insert into runledger.approvals (request_id, run_id, seq, name, action, evidence, approvers, required, expires_at)
      values (coalesce(p_spec->>'request_id', runledger._new_id()), p_run_id, p_seq, p_name, p_spec->>'action', p_spec->'evidence',
              (select array_agg(a) from jsonb_array_elements_text(p_spec->'approvers') a), coalesce((p_spec->>'required')::int, 1), v_wake_at);
    end if;
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (p_run_id, 'wait_started', jsonb_build_object('seq', p_seq, 'name', p_name, 'kind', p_kind, 'wake_at', v_wake_at), p_token, v_now);
  end if;
  v_wake_at := (v_step.output->>'wake_at')::timestamptz;

  -- Can the wait end now? Its result and the step's completion commit together.
  if p_kind = 'signal' then
    v_key := p_spec->>'topic';
    select * into v_signal from runledger.signals s
     where s.run_id = p_run_id and s.topic = v_key and s.consumed_seq is null
     order by s.received_at, s.signal_id limit 1
     for update;
    if found then
      update runledger.signals set consumed_seq = p_seq, consumed_at = v_now where signal_id = v_signal.signal_id;
      perform runledger._end_wait(p_run_id, p_seq, jsonb_build_object('payload', v_signal.payload, 'signal_id', v_signal.signal_id));
      return query select true, jsonb_build_object('payload', v_signal.payload, 'signal_id', v_signal.signal_id);
      return;
    end if;
  elsif p_kind = 'approval' then
    select * into v_approval from runledger.approvals a where a.run_id = p_run_id and a.seq = p_seq;
    v_key := v_approval.request_id;
    if v_approval.decision is not null then
      perform runledger._end_wait(p_run_id, p_seq, jsonb_build_object(
        'approved', v_approval.decision, 'decidedBy', v_approval.decided_by, 'decidedAt', v_approval.decided_at,
        'note', v_approval.note, 'requestId', v_approval.request_id)
        || case when v_approval.required > 1 then jsonb_build_object('votes', runledger._approval_votes(v_approval.request_id)) else '{}' end);
      return query select s.status = 'SUCCEEDED', s.output from runledger.steps s where s.run_id = p_run_id and s.seq = p_seq;
      return;
    end if;
  elsif p_kind = 'child' then
    v_key := p_spec->>'child_run_id';
    select * into v_child from runledger.runs where run_id = v_key;
    if not found then
      raise exception using errcode = 'RL002', message = format('run %s waits for child %s, which does not exist', p_run_id, v_key);
    end if;
    if runledger.is_terminal(v_child.status) then
      perform runledger._end_wait(p_run_id, p_seq, jsonb_build_object(
        'runId', v_child.run_id, 'status', v_child.status, 'output', v_child.output, 'error', v_child.error,
        'terminationReason', v_child.termination_reason));
      return query select true, s.output from runledger.steps s where s.run_id = p_run_id and s.seq = p_seq;
      return;
    end if;
  end if;

  if v_wake_at is not null and v_wake_at <= v_now then
    -- Timer due (a sleep's end, or a wait's timeout: the wait returns null).
    perform runledger._end_wait(p_run_id, p_seq, case when p_kind = 'sleep' then jsonb_build_object('woke_at', v_now) else jsonb_build_object('timed_out', true) end);
    return query select true, s.output from runledger.steps s where s.run_id = p_run_id and s.seq = p_seq;
    return;
  end if;

  -- Park the run: WAITING, no lease, woken by its timer (the earlier of the wait's wake
  -- time and the run's deadline), a signal, a decision or a child's end. The delay is a
  -- bigint of milliseconds: a timer may be months or years ahead.
  v_wake_at := least(v_wake_at, v_run.deadline_at);
  update runledger.runs
     set status = 'WAITING', wait_kind = case p_kind when 'sleep' then 'timer' else p_kind end, wait_key = v_key,
         wake_at = v_wake_at, lease_owner = null, lease_expires_at = null, updated_at = v_now
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  if v_wake_at is not null then
    perform runledger._dispatch(p_run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from v_wake_at - v_now) * 1000))::bigint);
  end if;
  return query select false, null::jsonb;
end;
$$;
comment on function runledger._wait(text, bigint, int, text, text, jsonb) is
  'A durable wait at step p_seq (sleep, signal, approval, child), in one round trip: fences, records the wait once (its wake time is a checkpoint: until, a finite timestamp, or timeout_ms, milliseconds from 0 to 2^53 - 1 after now; RL003 otherwise), ends it when it can (consuming a signal, reading a decision or a child''s end, or timing out) in the same transaction, else parks the run WAITING without a lease and schedules its timer.';

create or replace function runledger._send_signal(p_run_id text, p_topic text, p_payload jsonb, p_signal_id text default null)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
  v_id  text := coalesce(p_signal_id, runledger._new_id());
begin
  if p_topic is null or p_topic !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_topic) > 100 then
    raise exception using errcode = 'RL003', message = format('send_signal: invalid topic %L', p_topic);
  end if;
  -- The inbox's check (signal_id of 1 to 200 characters) would raise a raw 23514.
  if length(v_id) not between 1 and 200 then
    raise exception using errcode = 'RL003',
      message = format('send_signal: signal_id must be 1 to 200 characters, not %s', length(v_id));
  end if;
  if pg_column_size(p_payload) > runledger._max_payload_bytes() then
    raise exception using errcode = 'RL004', message = format('send_signal: payload over the limit of %s bytes', runledger._max_payload_bytes());
  end if;
  -- Lock the run: a wait being recorded right now either sees this signal or is woken by it.
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('send_signal: run %L not found', p_run_id);
  end if;
  -- A retry of a signal already accepted is answered the same way whatever happened since.
  if exists (select 1 from runledger.signals s where s.signal_id = v_id) then
    return false;
  end if;
  if runledger.is_terminal(v_run.status) then
    raise exception using errcode = 'RL005', message = format('send_signal: run %s already finished (%s)', p_run_id, v_run.status);
  end if;
  insert into runledger.signals (signal_id, run_id, topic, payload) values (v_id, p_run_id, p_topic, p_payload)
  on conflict (signal_id) do nothing;
  if not found then
    return false; -- the same signal_id was accepted before: nothing changes
  end if;
  insert into runledger.events (run_id, kind, detail)
  values (p_run_id, 'signal_received', jsonb_build_object('topic', p_topic, 'signal_id', v_id));
  perform runledger._wake(p_run_id, 'signal', p_topic);
  return true;
end;
$$;
comment on function runledger._send_signal(text, text, jsonb, text) is
  'The action behind runledger.send_signal (which records it in audit_log): Delivers a signal to a run''s durable inbox; returns false (changing nothing) when signal_id was already accepted. Wakes the run if it waits on this topic; otherwise the signal waits for a later wait. Invalid topic or a signal_id that is not 1 to 200 characters: RL003; unknown run: RL002; finished run: RL005.';

create or replace function runledger.resolve_operation(p_operation_id text, p_status text, p_result jsonb default null, p_resolved_by text default null)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_status text;
begin
  -- A null status passed the action's check (null not in (...) is null) and broke the
  -- operations row's not-null constraint (23502).
  if p_status is null then
    raise exception using errcode = 'RL003', message = 'resolve_operation: status must be SUCCEEDED or FAILED, not null';
  end if;
  v_status := runledger._resolve_operation(p_operation_id, p_status, p_result, p_resolved_by);
  -- The result is the caller's data: recorded is that one was given, not its content.
  perform runledger._audit('resolve_operation', (select o.run_id from runledger.operations o where o.operation_id = p_operation_id),
                           p_operation_id, jsonb_build_object('status', p_status, 'with_result', p_result is not null),
                           to_jsonb(v_status), p_resolved_by);
  return v_status;
end;
$$;
comment on function runledger.resolve_operation(text, text, jsonb, text) is
  'Operator action: settles an UNKNOWN operation as SUCCEEDED (with its result) or FAILED, and wakes the run waiting on it. Returns the status set. A status other than SUCCEEDED or FAILED (null included): RL003. Recorded in audit_log.';

-- The dropped functions lost their grants: each role given them by role_functions gets them
-- back (grant_roles() does the same for every role, when the migrating role may run it).
create function runledger._give_back_grants(p_functions text[]) returns void
language plpgsql volatile as $$
declare
  v_grant record;
begin
  for v_grant in
    select f.role_name, p.oid::regprocedure as fn
      from runledger.role_functions f
      join pg_proc p on p.pronamespace = 'runledger'::regnamespace and p.proname = f.function_name
     where f.function_name = any(p_functions)
       and exists (select from pg_roles r where r.rolname = f.role_name)
  loop
    execute format('grant execute on function %s to %I', v_grant.fn, v_grant.role_name);
  end loop;
end;
$$;
comment on function runledger._give_back_grants(text[]) is
  'For a migration that dropped and created functions again (a new signature): each existing role that role_functions gives one of p_functions gets execute on it again.';

select runledger._secure_functions();
select runledger._give_back_grants(array['_dispatch', '_make_runnable', '_operation_park', '_record_retry', '_retry_wait']);

insert into runledger.migrations (version, name) values (31, '0031_int8_delays_and_argument_checks');
