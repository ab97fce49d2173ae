-- 0023_inlined_functions: the pure functions every role may call run as their caller again, so the planner inlines them.
--
-- Redefines (released in 0001 and 0017; sql/README.md rule 3):
--   runledger.now()                 the same clock; its body names pg_catalog's functions and types; the test
--                                   clock's settings are honoured only where the owner switched it on
--   runledger._secure_functions()   as before, except that the pure functions (_pure_functions) run as their caller with no settings
-- Defines:
--   runledger._pure_functions()     the functions of role_functions that read no table and change nothing
--   the column runledger.owner_settings.test_clock   the owner's switch of the test clock (default off)
--   runledger._test_clock_now()     now() of a session that set runledger.fake_now or runledger.clock_offset
--
-- Why: 0017 made every function of role_functions SECURITY DEFINER with a fixed
-- search_path, now(), is_terminal(), run_transitions() and the contract lists included.
-- PostgreSQL never inlines a LANGUAGE sql function that has either, so each call became a
-- call of its own: its body parsed and planned again in every transaction, at every place
-- that calls it. now() is called by nearly every function a worker runs, and
-- run_transitions() by the trigger on every status change; with pgbench, one
-- `select runledger.now()` per transaction cost 0.19 ms against 0.10 ms inlined, and one
-- `select runledger._start_template(...)` 0.34 ms against 0.22 ms. These functions read no
-- table, so running as the owner gives them nothing. Inlined, they are parsed with the
-- caller's search_path: inside a SECURITY DEFINER function that is the fixed one, and a
-- direct caller can only change what its own query computes.

-- The test clock. Any session may set runledger.fake_now and runledger.clock_offset (a
-- setting PostgreSQL does not know is a placeholder every role may set, also through
-- ALTER ROLE ... SET), so they cannot say by themselves that the clock may move: an
-- operator that set fake_now in its own session decided an approval that had expired, and
-- its decision and audit row were dated in the past. They move the clock only where the
-- schema's owner switched the test clock on (owner_settings.test_clock, a table no role may
-- write; runledger/testing switches it on in the test databases it makes).
--
-- now() stays a pure function that is inlined: in a session that set neither setting (every
-- session of a deployment), it is clock_timestamp() after two reads of a setting, as
-- before. Only a session that set one calls _test_clock_now(), which reads the switch (a
-- SECURITY DEFINER function: every role may call it, and only the owner's row decides; its
-- cost is declared 1 so that the plans of the queries that inline now() do not change).
-- Callgrind, PostgreSQL 15, server instructions per evaluation of the inlined now() (the
-- difference of 150,000 and 50,000 evaluations in one backend): 3,167 -> 3,080 in a query
-- over generate_series, 2,530 -> 2,442 as a PL/pgSQL assignment (`v := runledger.now()`,
-- how the engine's functions read it); in a session whose settings were reset to '', 3,991
-- -> 3,903. A session of a test database that set the clock pays for the call instead:
-- 41,500 instructions per evaluation (about 10 us), against 5,466 before.
alter table runledger.owner_settings add column test_clock boolean not null default false;
comment on column runledger.owner_settings.test_clock is
  'The test clock: while true, runledger.now() honours the session settings runledger.fake_now and runledger.clock_offset of every session; while false (the default), it is the database''s clock whatever a session sets. For test databases only (runledger/testing switches it on in the ones it makes).';

create function runledger._test_clock_now() returns timestamptz
language plpgsql volatile parallel safe cost 1 as $$
begin
  if coalesce((select s.test_clock from runledger.owner_settings s), false) then
    return coalesce(nullif(current_setting('runledger.fake_now', true), '')::timestamptz,
                    clock_timestamp() + coalesce(nullif(current_setting('runledger.clock_offset', true), '')::interval, interval '0'));
  end if;
  return clock_timestamp();
end;
$$;
comment on function runledger._test_clock_now() is
  'runledger.now() of a session that set runledger.fake_now or runledger.clock_offset: the setting''s time when the schema''s owner switched the test clock on (owner_settings.test_clock), else clock_timestamp(). Every role may call it (now() is inlined into their queries); it runs as the owner.';

create or replace function runledger.now() returns timestamptz
language sql volatile parallel safe as $$
  select case when coalesce(nullif(pg_catalog.current_setting('runledger.fake_now', true), ''),
                            nullif(pg_catalog.current_setting('runledger.clock_offset', true), '')) is null
              then pg_catalog.clock_timestamp()
              else runledger._test_clock_now() end
$$;
comment on function runledger.now() is
  'Current time for every runledger function: clock_timestamp(). Where the schema''s owner switched the test clock on (owner_settings.test_clock), a session''s setting runledger.fake_now (a frozen instant) or runledger.clock_offset (an interval: a clock running ahead or behind) moves it for that session; elsewhere those settings change nothing. Runs as its caller, so the planner inlines it (0023_inlined_functions.sql).';

create function runledger._pure_functions() returns text[]
language sql immutable as $$
  select array['now', 'is_terminal', 'run_transitions', 'termination_reasons', 'step_kinds', 'wait_kinds']
$$;
comment on function runledger._pure_functions() is
  'The functions of role_functions that read no table and change nothing: they run as their caller with no settings (not SECURITY DEFINER, no fixed search_path), so the planner inlines them into the statements that call them.';

create or replace function runledger._secure_functions() returns void
language plpgsql volatile as $$
declare
  v_fn regprocedure;
  v_pure boolean;
begin
  -- PostgreSQL lets PUBLIC execute every new function; in this schema nobody but the owner
  -- may call anything that is not granted.
  for v_fn in select p.oid::regprocedure from pg_proc p where p.pronamespace = 'runledger'::regnamespace loop
    execute format('revoke all on function %s from public', v_fn);
  end loop;
  -- A granted function runs as the owner, so it must not resolve names through the caller's
  -- search_path: pg_catalog first (no user object shadows a built-in or an operator),
  -- pg_temp last (no temporary table stands in for a runledger table). A pure function
  -- runs as its caller instead: it has nothing to protect, and only then is it inlined.
  for v_fn, v_pure in
    select p.oid::regprocedure, p.proname = any(runledger._pure_functions()) from pg_proc p
     where p.pronamespace = 'runledger'::regnamespace
       and p.proname in (select function_name from runledger.role_functions)
  loop
    if v_pure then
      execute format('alter function %s security invoker reset all', v_fn);
    else
      execute format('alter function %s security definer set search_path = pg_catalog, runledger, pg_temp', v_fn);
    end if;
  end loop;
end;
$$;
comment on function runledger._secure_functions() is
  'Revokes PUBLIC''s execute on every runledger function and makes each function in role_functions SECURITY DEFINER with search_path pg_catalog, runledger, pg_temp, except the pure ones (_pure_functions), which run as their caller with no settings so that they are inlined. Run by the migrations that add functions; needs the schema''s owner.';

-- Every role's queries call _test_clock_now() where they call now() (inlined), and
-- PostgreSQL checks the right to execute it when the query starts, whether or not it is
-- called: every role gets it, here when the roles exist (grant_roles() does the same).
insert into runledger.role_functions (role_name, function_name)
select r, '_test_clock_now' from unnest(array['runledger_worker', 'runledger_operator', 'runledger_reader']) r;
select runledger._secure_functions();
do $$
declare
  v_role text;
begin
  foreach v_role in array array['runledger_worker', 'runledger_operator', 'runledger_reader'] loop
    if exists (select from pg_roles where rolname = v_role) then
      execute format('grant execute on function runledger._test_clock_now() to %I', v_role);
    end if;
  end loop;
end;
$$;

insert into runledger.migrations (version, name) values (23, '0023_inlined_functions');
