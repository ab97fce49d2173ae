-- 0027_status_change_checks: what a status change of a run costs besides its own row.
--
-- Defines:
--   runledger._transition_pairs()                run_transitions() as 'FROM>TO' texts, folded into a constant
-- Redefines:
--   runledger._check_transition()                trigger function: one expression, no query
--   runledger._session_on_terminal()             trigger function: one lookup, not two, for a run without sessions
--   runledger._completed_evidence(...)           STABLE, so the planner inlines it
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
create function runledger._transition_pairs() returns text[]
language sql immutable as $$
  select array_agg(t.from_status::text || '>' || t.to_status::text order by t.from_status, t.to_status)
    from runledger.run_transitions() t
$$;
comment on function runledger._transition_pairs() is
  'run_transitions() as from>to pairs (''RUNNING>SUCCEEDED''), for _check_transition.';

create or replace function runledger._check_transition() returns trigger
language plpgsql as $$
begin
  if (old.status::text || '>' || new.status::text) <> all (runledger._transition_pairs()) then
    raise exception using errcode = '23514', constraint = 'runs_transition', table = 'runs', schema = 'runledger',
      message = format('run %s: %s -> %s is not a transition of the run state machine (runledger.run_transitions())',
                       old.run_id, old.status, new.status);
  end if;
  return new;
end;
$$;

create or replace function runledger._session_on_terminal() returns trigger
language plpgsql as $$
declare
  v_session text;
begin
  -- Most runs that end held no session and queued for none: one query (two index probes)
  -- and nothing written. Two queries cost a second executor start per ended run.
  -- No SET clause: it runs inside the engine's functions and inherits their settings.
  if exists (select 1 from runledger.session_waiters w where w.run_id = new.run_id)
     or exists (select 1 from runledger.sessions s where s.holder_run_id = new.run_id) then
    delete from runledger.session_waiters where run_id = new.run_id;
    for v_session in
      select s.session_id from runledger.sessions s where s.holder_run_id = new.run_id order by s.session_id for update
    loop
      perform runledger._session_free(v_session, 'ended');
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

select runledger._secure_functions();

insert into runledger.migrations (version, name) values (27, '0027_status_change_checks');
