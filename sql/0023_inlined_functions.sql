-- 0023_inlined_functions: the pure functions every role may call run as their caller again, so the planner inlines them.
--
-- Redefines (released in 0001 and 0017; sql/README.md rule 3):
--   runledger.now()                 the same clock; its body names pg_catalog's functions and types
--   runledger._secure_functions()   as before, except that the pure functions (_pure_functions) run as their caller with no settings
-- Defines:
--   runledger._pure_functions()     the functions of role_functions that read no table and change nothing
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

create or replace function runledger.now() returns timestamptz
language sql volatile parallel safe as $$
  select coalesce(nullif(pg_catalog.current_setting('runledger.fake_now', true), '')::pg_catalog.timestamptz,
                  pg_catalog.clock_timestamp()
                    + coalesce(nullif(pg_catalog.current_setting('runledger.clock_offset', true), '')::pg_catalog.interval,
                               interval '0'))
$$;
comment on function runledger.now() is
  'Current time for every runledger function: the setting runledger.fake_now when set (tests: a frozen instant), else clock_timestamp() moved by the setting runledger.clock_offset (tests: an interval, a clock running ahead or behind). Runs as its caller, so the planner inlines it (0023_inlined_functions.sql).';

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

select runledger._secure_functions();

insert into runledger.migrations (version, name) values (23, '0023_inlined_functions');
