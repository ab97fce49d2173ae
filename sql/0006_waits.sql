-- 0006_waits: durable waits: timers, signals, approvals, child runs.
--
-- tables: signals, approvals, approval_votes
-- indexes: signals_unconsumed
-- functions: _wake, _end_wait, _wait, _send_signal, _approval_votes, _decide_approval, _start_child,
--   _wake_parent, _wake_due

create table runledger.signals (
  signal_id    text collate "C" primary key check (length(signal_id) between 1 and 200),
  run_id       text collate "C" not null references runledger.runs (run_id) on delete cascade,
  topic        text collate "C" not null,
  payload      jsonb,
  received_at  timestamptz not null default runledger.now(),
  consumed_seq int,
  consumed_at  timestamptz
);
comment on table runledger.signals is
  'Durable signal inbox. A signal_id is accepted once; a signal sent before the run waits is kept until a wait on its topic consumes it (consumed_seq = the consuming step).';

create index signals_unconsumed on runledger.signals (run_id, topic, received_at) where consumed_seq is null;

create table runledger.approvals (
  request_id   text collate "C" primary key,
  run_id       text collate "C" not null references runledger.runs (run_id) on delete cascade,
  seq          int not null,
  name         text collate "C" not null,
  action       text collate "C" not null,
  evidence     jsonb,
  -- Names given by deciders, or database roles (checked by the deciding role's membership).
  approvers    text[] collate "C",
  -- How many approving decisions end the wait (requires: { count, of }); one rejection ends it at once.
  required     int not null default 1 check (required >= 1),
  requested_at timestamptz not null default runledger.now(),
  expires_at   timestamptz,
  decision     boolean,
  decided_by   text collate "C",
  -- Who decided, as the database knows it: the login (session_user) and the role it acted as (runledger._caller(): SET ROLE's role, else the login).
  decided_db_user text collate "C",
  decided_db_role text collate "C",
  decided_at   timestamptz,
  note         text collate "C",
  unique (run_id, seq),
  constraint approvals_decision_complete check ((decision is null) = (decided_at is null and decided_by is null))
);
comment on table runledger.approvals is
  'Human approval requests: what is asked (action, evidence), who may decide (approvers; null = anyone), until when, and the decision kept as audit evidence (who by the name given, decided_db_user and decided_db_role as the database knows them, when, note).';

-- The decisions on a request that needs more than one (requires: { count, of }).
create table runledger.approval_votes (
  request_id text collate "C" not null references runledger.approvals (request_id) on delete cascade,
  -- Who: the name given, or for a role approver the login that decided.
  voter      text collate "C" not null,
  approved   boolean not null,
  note       text collate "C",
  db_user    text collate "C" not null default session_user,
  db_role    text collate "C" not null default runledger._caller(),
  decided_at timestamptz not null default runledger.now(),
  primary key (request_id, voter)
);
comment on table runledger.approval_votes is
  'Each decision on an approval request that needs more than one (approvals.required > 1): who (voter: the name given, or the login for a role approver), approve or reject, note, login and role, when. The request is decided when required approvals are in, or at the first rejection.';

create function runledger._wake(p_run_id text, p_kind text, p_key text) returns boolean
language plpgsql volatile as $$
declare
  v_run runledger.runs;
begin
  -- Lock the run first. A transaction parking it right now (its _wait holds the row) has
  -- not committed WAITING yet, and under READ COMMITTED the UPDATE below would skip a row
  -- whose committed version is still RUNNING without waiting for it: the wake-up would be
  -- lost and the run would wait forever. Locked, this statement waits for the parking to
  -- commit, and the UPDATE (a new snapshot) then sees it.
  perform 1 from runledger.runs where run_id = p_run_id for update;
  -- Compare-and-set: only a run still waiting for exactly this thing is woken.
  update runledger.runs
     set status = 'PENDING', wait_kind = null, wait_key = null, wake_at = null, updated_at = runledger.now()
   where run_id = p_run_id and status = 'WAITING' and wait_kind = p_kind and wait_key is not distinct from p_key
  returning * into v_run;
  if not found then
    return false;
  end if;
  insert into runledger.events (run_id, kind, detail) values (p_run_id, 'woken', jsonb_build_object('wait_kind', p_kind, 'key', p_key));
  perform runledger._make_runnable(p_run_id, 0);
  return true;
end;
$$;
comment on function runledger._wake(text, text, text) is
  'Moves a run WAITING for (kind, key) back to PENDING and dispatches it; false when it is not waiting for that.';

create function runledger._end_wait(p_run_id text, p_seq int, p_output jsonb) returns void
language plpgsql volatile as $$
begin
  update runledger.steps set status = 'SUCCEEDED', output = p_output, finished_at = runledger.now()
   where run_id = p_run_id and seq = p_seq and status = 'WAITING';
end;
$$;
comment on function runledger._end_wait(text, int, jsonb) is 'Marks the wait step at p_seq finished with its result.';

create function runledger._wait(
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

create function runledger._send_signal(p_run_id text, p_topic text, p_payload jsonb, p_signal_id text default null)
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

create function runledger._approval_votes(p_request_id text) returns jsonb
language sql stable as $$
  select coalesce(jsonb_agg(jsonb_build_object('decidedBy', v.voter, 'approved', v.approved, 'note', v.note, 'decidedAt', v.decided_at)
                            order by v.decided_at, v.voter), '[]')
    from runledger.approval_votes v where v.request_id = p_request_id
$$;
comment on function runledger._approval_votes(text) is
  'The decisions on a request, in order, as the waiting run receives them (decidedBy, approved, note, decidedAt).';

create function runledger._decide_approval(p_request_id text, p_approved boolean, p_decided_by text, p_note text default null)
returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_approval runledger.approvals;
  v_recorded boolean := false;
  v_by_role  boolean := false;
  v_voter    text;
  v_yes      int;
begin
  if p_approved is null or p_decided_by is null or length(p_decided_by) = 0 then
    raise exception using errcode = 'RL003', message = 'decide_approval: approved and decided_by are required';
  end if;
  select * into v_approval from runledger.approvals where request_id = p_request_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('decide_approval: request %L not found', p_request_id);
  end if;
  if v_approval.decision is null and exists (
       select 1 from runledger.runs r where r.run_id = v_approval.run_id and runledger.is_terminal(r.status)) then
    raise exception using errcode = 'RL005', message = format('decide_approval: the run of request %s already finished', p_request_id);
  end if;
  if v_approval.decision is null then
    if v_approval.approvers is not null then
      -- An approver that is a database role is met by the deciding role's membership, never by
      -- the name given; any other approver by the name given.
      v_by_role := exists (select 1 from unnest(v_approval.approvers) a join pg_roles g on g.rolname = a
                            where pg_has_role(runledger._caller(), g.oid, 'MEMBER'));
      if not v_by_role and not exists (select 1 from unnest(v_approval.approvers) a
                                        where a = p_decided_by and not exists (select 1 from pg_roles g where g.rolname = a)) then
        raise exception using errcode = 'RL007',
          message = format('decide_approval: %L may not decide request %s (allowed: %s; decided as login %s, role %s)',
                           p_decided_by, p_request_id, array_to_string(v_approval.approvers, ', '), session_user, runledger._caller());
      end if;
    end if;
    if v_approval.expires_at is not null and v_approval.expires_at <= runledger.now() then
      raise exception using errcode = 'RL005', message = format('decide_approval: request %s expired at %s', p_request_id, v_approval.expires_at);
    end if;
    if v_approval.required > 1 then
      -- One vote per person: the name given, or the login for a role approver (one login is one vote whatever name it gives).
      v_voter := case when v_by_role then session_user::text else p_decided_by end;
      insert into runledger.approval_votes (request_id, voter, approved, note) values (p_request_id, v_voter, p_approved, p_note)
      on conflict (request_id, voter) do nothing;
      if not found then
        return jsonb_build_object('recorded', false, 'request_id', p_request_id, 'approved', null, 'required', v_approval.required,
                                  'votes', runledger._approval_votes(p_request_id));
      end if;
      insert into runledger.events (run_id, kind, detail)
      values (v_approval.run_id, 'approval_vote',
              jsonb_build_object('request_id', p_request_id, 'approved', p_approved, 'voter', v_voter, 'note', p_note,
                                 'db_user', session_user, 'db_role', runledger._caller()));
      select count(*) into v_yes from runledger.approval_votes v where v.request_id = p_request_id and v.approved;
      if p_approved and v_yes < v_approval.required then
        -- Recorded; the request waits for more approvals.
        return jsonb_build_object('recorded', true, 'request_id', p_request_id, 'approved', null, 'required', v_approval.required,
                                  'votes', runledger._approval_votes(p_request_id));
      end if;
    end if;
    update runledger.approvals
       set decision = p_approved, decided_by = p_decided_by, decided_at = runledger.now(), note = p_note,
           decided_db_user = session_user, decided_db_role = runledger._caller()
     where request_id = p_request_id
    returning * into v_approval;
    v_recorded := true;
    insert into runledger.events (run_id, kind, detail)
    values (v_approval.run_id, 'approval_decided',
            jsonb_build_object('request_id', p_request_id, 'approved', p_approved, 'decided_by', p_decided_by, 'note', p_note,
                               'db_user', session_user, 'db_role', runledger._caller()));
    perform runledger._wake(v_approval.run_id, 'approval', p_request_id);
  end if;
  -- The first decision wins; a repeated call answers with the standing decision.
  return jsonb_build_object('recorded', v_recorded, 'request_id', p_request_id, 'approved', v_approval.decision,
                            'decided_by', v_approval.decided_by, 'decided_at', v_approval.decided_at, 'note', v_approval.note)
         || case when v_approval.required > 1
                 then jsonb_build_object('required', v_approval.required, 'votes', runledger._approval_votes(p_request_id))
                 else '{}' end;
end;
$$;
comment on function runledger._decide_approval(text, boolean, text, text) is
  'The action behind runledger.decide_approval (which records it in audit_log): Decides a pending approval request (approvers that are database roles are checked by the deciding role''s membership; a request with required > 1 records a vote per person and is decided at the required approvals or the first rejection). The first decision wins and stays as audit evidence; later calls return it with recorded = false. An approver outside the request''s list: RL007; expired request: RL005. Wakes the waiting run.';

create function runledger._start_child(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_workflow text, p_input jsonb, p_options jsonb)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_parent  runledger.runs;
  v_options jsonb;
  v_child   text;
begin
  perform runledger._fence(p_run_id, p_token);
  select * into v_parent from runledger.runs where run_id = p_run_id;
  -- The child's id derives from the parent and the step position, and the child row and
  -- the checkpoint commit together: a replay can never start a second child.
  v_options := coalesce(p_options, '{}') || jsonb_build_object('run_id', p_run_id || '.' || p_seq, 'parent_run_id', p_run_id);
  if v_parent.deadline_at is not null and not (v_options ? 'deadline') then
    v_options := v_options || jsonb_build_object('deadline', v_parent.deadline_at);
  end if;
  v_child := runledger.start_run(p_workflow, p_input, v_options);
  insert into runledger.steps (run_id, seq, name, kind, status, output, started_at, fencing_token)
  values (p_run_id, p_seq, p_name, 'child_start', 'SUCCEEDED', jsonb_build_object('runId', v_child), runledger.now(), p_token);
  return v_child;
end;
$$;
comment on function runledger._start_child(text, bigint, int, text, text, jsonb, jsonb) is
  'Starts a child run (id = parent id || ''.'' || seq, parent_run_id set, parent''s deadline inherited) and checkpoints its id, in one transaction.';

create function runledger._wake_parent(p_child_run_id text) returns boolean
language plpgsql volatile as $$
declare
  v_parent text;
begin
  select r.parent_run_id into v_parent from runledger.runs r where r.run_id = p_child_run_id;
  if v_parent is null then
    return false;
  end if;
  return runledger._wake(v_parent, 'child', p_child_run_id);
end;
$$;
comment on function runledger._wake_parent(text) is
  'Called when a run reaches a terminal state: wakes its parent if the parent waits for it.';

create function runledger._wake_due(p_limit int default 1000, p_grace_ms int default 0) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run   runledger.runs;
  v_count int := 0;
begin
  -- Workers claim the due timers of the queues they serve (_claim_batch). This sweep
  -- covers queues no live worker claims from, and clocks moved with runledger.fake_now in tests.
  for v_run in
    select * from runledger.runs r
     where r.status = 'WAITING' and r.wake_at <= runledger.now() - make_interval(secs => p_grace_ms / 1000.0)
     order by r.wake_at
     limit p_limit
     for update skip locked
  loop
    if runledger._wake(v_run.run_id, v_run.wait_kind, v_run.wait_key) then
      v_count := v_count + 1;
    end if;
  end loop;
  return v_count;
end;
$$;
comment on function runledger._wake_due(int, int) is
  'Sweeper: wakes WAITING runs whose wake time passed more than p_grace_ms ago (workers claim due timers themselves; this covers queues no live worker claims from, and clocks moved by runledger.fake_now). Returns how many.';

insert into runledger.migrations (version, name) values (6, '0006_waits');
