-- 0017_roles: least-privilege database roles.
--
--   runledger.role_functions       which functions each role may call (the lists below)
--   runledger._secure_functions()  no function is callable by PUBLIC; every listed one runs as its owner with a fixed search_path
--   runledger.grant_roles()        creates runledger_worker, runledger_operator, runledger_reader (where allowed) and grants each its list
--
-- The roles:
--   runledger_worker    starts, claims, checkpoints, heartbeats and finishes runs: the functions
--                       the engine's workers and clients call, and reads of every table and view
--   runledger_operator  the operator actions (signal, approve, cancel, compensate, retry, fork,
--                       resolve, migrate, set_queue, prune, sessions, artifact blobs) and reads
--   runledger_reader    the views, nothing else
-- No role may write a table: state changes only through the listed functions, which are
-- SECURITY DEFINER (they run as the schema's owner) with search_path fixed to
-- `pg_catalog, runledger, pg_temp`, so a caller's own schema or temporary table cannot stand in
-- for a built-in or a runledger object. Grant the roles to logins: `grant runledger_worker to app`.

create table runledger.role_functions (
  role_name     text not null check (role_name in ('runledger_worker', 'runledger_operator', 'runledger_reader')),
  function_name text not null,
  primary key (role_name, function_name)
);
comment on table runledger.role_functions is
  'Which runledger functions (every overload of the name) each role may execute. runledger.grant_roles() grants exactly these; a function listed here is SECURITY DEFINER with a fixed search_path. Reads of tables (worker, operator) and views (all three) are granted by grant_roles() too.';

-- Read-only functions every role that reads needs: the views call now() and _compensations_due().
insert into runledger.role_functions (role_name, function_name)
select r, f
  from unnest(array['runledger_worker', 'runledger_operator', 'runledger_reader']) r,
       unnest(array['now', 'is_terminal', 'run_transitions', 'termination_reasons', 'step_kinds', 'wait_kinds',
                    '_compensations_due']) f;

-- Reads that are functions rather than views (workers and operators; the reader has the views).
insert into runledger.role_functions (role_name, function_name)
select r, f
  from unnest(array['runledger_worker', 'runledger_operator']) r,
       unnest(array['read_stream', 'session_history']) f;

-- What the engine calls (src/): starting runs, claiming, checkpoints, waits, operations,
-- streams, sessions, artifacts, finishing, the sweeper, the migrator.
insert into runledger.role_functions (role_name, function_name)
select 'runledger_worker', f
  from unnest(array[
    'start_run', 'start_runs', '_start_claimed', '_start_child', '_register_workflow',
    '_register_worker', '_heartbeat', '_stop_worker', '_recover_expired', '_enforce_deadlines', '_wake_due', '_admit_all',
    '_claim_batch', '_commit_batch', '_commit_and_claim', '_checkpoint', '_checkpoint_outcome', '_charge_now',
    '_complete_run', '_complete_with_checkpoint', '_fail_run', '_release_run', '_terminate_run', '_dead_letter_run', '_finish_cancel',
    '_wait', '_retry_wait', '_record_retry', '_heartbeat_step',
    '_operation_begin', '_operation_checkpoint', '_operation_park',
    '_compensation_begin', '_compensation_finish',
    '_stream_write', '_stream_poll',
    '_session_acquire', '_session_append', '_session_release', '_session_leave',
    '_record_artifact', '_artifact_blob_held',
    '_take_migration', '_apply_migration', '_migration_failed']) f;

-- The operator actions, each recorded in audit_log (0016_audit.sql).
insert into runledger.role_functions (role_name, function_name)
select 'runledger_operator', f
  from unnest(array[
    'send_signal', 'decide_approval', 'cancel_run', 'compensate_run', 'retry_run', 'resolve_operation',
    'fork_run', 'migrate_run', 'migrate_runs', 'set_queue', 'prune', 'release_session', 'delete_session',
    'prune_artifact_blobs']) f;

create function runledger._secure_functions() returns void
language plpgsql volatile as $$
declare
  v_fn regprocedure;
begin
  -- PostgreSQL lets PUBLIC execute every new function; in this schema nobody but the owner
  -- may call anything that is not granted.
  for v_fn in select p.oid::regprocedure from pg_proc p where p.pronamespace = 'runledger'::regnamespace loop
    execute format('revoke all on function %s from public', v_fn);
  end loop;
  -- A granted function runs as the owner, so it must not resolve names through the caller's
  -- search_path: pg_catalog first (no user object shadows a built-in or an operator),
  -- pg_temp last (no temporary table stands in for a runledger table).
  for v_fn in
    select p.oid::regprocedure from pg_proc p
     where p.pronamespace = 'runledger'::regnamespace
       and p.proname in (select function_name from runledger.role_functions)
  loop
    execute format('alter function %s security definer set search_path = pg_catalog, runledger, pg_temp', v_fn);
  end loop;
end;
$$;
comment on function runledger._secure_functions() is
  'Revokes PUBLIC''s execute on every runledger function and makes each function in role_functions SECURITY DEFINER with search_path pg_catalog, runledger, pg_temp. Run by the migrations that add functions; needs the schema''s owner.';

create function runledger.grant_roles()
returns table (role_name text, functions int, relations int)
language plpgsql volatile as $$
declare
  v_role text;
  v_fn regprocedure;
  v_rel regclass;
begin
  foreach v_role in array array['runledger_worker', 'runledger_operator', 'runledger_reader'] loop
    if not exists (select from pg_roles where rolname = v_role) then
      begin
        execute format('create role %I nologin', v_role);
      exception
        when duplicate_object or unique_violation then null;  -- created meanwhile by a migration of another database
        when insufficient_privilege then
          raise exception 'runledger.grant_roles: role % does not exist and % may not create roles', v_role, session_user
            using errcode = '42501',
                  hint = 'Run select runledger.grant_roles() as a role with CREATEROLE (a DBA), or create the roles runledger_worker, runledger_operator and runledger_reader first.';
      end;
    end if;
    execute format('grant usage on schema runledger to %I', v_role);
    -- Start from nothing, so a function taken off a list loses its grant.
    for v_fn in select p.oid::regprocedure from pg_proc p where p.pronamespace = 'runledger'::regnamespace loop
      execute format('revoke all on function %s from %I', v_fn, v_role);
    end loop;
    for v_rel in select c.oid::regclass from pg_class c
                  where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v', 'p', 'm', 'S') loop
      execute format('revoke all on %s from %I', v_rel, v_role);
    end loop;
    for v_fn in
      select p.oid::regprocedure from pg_proc p
       where p.pronamespace = 'runledger'::regnamespace
         and p.proname in (select f.function_name from runledger.role_functions f where f.role_name = v_role)
    loop
      execute format('grant execute on function %s to %I', v_fn, v_role);
    end loop;
    -- Reads: the reader sees the views only; workers and operators read tables and views.
    for v_rel in
      select c.oid::regclass from pg_class c
       where c.relnamespace = 'runledger'::regnamespace
         and (c.relkind = 'v' or (c.relkind in ('r', 'p') and v_role <> 'runledger_reader'))
    loop
      execute format('grant select on %s to %I', v_rel, v_role);
    end loop;
    -- Scheduled workflows: graphile-worker fires cron ticks from its own schema (installed by
    -- migrate before these files), with its own functions and tables.
    if v_role = 'runledger_worker' and exists (select from pg_namespace where nspname = 'graphile_worker') then
      execute 'grant usage on schema graphile_worker to runledger_worker';
      execute 'grant select, insert, update, delete on all tables in schema graphile_worker to runledger_worker';
      execute 'grant usage, select on all sequences in schema graphile_worker to runledger_worker';
      execute 'grant execute on all functions in schema graphile_worker to runledger_worker';
    end if;
    role_name := v_role;
    select count(*) into functions from pg_proc p
     where p.pronamespace = 'runledger'::regnamespace and has_function_privilege(v_role, p.oid, 'execute');
    select count(*) into relations from pg_class c
     where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v', 'p')
       and has_table_privilege(v_role, c.oid, 'select');
    return next;
  end loop;
end;
$$;
comment on function runledger.grant_roles() is
  'Creates the roles runledger_worker, runledger_operator and runledger_reader where missing (needs CREATEROLE) and grants each exactly its functions (runledger.role_functions) and reads (worker and operator: tables and views; reader: views), and the worker graphile-worker''s schema for cron. Idempotent; migrate runs it when the migrating role may create roles, otherwise a DBA runs it. Returns what each role may now execute and read.';

select runledger._secure_functions();

-- Roles are shared by every database of the server. Where the migrating role may create
-- them, do it now; elsewhere (managed services restrict CREATEROLE) a DBA runs grant_roles().
do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: roles not created (% may not create roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (17, '0017_roles');
