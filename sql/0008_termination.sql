-- 0008_termination: cancel, deadlines, budgets, step and no-progress limits.
--
-- indexes: runs_deadline
-- functions: _cancel_children, _stop_unowned, _stop_for_compensations, _cancel_run, _finish_cancel,
--   _terminate_run, _charge, _no_charge, _as_charge, _charge_fits, _add_amounts, _charge_now,
--   _check_progress, _deadline_evidence, _enforce_deadlines

-- Deadlines are enforced by a sweep over runs that hold no worker.
create index runs_deadline on runledger.runs (deadline_at) where status in ('PENDING', 'WAITING') and deadline_at is not null;

create function runledger._cancel_children(p_run_id text, p_reason text) returns int
language plpgsql volatile as $$
declare
  v_child text;
  v_count int := 0;
begin
  for v_child in
    select r.run_id from runledger.runs r
     where r.parent_run_id = p_run_id and not runledger.is_terminal(r.status)
  loop
    perform runledger._cancel_run(v_child, p_reason);
    v_count := v_count + 1;
  end loop;
  return v_count;
end;
$$;
comment on function runledger._cancel_children(text, text) is 'Cancels every unfinished child run of p_run_id (and, through cancel_run, theirs). Returns how many.';

create function runledger._stop_unowned(p_run_id text, p_status runledger.run_status, p_reason text, p_evidence jsonb)
returns boolean
language plpgsql volatile as $$
declare
  v_now timestamptz := runledger.now();
  v_run runledger.runs;
begin
  if p_status = 'TERMINATED' and runledger._compensations_due(p_run_id) then
    -- A policy stop of a run that did things to undo: a worker claims it (CANCELLING,
    -- without an owner) to run its compensations, then it ends with this record.
    select * into v_run from runledger.runs where run_id = p_run_id and status in ('PENDING', 'WAITING') for update;
    if not found then
      return false;
    end if;
    perform runledger._stop_for_compensations(v_run, p_status, p_reason, p_evidence, null, false);
    return true;
  end if;
  update runledger.runs
     set status = p_status, finished_at = v_now, updated_at = v_now, terminated_at = v_now,
         termination_reason = p_reason, termination_evidence = p_evidence,
         wait_kind = null, wait_key = null, wake_at = null
   where run_id = p_run_id and status in ('PENDING', 'WAITING');
  if not found then
    return false;
  end if;
  -- A pending approval is left undecided; the approval inbox lists only waiting runs.
  perform runledger._slot_freed(p_run_id);
  insert into runledger.events (run_id, kind, detail, at)
  values (p_run_id, case p_status when 'CANCELLED' then 'cancelled' else lower(p_reason) end,
          jsonb_build_object('status', p_status, 'reason', p_reason, 'evidence', p_evidence), v_now);
  perform pg_notify('runledger_finished', p_run_id);
  perform runledger._cancel_children(p_run_id, format('parent %s ended %s', p_run_id, p_reason));
  perform runledger._wake_parent(p_run_id);
  return true;
end;
$$;
comment on function runledger._stop_unowned(text, runledger.run_status, text, jsonb) is
  'Ends a run that holds no worker (PENDING or WAITING) with a termination record, so no worker claims it again; cancels its children, wakes its parent. A TERMINATED stop of a run with compensations due makes it CANCELLING without an owner instead (_stop_for_compensations): a worker claims it, runs them, and it ends with that record.';

-- A run whose work is cut short (a policy stop, or compensate_run after it ended) has its
-- compensations run before it ends: it becomes CANCELLING with the record it will end
-- with set aside (stop_record), like a cancel, so the claim, the lease, the heartbeat and
-- recovery of a cancelling run all apply to it unchanged.
create function runledger._stop_for_compensations(
  p_run runledger.runs, p_status runledger.run_status, p_reason text, p_evidence jsonb, p_error jsonb, p_keep_owner boolean)
returns void
language plpgsql volatile as $$
declare
  v_now timestamptz := runledger.now();
begin
  update runledger.runs
     set status = 'CANCELLING', updated_at = v_now,
         stop_record = jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason,
                                                            'evidence', p_evidence, 'error', p_error,
                                                            'stopped_at', v_now, 'was', p_run.status)),
         cancel_requested_at = v_now, cancel_reason = null,
         -- From here recovery counts the attempts at compensating (see _recover_expired).
         recovery_attempts = 0,
         finished_at = null, terminated_at = null, termination_reason = null, termination_evidence = null,
         wait_kind = null, wait_key = null, wake_at = null, admitted = false,
         lease_owner = case when p_keep_owner then lease_owner end,
         lease_expires_at = case when p_keep_owner then lease_expires_at end
   where run_id = p_run.run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run.run_id, 'compensations_due',
          jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason, 'was', p_run.status,
                                               'owner', case when p_keep_owner then p_run.lease_owner end)),
          p_run.fencing_token, v_now);
  if not runledger.is_terminal(p_run.status) then
    perform runledger._cancel_children(p_run.run_id, format('parent %s ended %s', p_run.run_id, p_reason));
  end if;
  if not p_keep_owner then
    perform runledger._dispatch(p_run.run_id, p_run.queue_name);
  end if;
end;
$$;
comment on function runledger._stop_for_compensations(runledger.runs, runledger.run_status, text, jsonb, jsonb, boolean) is
  'A run with compensations due stops as CANCELLING with its final record (status, reason, evidence, error) in stop_record: kept by its owner (p_keep_owner, the owner runs them), or without an owner and dispatched (a worker claims it). _finish_run ends it with that record.';

create function runledger._cancel_run(p_run_id text, p_reason text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
  v_now timestamptz := runledger.now();
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('cancel_run: run %L not found', p_run_id);
  end if;
  if runledger.is_terminal(v_run.status) or v_run.status = 'CANCELLING' then
    return v_run.status; -- nothing to do: the answer is where the run stands
  end if;
  if v_run.status in ('PENDING', 'WAITING') and not runledger._compensations_due(p_run_id) then
    perform runledger._stop_unowned(p_run_id, 'CANCELLED', 'CANCELLED',
      jsonb_build_object('reason', p_reason, 'requested_at', v_now, 'was', v_run.status));
    return 'CANCELLED';
  end if;
  if v_run.status in ('PENDING', 'WAITING') then
    -- It did things that must be undone: a worker takes it (still CANCELLING) to run the
    -- compensations, then ends it CANCELLED. No step of its own runs again.
    update runledger.runs
       set status = 'CANCELLING', cancel_requested_at = v_now, cancel_reason = p_reason, updated_at = v_now,
           wait_kind = null, wait_key = null, wake_at = null
     where run_id = p_run_id;
    insert into runledger.events (run_id, kind, detail, at)
    values (p_run_id, 'cancel_requested', jsonb_build_object('reason', p_reason, 'compensations', true, 'was', v_run.status), v_now);
    perform runledger._cancel_children(p_run_id, format('parent %s cancelled', p_run_id));
    perform runledger._dispatch(p_run_id, v_run.queue_name);
    return 'CANCELLING';
  end if;
  -- RUNNING: the owner is told now (NOTIFY) and at its next checkpoint at the latest; it
  -- stops starting steps, lets the step in flight record its result, and ends the run.
  update runledger.runs
     set status = 'CANCELLING', cancel_requested_at = v_now, cancel_reason = p_reason, updated_at = v_now
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, 'cancel_requested', jsonb_build_object('reason', p_reason, 'owner', v_run.lease_owner), v_run.fencing_token, v_now);
  perform runledger._cancel_children(p_run_id, format('parent %s cancelled', p_run_id));
  perform pg_notify('runledger_cancel', p_run_id);
  return 'CANCELLING';
end;
$$;
comment on function runledger._cancel_run(text, text) is
  'The action behind runledger.cancel_run (which records it in audit_log): Cancels a run: PENDING or WAITING -> CANCELLED at once (timers, dispatches revoked), or CANCELLING when it has compensations to run (a worker runs them); RUNNING -> CANCELLING, its worker is notified and ends it CANCELLED after the step in flight. Children are cancelled too. A finished run is left as it is. Returns the run''s new status.';

create function runledger._finish_cancel(p_run_id text, p_token bigint) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  v_run := runledger._lock_executing(p_run_id, p_token);
  if v_run.status <> 'CANCELLING' then
    raise exception using errcode = 'RL001', message = format('run %s: not CANCELLING under fencing token %s', p_run_id, p_token);
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'CANCELLED', 'CANCELLED', null, null,
    jsonb_build_object('reason', v_run.cancel_reason, 'requested_at', v_run.cancel_requested_at,
                       'steps', (select count(*) from runledger.steps s where s.run_id = p_run_id and s.status <> 'WAITING')),
    null);
end;
$$;
comment on function runledger._finish_cancel(text, bigint) is 'Fenced: the owner of a CANCELLING run ends it CANCELLED with the cancel request as evidence.';

create function runledger._terminate_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  v_run := runledger._lock_executing(p_run_id, p_token);
  if v_run.stop_record is null and runledger._compensations_due(p_run_id) then
    -- Its work was cut short, so what it did is undone first: the owner (it holds the
    -- lease still) runs the compensations as for a cancel, and the run ends TERMINATED
    -- with this record (_finish_run). If the owner dies, recovery hands the run to the
    -- next worker's claim, as for a cancel.
    perform runledger._stop_for_compensations(v_run, 'TERMINATED', p_reason, p_evidence, null, true);
    return 'CANCELLING';
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'TERMINATED', p_reason, null, null, p_evidence, null);
  perform runledger._cancel_children(p_run_id, format('parent %s ended %s', p_run_id, p_reason));
  return 'TERMINATED';
end;
$$;
comment on function runledger._terminate_run(text, bigint, text, jsonb) is
  'Fenced policy stop by the run''s owner: TERMINATED with reason (DEADLINE, MAX_STEPS, BUDGET, NO_PROGRESS) and evidence; children are cancelled. A run with compensations due becomes CANCELLING instead, still owned, with that record as its stop_record: it ends TERMINATED once they have run. Returns the new status.';

create function runledger._charge(p_run runledger.runs, p_charge jsonb, p_step text, p_seq int) returns runledger.runs
language plpgsql volatile as $$
declare
  v_run   runledger.runs;
  v_charge jsonb := runledger._as_charge(p_charge);
  v_units numeric := coalesce((v_charge->>'units')::numeric, 0);
  v_other jsonb := v_charge - 'units';
  v_dim   text;
  v_limit numeric;
  v_spent numeric;
begin
  -- units stay in budget_spent; the other dimensions add up in budget_used.
  update runledger.runs r
     set budget_spent = r.budget_spent + v_units,
         budget_used = case when v_other = '{}'::jsonb then r.budget_used
                            else runledger._add_amounts(r.budget_used, v_other) end
   where r.run_id = p_run.run_id
  returning * into v_run;
  if v_run.budget is not null and v_run.budget_spent > v_run.budget then
    perform runledger._terminate_run(v_run.run_id, v_run.fencing_token, 'BUDGET',
      jsonb_build_object('dimension', 'units', 'limit', v_run.budget, 'budget', v_run.budget, 'spent', v_run.budget_spent,
                         'charge', v_units, 'step', p_step, 'seq', p_seq));
    select * into v_run from runledger.runs where run_id = p_run.run_id;
    return v_run;
  end if;
  -- The first dimension (in a fixed order) past its limit names the stop.
  foreach v_dim in array array['tokens', 'cost_usd', 'tool_calls', 'turns'] loop
    v_limit := (v_run.budget_limits->>v_dim)::numeric;
    v_spent := coalesce((v_run.budget_used->>v_dim)::numeric, 0);
    if v_limit is not null and v_spent > v_limit then
      perform runledger._terminate_run(v_run.run_id, v_run.fencing_token, 'BUDGET',
        jsonb_build_object('dimension', v_dim, 'limit', v_limit, 'spent', v_spent, 'budget_used', v_run.budget_used,
                           'charge', coalesce((v_other->>v_dim)::numeric, 0), 'step', p_step, 'seq', p_seq));
      select * into v_run from runledger.runs where run_id = p_run.run_id;
      return v_run;
    end if;
  end loop;
  return v_run;
end;
$$;
comment on function runledger._charge(runledger.runs, jsonb, text, int) is
  'Adds a charge ({"units": n, "tokens": n, "cost_usd": n, "tool_calls": n, "turns": n}, any subset; a bare number is units) to the run: units to budget_spent, the others to budget_used. Past a limit (budget, or a dimension of budget_limits) the run ends TERMINATED (BUDGET) in the same transaction, with evidence naming the dimension, its limit, what was spent, the charge and the step.';

create function runledger._no_charge(p_charge jsonb) returns boolean
language sql immutable parallel safe as $$
  select p_charge is null or p_charge = '0'::jsonb or p_charge = '{}'::jsonb or jsonb_typeof(p_charge) = 'null'
$$;
comment on function runledger._no_charge(jsonb) is 'True when a charge charges nothing: absent, null, 0 or {}.';

create function runledger._as_charge(p_charge jsonb) returns jsonb
language sql immutable parallel safe as $$
  -- A bare number is a charge of units (as ctx.charge(12) was before dimensions).
  select case when jsonb_typeof(p_charge) = 'number' then jsonb_build_object('units', p_charge) else p_charge end
$$;
comment on function runledger._as_charge(jsonb) is 'A charge as an object of dimensions: a bare number is {"units": n}.';

create function runledger._charge_fits(p_budget numeric, p_spent numeric, p_limits jsonb, p_used jsonb, p_charge jsonb)
returns boolean
language sql immutable parallel safe as $$
  -- True when the charge leaves every dimension within its limit (what _charge would not stop).
  select (p_budget is null or p_spent + coalesce((c->>'units')::numeric, 0) <= p_budget)
         and not exists (
           select 1 from jsonb_each_text(coalesce(p_limits, '{}'::jsonb)) l(dim, lim)
            where coalesce((p_used->>l.dim)::numeric, 0) + coalesce((c->>l.dim)::numeric, 0) > l.lim::numeric)
    from (select runledger._as_charge(p_charge) as c) x
$$;
comment on function runledger._charge_fits(numeric, numeric, jsonb, jsonb, jsonb) is
  'True when adding the charge to a run with these budgets (budget, budget_spent, budget_limits, budget_used) passes no limit: the group commit then writes it on its fast path; otherwise _charge does, and stops the run.';

create function runledger._add_amounts(p_a jsonb, p_b jsonb) returns jsonb
language sql immutable as $$
  select coalesce(jsonb_object_agg(k, coalesce((p_a->>k)::numeric, 0) + coalesce((p_b->>k)::numeric, 0)), '{}'::jsonb)
    from (select jsonb_object_keys(coalesce(p_a, '{}'::jsonb)) union select jsonb_object_keys(coalesce(p_b, '{}'::jsonb))) keys(k)
$$;
comment on function runledger._add_amounts(jsonb, jsonb) is 'The sum per key of two objects of numbers (budget amounts); a key missing on one side counts 0.';

create function runledger._charge_now(p_run_id text, p_token bigint, p_charge jsonb, p_step text, p_seq int)
returns table (run_status text, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  -- The point is to survive the worker's crash, which an unflushed commit does; the WAL
  -- record is flushed with the next synchronous commit (the step's checkpoint) at the
  -- latest. Only a database crash in the WAL writer's delay can lose it. Local to this
  -- transaction, so the caller's own commits are not affected.
  perform set_config('synchronous_commit', 'off', true);
  if not runledger._no_charge(p_charge) then
    v_run := runledger._charge(v_run, p_charge, p_step, p_seq);
  end if;
  return query select v_run.status::text, v_run.budget, v_run.budget_spent, v_run.budget_limits, v_run.budget_used;
end;
$$;
comment on function runledger._charge_now(text, bigint, jsonb, text, int) is
  'Fenced charge committed on its own, not with a checkpoint (ctx.chargeNow: a model''s usage, reported by the provider, that a crash before the step''s checkpoint must not lose). Its commit does not wait for the WAL flush (synchronous_commit off for this transaction only): a worker crash cannot lose it, the next synchronous commit flushes it. Returns the run''s status (TERMINATED or CANCELLING when the charge passed a limit) and its budgets as they stand. With a null or empty charge it only reads them.';

create function runledger._check_progress(p_run runledger.runs, p_step text, p_seq int, p_hash text) returns boolean
language plpgsql volatile as $$
declare
  v_same int;
  v_seqs int[];
begin
  -- The last no_progress results of this step name, newest first: all identical means the
  -- run keeps seeing the same observation (a loop that learns nothing new).
  select count(*) filter (where s.output_hash = p_hash), array_agg(s.seq order by s.seq)
    into v_same, v_seqs
    from (select output_hash, seq from runledger.steps
           where run_id = p_run.run_id and name = p_step and status = 'SUCCEEDED'
           order by seq desc limit p_run.no_progress) s;
  if v_same < p_run.no_progress then
    return false;
  end if;
  perform runledger._terminate_run(p_run.run_id, p_run.fencing_token, 'NO_PROGRESS',
    jsonb_build_object('step', p_step, 'result_hash', p_hash, 'repeats', v_same, 'seqs', v_seqs, 'limit', p_run.no_progress));
  return true;
end;
$$;
comment on function runledger._check_progress(runledger.runs, text, int, text) is
  'No-progress limit: when the last N results of this step name are identical (same hash), ends the run TERMINATED (NO_PROGRESS) with the repeated step as evidence.';

create function runledger._deadline_evidence(p_run runledger.runs, p_now timestamptz) returns jsonb
language sql stable as $$
  select jsonb_build_object('deadline_at', p_run.deadline_at, 'noticed_at', p_now, 'was', p_run.status,
                            'wait_kind', p_run.wait_kind);
$$;
comment on function runledger._deadline_evidence(runledger.runs, timestamptz) is
  'The evidence of a DEADLINE stop of a run that holds no worker, the same wherever it is found (the deadline sweep, a claim): deadline_at, noticed_at, was (PENDING or WAITING), wait_kind (null unless WAITING).';

create function runledger._enforce_deadlines(p_limit int default 1000) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run   runledger.runs;
  v_count int := 0;
  v_now   timestamptz := runledger.now();
begin
  -- Runs that hold no worker are stopped here; an executing run is stopped by its own
  -- worker at its next checkpoint (RL009), or by recovery if that worker died.
  for v_run in
    select * from runledger.runs r
     where r.status in ('PENDING', 'WAITING') and r.deadline_at <= v_now
     order by r.deadline_at
     limit p_limit
     for update skip locked
  loop
    if runledger._stop_unowned(v_run.run_id, 'TERMINATED', 'DEADLINE', runledger._deadline_evidence(v_run, v_now)) then
      v_count := v_count + 1;
    end if;
  end loop;
  return v_count;
end;
$$;
comment on function runledger._enforce_deadlines(int) is
  'Sweeper: PENDING and WAITING runs past their deadline end TERMINATED (DEADLINE), exactly once, with the deadline as evidence. Honours runledger.fake_now. Returns how many.';

insert into runledger.migrations (version, name) values (8, '0008_termination');
