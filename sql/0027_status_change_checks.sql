-- 0027_status_change_checks: what a status change of a run costs besides its own row.
--
-- Defines:
--   runledger._transition_pairs()                run_transitions() as 'FROM>TO' texts, folded into a constant
--   the column runs.in_sessions                  true once the run has held a session or queued for one
--   runledger._session_mark_run()                trigger function: sets it (triggers sessions_mark_holder, session_waiters_mark_run)
--   runledger._check_run()                       trigger function of runs_invariants: every rule of a runs row and of its status change
--   the trigger runs_invariants                  before each insert and update of a runs row
-- Replaces: the CHECK constraint runs_invariants (and its function, the 11-argument
-- _check_run), the trigger runs_transition (and _check_transition), and the triggers
-- runs_run_id_insert and runs_run_id_update (and _check_run_id): all by the trigger runs_invariants.
-- Redefines:
--   runledger._session_on_terminal()             trigger function: one lookup, not two, for a run without sessions; it frees
--                                                its sessions under its tenant (_session_free of 0033_tenant_sessions_and_shared_actions.sql)
--   runledger._completed_evidence(...)           STABLE, so the planner inlines it
--   runledger._commit_fast(jsonb)                its completions find their runs by run_id alone
--   the trigger runs_session_release             fires only for a run whose in_sessions is true
--
-- Why: a one-step run that a worker claims and completes changes status twice, and each
-- change called a PL/pgSQL trigger function that ran a query of its own (is the change in
-- run_transitions()?); its end called another that ran two (does it hold or wait for a
-- session?); and its completion called _completed_evidence through the SQL-function
-- executor, because an IMMUTABLE function whose body calls jsonb_build_object (STABLE) is
-- never inlined. Measured with callgrind on PostgreSQL 15 (a single-user backend claiming
-- and completing batches of 16 runs, as a worker's group commit does): 1,252,688
-- instructions per run before, 1,166,606 after (-6.9 %).

-- The check is one expression against a constant: _transition_pairs() (IMMUTABLE, no
-- arguments) is evaluated once when PL/pgSQL plans the expression, and the expression is
-- then evaluated without starting an executor. It was a query over run_transitions() for
-- every status change. (Written into the trigger's WHEN clause instead, the list is a
-- constant that PostgreSQL parses again from its stored text for every statement that
-- changes a status: about 150,000 instructions, more than a single-row change saves.)
-- A migration that changes run_transitions() must also `create or replace` this function:
-- sessions keep the folded constant in their cached plan of the trigger's check, and only a
-- change to _transition_pairs() itself (whose folding the plan depends on) invalidates it.
create function runledger._transition_pairs() returns text[]
language sql immutable as $$
  select array_agg(t.from_status::text || '>' || t.to_status::text order by t.from_status, t.to_status)
    from runledger.run_transitions() t
$$;
comment on function runledger._transition_pairs() is
  'run_transitions() as from>to pairs (''RUNNING>SUCCEEDED''), for _check_run (the trigger runs_invariants).';

-- Every rule of a runs row, and of a change of its status, in one BEFORE ROW trigger.
--
-- They were a CHECK constraint calling _check_run (the row's rules), a trigger with a WHEN
-- clause calling _check_transition (the state machine) and two more for the run_id. For
-- every statement that writes runs, PostgreSQL reads a CHECK constraint's and a WHEN
-- clause's stored expression again from its text and prepares it: for the constraint's
-- call with twelve columns, about 40,000 instructions to parse and 65,000 in all, 10 % of a
-- start_run call (callgrind, PostgreSQL 15); a WHEN clause is the same. A trigger without a
-- WHEN clause has nothing to parse: its function is looked up once per statement and its
-- plans stay cached in the session. One call per row checks everything: the status change
-- first (an UPDATE that changes status, against _transition_pairs(), a constant once
-- planned), then the run_id (on INSERT, or an UPDATE that changes it), then the row's rules.
--
-- Measured with callgrind on PostgreSQL 15 (bench/instructions.sh) against the constraint and
-- the triggers: a start_run call 642,526 -> 594,573 instructions (-7.5 %), a one-step run
-- claimed and completed by group commits of 16 871,038 -> 850,478 (-2.4 %), a start_runs row
-- 113,499 -> 117,544 (+3.6 %: a PL/pgSQL trigger call costs a row more than a call from a
-- CHECK expression; only a bulk start writes enough rows in one statement to feel it).
--
-- One CASE expression names the first broken rule (null when none is): PL/pgSQL evaluates
-- it once per row. The rules, their order, their names and their messages are those of the
-- constraint and the triggers it replaces: SQLSTATE 23514 with the rule's name as the
-- constraint (runs_transition, runs_run_id_check, runs_terminal_has_record, ...).
-- A trigger, unlike a constraint, does not fire under session_replication_role = replica
-- (a logical replica applying rows its origin already checked) and can be disabled by the
-- table's owner; docs/state-machine.md says so.
create function runledger._check_run() returns trigger
language plpgsql as $$
declare
  v_rule text;
begin
  v_rule := case
    when tg_op = 'UPDATE' and old.status is distinct from new.status
         and (old.status::text || '>' || new.status::text) <> all (runledger._transition_pairs()) then 'runs_transition'
    -- An unbounded class plus length(), not {0,199}: a bounded repetition expands into a
    -- large automaton (about 19 us per row against 0.4 us). A run_id never changes: an
    -- UPDATE is checked only if it changes one.
    when (tg_op = 'INSERT' or new.run_id is distinct from old.run_id)
         and (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(new.run_id) > 200) then 'runs_run_id_check'
    when (new.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
         <> (new.finished_at is not null and new.termination_reason is not null) then 'runs_terminal_has_record'
    when new.termination_reason <> all (runledger.termination_reasons()) then 'runs_termination_reason_check'
    when (new.lease_owner is not null) <> (new.lease_expires_at is not null)
         or (new.status not in ('RUNNING', 'CANCELLING') and new.lease_owner is not null)
         or (new.status = 'RUNNING' and new.lease_owner is null) then 'runs_lease_only_when_executing'
    when new.wait_kind <> all (runledger.wait_kinds()) then 'runs_wait_kind_check'
    when (new.status = 'WAITING') <> (new.wait_kind is not null) then 'runs_wait_kind_only_when_waiting'
    when new.budget < 0 then 'runs_budget_check'
    when new.max_steps <= 0 then 'runs_max_steps_check'
    when new.no_progress < 2 then 'runs_no_progress_check'
    when new.retry_budget < 0 then 'runs_retry_budget_check'
    when new.max_recovery_attempts < 0 then 'runs_max_recovery_attempts_check'
  end;
  if v_rule is null then
    return new;
  elsif v_rule = 'runs_transition' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run %s: %s -> %s is not a transition of the run state machine (runledger.run_transitions())',
                       old.run_id, old.status, new.status);
  elsif v_rule = 'runs_run_id_check' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run_id %L is invalid: 1 to 200 letters, digits and _.:- starting with a letter or digit', new.run_id);
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
    message = format('new row for relation "runs" violates check constraint "%s" (status %s)', v_rule, new.status);
end;
$$;
comment on function runledger._check_run() is
  'Trigger function of runs_invariants: every rule a runs row obeys; a broken one raises 23514 naming it: runs_transition (a status change that runledger.run_transitions() does not list), runs_run_id_check (1 to 200 characters of [A-Za-z0-9_.:-] starting with a letter or digit), runs_terminal_has_record (a terminal status, and only one, has finished_at and termination_reason), runs_termination_reason_check, runs_lease_only_when_executing (only RUNNING or CANCELLING runs hold a lease; a RUNNING one always does), runs_wait_kind_check, runs_wait_kind_only_when_waiting, and the ranges of budget, max_steps, no_progress, retry_budget and max_recovery_attempts.';

-- Every row already obeys these rules (the constraint and the triggers held them).
alter table runledger.runs drop constraint runs_invariants;
drop trigger runs_transition on runledger.runs;
drop trigger runs_run_id_insert on runledger.runs;
drop trigger runs_run_id_update on runledger.runs;
drop function runledger._check_run(runledger.run_status, timestamptz, text, text, timestamptz, text, numeric, int, int, int, int);
drop function runledger._check_transition();
drop function runledger._check_run_id();
create trigger runs_invariants before insert or update on runledger.runs
  for each row execute function runledger._check_run();
comment on trigger runs_invariants on runledger.runs is
  'Every rule a runs row and a change of its status obey, in runledger._check_run (see its comment); a broken rule is reported under its own name (SQLSTATE 23514).';

create or replace function runledger._session_on_terminal() returns trigger
language plpgsql as $$
declare
  v_session text;
begin
  -- The trigger's WHEN clause tests only the mark (see runs_session_release below): a run
  -- marked in_sessions whose status changed to anything but an end has nothing to let go.
  if old.status is not distinct from new.status or not runledger.is_terminal(new.status) then
    return null;
  end if;
  -- Most runs that end held no session and queued for none: one query (two index probes)
  -- and nothing written. Two queries cost a second executor start per ended run.
  -- No SET clause: it runs inside the engine's functions and inherits their settings.
  if exists (select 1 from runledger.session_waiters w where w.run_id = new.run_id)
     or exists (select 1 from runledger.sessions s where s.holder_run_id = new.run_id) then
    delete from runledger.session_waiters where run_id = new.run_id;
    -- A run holds only sessions of its own tenant (0033_tenant_sessions_and_shared_actions.sql).
    for v_session in
      select s.session_id from runledger.sessions s where s.holder_run_id = new.run_id order by s.session_id for update
    loop
      perform runledger._session_free(v_session, coalesce(new.tenant_id, ''), 'ended');
    end loop;
  end if;
  return null;
end;
$$;

-- STABLE, as jsonb_build_object is: an IMMUTABLE SQL function whose body calls a STABLE
-- one is not inlined, and ran through the SQL-function executor for every completed run
-- (about 28,000 instructions a call). Its result depends only on its arguments.
create or replace function runledger._completed_evidence(p_steps bigint, p_run runledger.runs, p_verification jsonb) returns jsonb
language sql stable as $$
  select jsonb_build_object('steps', p_steps, 'budget_spent', p_run.budget_spent)
         || case when p_run.budget_used is null then '{}'::jsonb else jsonb_build_object('budget_used', p_run.budget_used) end
         || case when p_verification is null then '{}'::jsonb else jsonb_build_object('verification', p_verification) end
$$;

-- The completions of a group commit, redefined only where they find their runs.
create or replace function runledger._commit_fast(p_items jsonb) returns int[]
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
  v_done      text[];
  i           int;
begin
  -- Every run of the batch, locked in run_id order (as the heartbeat locks them), and
  -- the items that can take the fast path. A run named twice takes the careful path.
  -- (The ids as an array: joined to the JSON instead, the planner guessed 100 items and
  -- read the whole runs table.)
  v_ids := array(select distinct e.value->>'run_id' from jsonb_array_elements(p_items) e);
  -- Each item's run id is read from its JSON once, and the items of each run counted by a
  -- window (one sort): read again per pair of items, in the join's filter and in a count per
  -- item, they cost a batch of n items n² JSON lookups.
  with items as (
    select (e.ordinality - 1)::int as idx, e.value as v, e.value->>'run_id' as run_id,
           count(*) over (partition by e.value->>'run_id') as of_run
      from jsonb_array_elements(p_items) with ordinality e
  ), locked as (
    select r.run_id, r.fencing_token, r.status, r.no_progress, r.deadline_at,
           r.budget, r.budget_spent, r.budget_limits, r.budget_used
      from runledger.runs r
     where r.run_id = any(v_ids)
     order by r.run_id
       for update
  )
  select array_agg(it.idx) into v_fast
    from items it
    join locked l on l.run_id = it.run_id
   where it.v->>'op' in ('checkpoint', 'complete') and it.v ? 'seq'
     -- A charge within every limit is written here too; one that passes a limit stops the
     -- run, which _charge does on the careful path.
     and (runledger._no_charge(it.v->'charge')
          or runledger._charge_fits(l.budget, l.budget_spent, l.budget_limits, l.budget_used, it.v->'charge'))
     and l.fencing_token = (it.v->>'token')::bigint and l.status = 'RUNNING'
     and l.no_progress is null and (l.deadline_at is null or l.deadline_at > v_now)
     and it.of_run = 1;
  if v_fast is null then
    return '{}';
  end if;

  -- The checkpoints (and the last steps of the completions). A position that already
  -- has a checkpoint raises, and the whole fast part is undone.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
  select e.value->>'run_id', (e.value->>'seq')::int, e.value->>'name', e.value->>'kind', e.value->>'status',
         case when e.value->>'op' = 'complete' then e.value->'step_output' else e.value->'output' end,
         e.value->'error', (e.value->>'attempts')::int,
         runledger._started_at(v_now, (e.value->>'started_ms_ago')::bigint), v_now, (e.value->>'token')::bigint
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

  -- The charges of the fast items, each within every limit (checked above).
  update runledger.runs r
     set budget_spent = r.budget_spent + coalesce((c.charge->>'units')::numeric, 0),
         budget_used = case when c.charge - 'units' = '{}'::jsonb then r.budget_used
                            else runledger._add_amounts(r.budget_used, c.charge - 'units') end
    from (select e.value->>'run_id' as run_id, runledger._as_charge(e.value->'charge') as charge
            from jsonb_array_elements(p_items) with ordinality e
           where (e.ordinality - 1)::int = any(v_fast) and not runledger._no_charge(e.value->'charge')) c
   where r.run_id = c.run_id and r.run_id = any(v_ids);

  -- The completions: the run row and its termination record, then the event.
  with done as (
    update runledger.runs r
       set status = 'SUCCEEDED', output = e.value->'output', error = null, finished_at = v_now, updated_at = v_now,
           lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
           termination_reason = 'COMPLETED', terminated_at = v_now,
           policy_version = coalesce(r.policy_version, e.value->>'policy_version'),
           termination_evidence = runledger._completed_evidence(
             (select count(*) from runledger.steps s where s.run_id = r.run_id), r, e.value->'verification')
      from jsonb_array_elements(p_items) with ordinality e
     where (e.ordinality - 1)::int = any(v_fast) and e.value->>'op' = 'complete'
       -- By run_id alone: the completions drive the join (a function scan, estimated at one
       -- row whatever the statistics say), each finding its run by the primary key. With
       -- `and r.run_id = any(v_ids)` too, every probe sorted the whole array again (its
       -- index condition is prepared per probe): 34,000 instructions per completed run.
       and r.run_id = e.value->>'run_id'
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
         array_agg(distinct d.queue_name),
         array_agg(d.run_id)
    into v_parents, v_children, v_queues, v_done
    from done d;
  -- As _finished: tell the callers awaiting these runs (one notification for the batch),
  -- wake the parents, and admit the next runs of queues with limits.
  if v_done is not null then
    perform runledger._announce_finished(v_done);
  end if;
  for i in 1 .. coalesce(cardinality(v_parents), 0) loop
    perform runledger._wake(v_parents[i], 'child', v_children[i]);
  end loop;
  foreach v_queue in array coalesce(v_queues, '{}') loop
    perform runledger._admit_later(v_queue);
  end loop;
  return v_fast;
end;
$$;

-- A run that never held a session nor queued for one has nothing to let go of when it ends,
-- and most runs are such runs. The trigger that lets go (runs_session_release) fired for
-- every run that ended and ran its query: about 34,000 instructions of a drained one-step
-- run's 1,034,000 (callgrind, PostgreSQL 15). Now it fires only for a run marked
-- in_sessions, and the mark is set by triggers on the two tables that make a run a holder
-- or a waiter, so every path that does (acquire, queue, hand-off, a retried run taking its
-- session back, and any later one) marks the run by construction, in the same statement.
-- Each of those paths already holds the run's row locked (its own step's run, or the
-- hand-off's waiter, locked first), and a run already marked is not written again.
alter table runledger.runs add column in_sessions boolean;
comment on column runledger.runs.in_sessions is
  'True once the run has held a session or queued for one (set by triggers on sessions and session_waiters); null otherwise. When such a run ends, runs_session_release lets go of its sessions and its places in their queues.';

create function runledger._session_mark_run() returns trigger
language plpgsql as $$
declare
  v_run_id text;
begin
  if tg_table_name = 'sessions' then
    v_run_id := new.holder_run_id;
  else
    v_run_id := new.run_id;
  end if;
  update runledger.runs set in_sessions = true where run_id = v_run_id and in_sessions is not true;
  return null;
end;
$$;
comment on function runledger._session_mark_run() is
  'Trigger function of sessions_mark_holder and session_waiters_mark_run: marks the run that now holds a session, or queues for one, in_sessions (so runs_session_release fires when it ends).';

create trigger sessions_mark_holder after insert or update of holder_run_id on runledger.sessions
  for each row when (new.holder_run_id is not null) execute function runledger._session_mark_run();
comment on trigger sessions_mark_holder on runledger.sessions is
  'A run that takes a session is marked runs.in_sessions (runledger._session_mark_run).';
create trigger session_waiters_mark_run after insert on runledger.session_waiters
  for each row execute function runledger._session_mark_run();
comment on trigger session_waiters_mark_run on runledger.session_waiters is
  'A run that queues for a session is marked runs.in_sessions (runledger._session_mark_run).';

-- The runs that hold or wait for a session now are marked before the trigger starts to
-- require the mark.
update runledger.runs r set in_sessions = true
 where r.run_id in (select s.holder_run_id from runledger.sessions s where s.holder_run_id is not null
                    union select w.run_id from runledger.session_waiters w);

-- The WHEN clause is the mark alone. PostgreSQL parses a trigger's WHEN clause again from
-- its stored text for every statement that changes a status, and the status tests (a list
-- of five enum constants) made that about 60,000 instructions a statement: 7,800 of a
-- drained one-step run's 850,000 in group commits of 16 (callgrind, PostgreSQL 15), more
-- for a statement that ends one run. _session_on_terminal tests the status itself, and is
-- called only for marked runs.
drop trigger runs_session_release on runledger.runs;
create trigger runs_session_release after update of status on runledger.runs
  for each row when (new.in_sessions)
  execute function runledger._session_on_terminal();
comment on trigger runs_session_release on runledger.runs is
  'A run marked in_sessions that reaches a terminal status lets go of its sessions and leaves their queues (runledger._session_on_terminal).';

select runledger._secure_functions();

insert into runledger.migrations (version, name) values (27, '0027_status_change_checks');
