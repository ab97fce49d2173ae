-- 0011_hot_path: the same rules, cheaper to check on every transition.
--
-- A LANGUAGE sql function that PostgreSQL cannot inline is parsed and planned again
-- on every call in a new transaction, and each run transition called several: the
-- CHECK constraint on runs.status (is_terminal), _queue_limited, _wake_parent,
-- _end_wait, _fail_run. Profiles of a worker draining one-step runs spent about a
-- quarter of the server's time there. PL/pgSQL caches its plans for the session, so
-- these become PL/pgSQL (same names, arguments and results), and the constraint
-- spells its list out.

-- PostgreSQL parses and prepares every CHECK constraint of a table again for each
-- statement that writes it (from its stored node tree), and runs had ten, with long
-- lists of names: a profile of a draining worker put a fifth of the server's time
-- there. The same rules now sit in one PL/pgSQL function called by one constraint: a
-- small node tree to prepare, and a cached function to run. A row that breaks a rule
-- fails as before, with SQLSTATE 23514 and the name of the rule it broke.
create function runledger._check_run(
  p_status runledger.run_status, p_finished_at timestamptz, p_termination_reason text,
  p_lease_owner text, p_lease_expires_at timestamptz, p_wait_kind text,
  p_budget numeric, p_max_steps int, p_no_progress int, p_retry_budget int, p_max_recovery_attempts int)
returns boolean
language plpgsql immutable as $$
declare
  v_rule text;
begin
  if (p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
     <> (p_finished_at is not null and p_termination_reason is not null) then
    v_rule := 'runs_terminal_has_record';
  elsif p_termination_reason not in ('COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET',
                                     'NO_PROGRESS', 'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM') then
    v_rule := 'runs_termination_reason_check';
  elsif (p_lease_owner is not null) <> (p_lease_expires_at is not null)
     or (p_status not in ('RUNNING', 'CANCELLING') and p_lease_owner is not null)
     or (p_status = 'RUNNING' and p_lease_owner is null) then
    v_rule := 'runs_lease_only_when_executing';
  elsif p_wait_kind not in ('timer', 'signal', 'approval', 'child', 'retry', 'reconcile') then
    v_rule := 'runs_wait_kind_check';
  elsif (p_status = 'WAITING') <> (p_wait_kind is not null) then
    v_rule := 'runs_wait_kind_only_when_waiting';
  elsif p_budget < 0 then
    v_rule := 'runs_budget_check';
  elsif p_max_steps <= 0 then
    v_rule := 'runs_max_steps_check';
  elsif p_no_progress < 2 then
    v_rule := 'runs_no_progress_check';
  elsif p_retry_budget < 0 then
    v_rule := 'runs_retry_budget_check';
  elsif p_max_recovery_attempts < 0 then
    v_rule := 'runs_max_recovery_attempts_check';
  else
    return true;
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
    message = format('new row for relation "runs" violates check constraint "%s" (status %s)', v_rule, p_status);
end;
$$;
comment on function runledger._check_run(runledger.run_status, timestamptz, text, text, timestamptz, text, numeric, int, int, int, int) is
  'The invariants of a runs row, checked by its constraint runs_invariants; a broken one raises 23514 naming the rule: runs_terminal_has_record (a terminal status, and only one, has finished_at and termination_reason), runs_termination_reason_check, runs_lease_only_when_executing (only RUNNING or CANCELLING runs hold a lease; a RUNNING one always does), runs_wait_kind_check, runs_wait_kind_only_when_waiting, and the ranges of budget, max_steps, no_progress, retry_budget and max_recovery_attempts.';

alter table runledger.runs
  drop constraint runs_terminal_has_record,
  drop constraint runs_termination_reason_check,
  drop constraint runs_lease_only_when_executing,
  drop constraint runs_wait_kind_check,
  drop constraint runs_wait_kind_only_when_waiting,
  drop constraint runs_budget_check,
  drop constraint runs_max_steps_check,
  drop constraint runs_no_progress_check,
  drop constraint runs_retry_budget_check,
  drop constraint runs_max_recovery_attempts_check,
  add constraint runs_invariants check (runledger._check_run(
    status, finished_at, termination_reason, lease_owner, lease_expires_at, wait_kind,
    budget, max_steps, no_progress, retry_budget, max_recovery_attempts));
comment on constraint runs_invariants on runledger.runs is
  'Every rule a runs row obeys, in runledger._check_run (see its comment); a broken rule is reported under its own name.';

-- The same for steps, written once per checkpoint.
create function runledger._check_step(p_seq int, p_kind text, p_status text) returns boolean
language plpgsql immutable as $$
declare
  v_rule text;
begin
  if p_seq < 0 then
    v_rule := 'steps_seq_check';
  elsif p_kind not in ('step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child') then
    v_rule := 'steps_kind_check';
  elsif p_status not in ('SUCCEEDED', 'FAILED', 'WAITING') then
    v_rule := 'steps_status_check';
  else
    return true;
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'steps', schema = 'runledger',
    message = format('new row for relation "steps" violates check constraint "%s" (kind %s, status %s)', v_rule, p_kind, p_status);
end;
$$;
comment on function runledger._check_step(int, text, text) is
  'The invariants of a steps row, checked by its constraint steps_invariants; a broken one raises 23514 naming the rule: steps_seq_check (seq >= 0), steps_kind_check, steps_status_check (SUCCEEDED, FAILED or WAITING).';

alter table runledger.steps
  drop constraint steps_seq_check,
  drop constraint steps_kind_check,
  drop constraint steps_status_check,
  add constraint steps_invariants check (runledger._check_step(seq, kind, status));
comment on constraint steps_invariants on runledger.steps is
  'Every rule a steps row obeys, in runledger._check_step (see its comment); a broken rule is reported under its own name.';

create or replace function runledger._queue_limited(p_queue text) returns boolean
language plpgsql stable parallel safe as $$
begin
  return exists (select 1 from runledger.queues q
                  where q.name = p_queue
                    and (q.concurrency is not null or q.per_key_concurrency is not null
                         or q.rate_limit_max is not null or q.paused));
end;
$$;

create or replace function runledger._wake_parent(p_child_run_id text) returns boolean
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

create or replace function runledger._end_wait(p_run_id text, p_seq int, p_output jsonb) returns void
language plpgsql volatile as $$
begin
  update runledger.steps set status = 'SUCCEEDED', output = p_output, finished_at = runledger.now()
   where run_id = p_run_id and seq = p_seq and status = 'WAITING';
end;
$$;

create or replace function runledger._fail_run(p_run_id text, p_token bigint, p_error jsonb, p_policy_version text)
returns void language plpgsql volatile as $$
begin
  perform runledger._finish_run(p_run_id, p_token, 'FAILED', 'FAILED', null, p_error, null, p_policy_version);
end;
$$;

create or replace function runledger._dead_letter_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb, p_policy_version text)
returns void language plpgsql volatile as $$
begin
  perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', p_reason, null, null, p_evidence, p_policy_version);
end;
$$;

-- runs.run_id was checked by a regular expression on every UPDATE of a run (PostgreSQL
-- evaluates every CHECK constraint on every update); an id never changes, so it is
-- checked where one is written: on insert, and on the rare update of the id itself.
alter table runledger.runs drop constraint runs_run_id_check;
create function runledger._check_run_id() returns trigger
language plpgsql as $$
begin
  raise exception using errcode = '23514',
    message = format('run_id %L is invalid: 1 to 200 letters, digits and _.:- starting with a letter or digit', new.run_id);
end;
$$;
comment on function runledger._check_run_id() is
  'Trigger function: rejects a run_id that is not 1 to 200 characters of [A-Za-z0-9_.:-] starting with a letter or digit (the old runs_run_id_check).';
create trigger runs_run_id_insert before insert on runledger.runs
  for each row when (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$') execute function runledger._check_run_id();
create trigger runs_run_id_update before update of run_id on runledger.runs
  for each row when (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$') execute function runledger._check_run_id();

-- _claim_batch looks for CANCELLING runs without an owner in every claim; without an
-- index of their own the planner walked every executing run of the queue to find none.
create index runs_cancelling_unowned on runledger.runs (queue_name) where status = 'CANCELLING' and lease_owner is null;

-- Checkpoint and finish without the statements they repeated: the run row read by the
-- fence is reused instead of being read again, and a parent or queue admission is looked
-- at only when the run has one.
create function runledger._checkpoint_row(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_output jsonb, p_error jsonb, p_attempts int, p_started_at timestamptz, p_charge numeric default 0)
returns runledger.runs
language plpgsql volatile as $$
declare
  v_now  timestamptz := runledger.now();
  v_run  runledger.runs := runledger._fence(p_run_id, p_token, v_now);
  v_hash text;
begin
  if v_run.status = 'CANCELLING' and p_started_at >= v_run.cancel_requested_at then
    -- Only a step already running when the cancel was committed may still record its result.
    raise exception using errcode = 'RL008', message = format('run %s: step %s started after the cancel request', p_run_id, p_name);
  end if;
  if v_run.no_progress is not null and p_status = 'SUCCEEDED' then
    v_hash := md5(coalesce(p_output::text, ''));
  end if;
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token, output_hash)
  -- finished_at is the time the deadline was checked against (fence), not a later one.
  values (p_run_id, p_seq, p_name, p_kind, p_status, p_output, p_error, p_attempts, p_started_at, v_now, p_token, v_hash)
  -- A step that waited between attempts (durable retry backoff) left a WAITING row here.
  on conflict (run_id, seq) do update
     set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
         finished_at = excluded.finished_at, fencing_token = excluded.fencing_token, output_hash = excluded.output_hash
   where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
  if not found then
    raise exception using errcode = 'RL010', message = format('run %s: step %s already has a checkpoint', p_run_id, p_seq);
  end if;
  -- Termination policies are checked atomically with the checkpoint that trips them.
  if p_charge <> 0 then
    v_run := runledger._charge(v_run, p_charge, p_name, p_seq);
  end if;
  if v_hash is not null and v_run.status in ('RUNNING', 'CANCELLING') then
    if runledger._check_progress(v_run, p_name, p_seq, v_hash) then
      v_run.status := 'TERMINATED';
    end if;
  end if;
  return v_run;
end;
$$;
comment on function runledger._checkpoint_row(text, bigint, int, text, text, text, jsonb, jsonb, int, timestamptz, numeric) is
  'The body of _checkpoint: fenced checkpoint write (see _checkpoint), returning the run row as it is after the checkpoint (its status says whether a policy ended it).';

create or replace function runledger._checkpoint(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_output jsonb, p_error jsonb, p_attempts int, p_started_at timestamptz, p_charge numeric default 0)
returns table (pid int, run_status text)
language plpgsql volatile as $$
begin
  run_status := (runledger._checkpoint_row(p_run_id, p_token, p_seq, p_name, p_kind, p_status, p_output, p_error,
                                           p_attempts, p_started_at, p_charge)).status;
  pid := pg_backend_pid();
  return next;
end;
$$;

-- What every move to a terminal status does after the run row itself: its event, its
-- parent's wake-up, and admission of the next run of a queue with limits.
create function runledger._finished(
  p_run_id text, p_token bigint, p_status runledger.run_status, p_reason text, p_error jsonb, p_evidence jsonb,
  p_parent text, p_queue text, p_now timestamptz)
returns void
language plpgsql volatile as $$
begin
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, case p_status when 'DEAD_LETTER' then 'dead_lettered' else lower(p_reason) end,
          jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason, 'error', p_error, 'evidence', p_evidence)), p_token, p_now);
  -- As _wake_parent and _slot_freed, without reading the row again.
  if p_parent is not null then
    perform runledger._wake(p_parent, 'child', p_run_id);
  end if;
  if runledger._queue_limited(p_queue) then
    perform runledger._admit(p_queue);
  end if;
end;
$$;
comment on function runledger._finished(text, bigint, runledger.run_status, text, jsonb, jsonb, text, text, timestamptz) is
  'After a run''s row moved to a terminal status: writes its event, wakes its parent (p_parent) and admits the next run of its queue if the queue has limits.';

create or replace function runledger._finish_run(
  p_run_id text, p_token bigint, p_status runledger.run_status, p_reason text,
  p_output jsonb, p_error jsonb, p_evidence jsonb, p_policy_version text)
returns void
language plpgsql volatile as $$
declare
  v_now    timestamptz := runledger.now();
  v_parent text;
  v_queue  text;
begin
  update runledger.runs
     set status = p_status, output = p_output, error = p_error, finished_at = v_now, updated_at = v_now,
         lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
         termination_reason = p_reason, termination_evidence = p_evidence, terminated_at = v_now,
         policy_version = coalesce(policy_version, p_policy_version)
   where run_id = p_run_id and fencing_token = p_token and status in ('RUNNING', 'CANCELLING')
  returning parent_run_id, queue_name into v_parent, v_queue;
  if not found then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing)', p_run_id, p_token);
  end if;
  perform runledger._finished(p_run_id, p_token, p_status, p_reason, p_error, p_evidence, v_parent, v_queue, v_now);
end;
$$;

create or replace function runledger._complete_with_checkpoint(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_step_output jsonb, p_error jsonb, p_attempts int, p_started_at timestamptz, p_charge numeric,
  p_output jsonb, p_policy_version text)
returns void language plpgsql volatile as $$
declare
  v_now      timestamptz := runledger.now();
  v_run      runledger.runs;
  v_parent   text;
  v_queue    text;
  v_evidence jsonb;
begin
  -- The run's last step and its completion in one transaction (one round trip).
  if p_charge = 0 then
    -- The common case in one statement: the update is the fence (same token, RUNNING,
    -- before the deadline) and the completion. A run with a no-progress limit, a charge
    -- or a cancel under way takes the general path below, which also says what failed.
    update runledger.runs r
       set status = 'SUCCEEDED', output = p_output, error = null, finished_at = v_now, updated_at = v_now,
           lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
           termination_reason = 'COMPLETED', terminated_at = v_now,
           policy_version = coalesce(r.policy_version, p_policy_version),
           -- The step below is not written yet (or only as a retry's WAITING row): count it once.
           termination_evidence = jsonb_build_object(
             'steps', (select count(*) from runledger.steps s where s.run_id = p_run_id and s.seq <> p_seq) + 1,
             'budget_spent', r.budget_spent)
     where r.run_id = p_run_id and r.fencing_token = p_token and r.status = 'RUNNING'
       and r.no_progress is null and (r.deadline_at is null or r.deadline_at > v_now)
    returning r.parent_run_id, r.queue_name, r.termination_evidence into v_parent, v_queue, v_evidence;
    if found then
      insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
      values (p_run_id, p_seq, p_name, p_kind, p_status, p_step_output, p_error, p_attempts, p_started_at, v_now, p_token)
      on conflict (run_id, seq) do update
         set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
             finished_at = excluded.finished_at, fencing_token = excluded.fencing_token
       where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
      if not found then
        raise exception using errcode = 'RL010', message = format('run %s: step %s already has a checkpoint', p_run_id, p_seq);
      end if;
      perform runledger._finished(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', null, v_evidence, v_parent, v_queue, v_now);
      return;
    end if;
  end if;
  -- The checkpoint's fence holds the run's row lock, so the completion needs no second one.
  v_run := runledger._checkpoint_row(p_run_id, p_token, p_seq, p_name, p_kind, p_status, p_step_output, p_error,
                                     p_attempts, p_started_at, p_charge);
  if v_run.status in ('RUNNING', 'CANCELLING') then
    perform runledger._finish_run(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', p_output, null,
      jsonb_build_object('steps', (select count(*) from runledger.steps s where s.run_id = p_run_id),
                         'budget_spent', v_run.budget_spent),
      p_policy_version);
  end if;
end;
$$;

-- Group commit: a worker sends the checkpoints and completions of its concurrent runs
-- that are ready at the same moment in one call, so they share one round trip and one
-- commit.
--
-- The common items (a plain checkpoint, or a completion with its last step, of a
-- RUNNING run under its token, before its deadline, without a charge or a no-progress
-- limit) are written together by _commit_fast, a few statements for the whole batch
-- instead of a few per item. Every other item, and every item of a batch whose fast
-- part failed (it is undone as a whole), goes through the same functions as a single
-- write, each in its own subtransaction: one item's error (a lost lease, a deadline, a
-- cancel) is reported for that item alone and undoes only its own writes.
create function runledger._commit_fast(p_items jsonb) returns int[]
language plpgsql volatile as $$
declare
  v_now       timestamptz := runledger.now();
  v_ids       text[];
  v_fast      int[];
  v_written   int;
  v_parents   text[];
  v_children  text[];
  v_queues    text[];
  v_queue     text;
  i           int;
begin
  -- Every run of the batch, locked in run_id order (as the heartbeat locks them), and
  -- the items that can take the fast path. A run named twice takes the careful path.
  -- (The ids as an array: joined to the JSON instead, the planner guessed 100 items and
  -- read the whole runs table.)
  v_ids := array(select distinct e.value->>'run_id' from jsonb_array_elements(p_items) e);
  with items as (
    select (e.ordinality - 1)::int as idx, e.value as v
      from jsonb_array_elements(p_items) with ordinality e
  ), locked as (
    select r.run_id, r.fencing_token, r.status, r.no_progress, r.deadline_at
      from runledger.runs r
     where r.run_id = any(v_ids)
     order by r.run_id
       for update
  )
  select array_agg(it.idx) into v_fast
    from items it
    join locked l on l.run_id = it.v->>'run_id'
   where it.v->>'op' in ('checkpoint', 'complete') and it.v ? 'seq'
     and coalesce((it.v->>'charge')::numeric, 0) = 0
     and l.fencing_token = (it.v->>'token')::bigint and l.status = 'RUNNING'
     and l.no_progress is null and (l.deadline_at is null or l.deadline_at > v_now)
     and (select count(*) from items other where other.v->>'run_id' = it.v->>'run_id') = 1;
  if v_fast is null then
    return '{}';
  end if;

  -- The checkpoints (and the last steps of the completions). A position that already
  -- has a checkpoint raises, and the whole fast part is undone.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
  select e.value->>'run_id', (e.value->>'seq')::int, e.value->>'name', e.value->>'kind', e.value->>'status',
         case when e.value->>'op' = 'complete' then e.value->'step_output' else e.value->'output' end,
         e.value->'error', (e.value->>'attempts')::int, (e.value->>'started_at')::timestamptz, v_now, (e.value->>'token')::bigint
    from jsonb_array_elements(p_items) with ordinality e
   where (e.ordinality - 1)::int = any(v_fast)
  -- A step that waited between attempts (durable retry backoff) left a WAITING row here.
  on conflict (run_id, seq) do update
     set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
         finished_at = excluded.finished_at, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
  get diagnostics v_written = row_count;
  if v_written <> cardinality(v_fast) then
    raise exception using errcode = 'RL010', message = '_commit_fast: a step already has a checkpoint';
  end if;

  -- The completions: the run row and its termination record, then the event.
  with done as (
    update runledger.runs r
       set status = 'SUCCEEDED', output = e.value->'output', error = null, finished_at = v_now, updated_at = v_now,
           lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
           termination_reason = 'COMPLETED', terminated_at = v_now,
           policy_version = coalesce(r.policy_version, e.value->>'policy_version'),
           termination_evidence = jsonb_build_object(
             'steps', (select count(*) from runledger.steps s where s.run_id = r.run_id), 'budget_spent', r.budget_spent)
      from jsonb_array_elements(p_items) with ordinality e
     where (e.ordinality - 1)::int = any(v_fast) and e.value->>'op' = 'complete'
       and r.run_id = e.value->>'run_id' and r.run_id = any(v_ids)
    returning r.run_id, r.fencing_token, r.parent_run_id, r.queue_name, r.termination_evidence
  ), logged as (
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    select d.run_id, 'completed',
           jsonb_strip_nulls(jsonb_build_object('status', 'SUCCEEDED', 'reason', 'COMPLETED', 'error', null, 'evidence', d.termination_evidence)),
           d.fencing_token, v_now
      from done d
  )
  select array_agg(d.parent_run_id) filter (where d.parent_run_id is not null),
         array_agg(d.run_id) filter (where d.parent_run_id is not null),
         array_agg(distinct d.queue_name)
    into v_parents, v_children, v_queues
    from done d;
  -- As _finished: wake the parents, and admit the next runs of queues with limits.
  for i in 1 .. coalesce(cardinality(v_parents), 0) loop
    perform runledger._wake(v_parents[i], 'child', v_children[i]);
  end loop;
  foreach v_queue in array coalesce(v_queues, '{}') loop
    if runledger._queue_limited(v_queue) then
      perform runledger._admit(v_queue);
    end if;
  end loop;
  return v_fast;
end;
$$;
comment on function runledger._commit_fast(jsonb) is
  'The fast part of _commit_batch: locks every run of the batch in run_id order, then writes together the items that are plain checkpoints or completions with their last step of RUNNING runs under their token, before the deadline, without a charge or a no-progress limit (the checks _checkpoint and _complete_with_checkpoint make). Returns the indexes it wrote; raises (and is undone as a whole) when one of them cannot be written.';

create function runledger._commit_batch(p_items jsonb)
returns table (item int, code text, message text, run_status text)
language plpgsql volatile as $$
declare
  v_item jsonb;
  v_index int := 0;
  v_run runledger.runs;
  v_fast int[] := '{}';
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003', message = format('_commit_batch: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  if jsonb_array_length(p_items) > 1 then
    begin
      v_fast := runledger._commit_fast(p_items);
    exception when others then
      v_fast := '{}'; -- undone: every item takes the careful path below
    end;
  end if;
  for v_item in select value from jsonb_array_elements(p_items) loop
    item := v_index;
    code := null;
    message := null;
    run_status := null;
    if v_index = any(v_fast) then
      run_status := case when v_item->>'op' = 'checkpoint' then 'RUNNING' end;
    else
      begin
        if v_item->>'op' = 'checkpoint' then
          v_run := runledger._checkpoint_row(v_item->>'run_id', (v_item->>'token')::bigint, (v_item->>'seq')::int,
            v_item->>'name', v_item->>'kind', v_item->>'status', v_item->'output', v_item->'error',
            (v_item->>'attempts')::int, (v_item->>'started_at')::timestamptz, coalesce((v_item->>'charge')::numeric, 0));
          run_status := v_run.status;
        elsif v_item->>'op' = 'complete' and v_item ? 'seq' then
          perform runledger._complete_with_checkpoint(v_item->>'run_id', (v_item->>'token')::bigint, (v_item->>'seq')::int,
            v_item->>'name', v_item->>'kind', v_item->>'status', v_item->'step_output', v_item->'error',
            (v_item->>'attempts')::int, (v_item->>'started_at')::timestamptz, coalesce((v_item->>'charge')::numeric, 0),
            v_item->'output', v_item->>'policy_version');
        elsif v_item->>'op' = 'complete' then
          perform runledger._complete_run(v_item->>'run_id', (v_item->>'token')::bigint, v_item->'output',
            v_item->>'policy_version', coalesce((v_item->>'charge')::numeric, 0));
        else
          raise exception using errcode = 'RL003', message = format('_commit_batch: unknown op %L', v_item->>'op');
        end if;
      exception when others then
        code := sqlstate;
        message := sqlerrm;
      end;
    end if;
    return next;
    v_index := v_index + 1;
  end loop;
end;
$$;
comment on function runledger._commit_batch(jsonb) is
  'Group commit for a worker: a JSON array of items, each {"op": "checkpoint"} (the arguments of _checkpoint by name) or {"op": "complete"} (those of _complete_run, or of _complete_with_checkpoint when it has "seq"; the step''s result is "step_output"), done in one transaction: the common ones together (_commit_fast), the others one by one, each in a subtransaction. One row per item: its index, the SQLSTATE and message of its error (null when it committed), and for a checkpoint the run''s status after it.';

-- A worker's group commit locks several of its runs in one transaction, in run_id order.
-- Its heartbeat, which renews all its leases in one statement, locks them in the same
-- order, so the two wait for each other instead of deadlocking.
create or replace function runledger._heartbeat(p_worker_id text, p_lease_ms int, p_except text[] default '{}') returns text[]
language plpgsql volatile as $$
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

create or replace function runledger._stop_worker(p_worker_id text) returns int
language plpgsql volatile as $$
declare
  v_run   record;
  v_count int := 0;
begin
  for v_run in
    select r.run_id, r.fencing_token from runledger.runs r
     where r.lease_owner = p_worker_id and r.status = 'RUNNING'
     order by r.run_id
     for update
  loop
    if runledger._release_run(v_run.run_id, v_run.fencing_token, 0, 'worker_stopped', false) then
      v_count := v_count + 1;
    end if;
  end loop;
  update runledger.workers set stopped_at = runledger.now() where worker_id = p_worker_id;
  return v_count;
end;
$$;

-- A worker whose batch completes runs refills the slots they free in the same
-- transaction: one round trip and one commit for both.
create function runledger._commit_and_claim(
  p_items jsonb, p_worker_id text, p_queues text[], p_workflows text[], p_limit int, p_lease_ms int)
returns table (item int, code text, message text, run_status text, claimed jsonb)
language plpgsql volatile as $$
begin
  return query select b.item, b.code, b.message, b.run_status, null::jsonb from runledger._commit_batch(p_items) b;
  begin
    -- Rows as _claim_batch returns them (a claimed run each, and the row with only
    -- next_due_at when fewer than p_limit were claimed), one JSON object per row.
    return query select null::int, null::text, null::text, null::text, to_jsonb(c)
      from runledger._claim_batch(p_worker_id, p_queues, p_workflows, p_limit, p_lease_ms) c;
  exception when others then
    -- The items stand; only the claim is lost (its runs stay claimable).
    return query select null::int, sqlstate::text, sqlerrm, null::text, null::jsonb;
  end;
end;
$$;
comment on function runledger._commit_and_claim(jsonb, text, text[], text[], int, int) is
  'Group commit (_commit_batch) and then a claim (_claim_batch) in one transaction. Rows with item set answer the items; rows with item null carry the claim''s rows as JSON in claimed, or, when the claim failed, its SQLSTATE and message (the items are committed regardless).';

-- Admission as in 0008, but each run admitted in a round gets its own admitted_at, in
-- the round's order (priority, fair turns, age): _claim_batch takes a limited queue's
-- admitted runs in that order. With one timestamp for the round, a claim with fewer
-- free slots than the round took the oldest first, and a tenant with a long backlog
-- got ahead of the others again.
create or replace function runledger._admit(p_queue text, p_max int default 1000) returns int
language plpgsql volatile as $$
declare
  v_q      runledger.queues;
  v_now    timestamptz := runledger.now();
  v_active int;
  v_free   int := p_max;
  v_recent int;
  v_run    record;
  v_count  int := 0;
begin
  -- One admitter per queue at a time: the count below and the admissions after it are
  -- then consistent, whatever number of workers and starts run concurrently.
  select * into v_q from runledger.queues where name = p_queue for update;
  if not found or v_q.paused then
    return 0;
  end if;
  if v_q.concurrency is not null then
    select count(*) into v_active from runledger.runs r
     where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted));
    v_free := least(v_free, v_q.concurrency - v_active);
  end if;
  if v_q.rate_limit_max is not null then
    delete from runledger.admissions a
     where a.queue_name = p_queue and a.admitted_at <= v_now - make_interval(secs => v_q.rate_limit_period_ms / 1000.0);
    select count(*) into v_recent from runledger.admissions a where a.queue_name = p_queue;
    v_free := least(v_free, v_q.rate_limit_max - v_recent);
  end if;
  if v_free <= 0 then
    return 0;
  end if;

  for v_run in
    with recursive keys(k) as (
      -- The distinct concurrency keys with runs waiting, by skip scan over runs_admission_key:
      -- a few index probes per tenant, whatever the backlog (null key counts as '').
      select min(coalesce(r.concurrency_key, '')) from runledger.runs r
       where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
      union all
      select (select min(coalesce(r.concurrency_key, '')) from runledger.runs r
               where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
                 and coalesce(r.concurrency_key, '') > keys.k)
        from keys where keys.k is not null),
    active as (
      select coalesce(r.concurrency_key, '') as k, count(*) as n from runledger.runs r
       where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted))
       group by 1),
    candidates as (
      -- Each key's turn: its place among its own pending runs, after the ones it already
      -- has running. Ordering by turn interleaves keys: a tenant with a burst of 50,000
      -- runs cannot starve one with 10.
      select c.*, row_number() over (partition by keys.k order by c.priority, c.created_at, c.run_id) + coalesce(a.n, 0) as turn
        from keys
        cross join lateral (
          select r.run_id, r.priority, r.created_at, r.workflow_name, r.workflow_version from runledger.runs r
           where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
             and coalesce(r.concurrency_key, '') = keys.k and (r.not_before is null or r.not_before <= v_now)
           order by r.priority, r.created_at, r.run_id
           limit v_free) c
        left join active a on a.k = keys.k
       where keys.k is not null)
    select c.* from candidates c
     where v_q.per_key_concurrency is null or c.turn <= v_q.per_key_concurrency
     order by c.priority, c.turn, c.created_at, c.run_id
     limit v_free
  loop
    -- One microsecond apart, in the order chosen here: workers claim admitted runs by
    -- admitted_at, so a claim smaller than this round keeps its fairness.
    update runledger.runs set admitted = true, admitted_at = v_now + v_count * interval '1 microsecond' where run_id = v_run.run_id;
    perform runledger._dispatch(v_run.run_id, runledger._task_identifier(p_queue, v_run.workflow_name, v_run.workflow_version));
    if v_q.rate_limit_max is not null then
      insert into runledger.admissions (queue_name, admitted_at) values (p_queue, v_now);
    end if;
    v_count := v_count + 1;
  end loop;
  return v_count;
end;
$$;

insert into runledger.migrations (version, name) values (11, '0011_hot_path');
