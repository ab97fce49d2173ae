-- 0014_security: roles, SECURITY DEFINER functions, tenant isolation.
--
-- tables: role_functions, tenant_members
-- indexes: runs_tenant
-- functions: _secure_functions, grant_roles, _tenant_unbound, _session_tenant, _isolated_tables,
--   enable_tenant_isolation, disable_tenant_isolation, _pure_functions, _give_back_grants
-- policies: tenant_isolation, tenant_isolation, tenant_isolation

create table runledger.role_functions (
  role_name     text collate "C" not null check (role_name in ('runledger_worker', 'runledger_operator', 'runledger_reader')),
  function_name text collate "C" not null,
  primary key (role_name, function_name)
);
comment on table runledger.role_functions is
  'Which runledger functions (every overload of the name) each role may execute. runledger.grant_roles() grants exactly these; a function listed here is SECURITY DEFINER with a fixed search_path. Reads of tables (worker, operator) and views (all three) are granted by grant_roles() too.';

create function runledger._secure_functions() returns void
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

create table runledger.tenant_members (
  role_name text collate "C" not null,
  tenant_id text collate "C" not null,
  primary key (role_name, tenant_id)
);
comment on table runledger.tenant_members is
  'Which tenants a role (or any member of it) may act for when tenant isolation is on. A role with rows here sees only those tenants, whatever runledger.tenant it sets; a role with none may name any tenant (the application that connects it chooses). Written by the schema''s owner.';

create function runledger._tenant_unbound() returns boolean
language sql stable security definer set search_path = pg_catalog, runledger, pg_temp as $$
  select coalesce((select r.rolsuper or r.rolbypassrls from pg_roles r where r.rolname = runledger._caller()), false)
      or pg_has_role(runledger._caller(), (select n.nspowner from pg_namespace n where n.nspname = 'runledger'), 'MEMBER')
      or (exists (select from pg_roles r where r.rolname = 'runledger_worker')
          and pg_has_role(runledger._caller(), 'runledger_worker', 'MEMBER'))
$$;
comment on function runledger._tenant_unbound() is
  'True when tenant isolation does not restrict the caller: a superuser or BYPASSRLS role, the schema''s owner (or a member), or a member of runledger_worker. The policies call it once per statement.';

create function runledger._session_tenant() returns text
language sql stable security definer set search_path = pg_catalog, runledger, pg_temp as $$
  select t.tenant
    from (select nullif(current_setting('runledger.tenant', true), '') as tenant) t
   where not exists (select from runledger.tenant_members m join pg_roles r on r.rolname = m.role_name
                      where pg_has_role(runledger._caller(), r.oid, 'MEMBER'))
      or exists (select from runledger.tenant_members m join pg_roles r on r.rolname = m.role_name
                  where m.tenant_id = t.tenant and pg_has_role(runledger._caller(), r.oid, 'MEMBER'))
$$;
comment on function runledger._session_tenant() is
  'The tenant this session acts for: the setting runledger.tenant, when the caller''s roles in tenant_members allow it (or it has none there); else null, which matches no run.';

-- The one comparison: a run is visible to its tenant's sessions and to unbound callers.
create policy tenant_isolation on runledger.runs for all
  using ((select runledger._tenant_unbound()) or tenant_id = (select runledger._session_tenant()))
  with check ((select runledger._tenant_unbound()) or tenant_id = (select runledger._session_tenant()));

create policy tenant_isolation on runledger.approval_votes for all
  using ((select runledger._tenant_unbound()) or exists (select from runledger.approvals a where a.request_id = approval_votes.request_id))
  with check (true);

create policy tenant_isolation on runledger.artifact_blobs for all
  using ((select runledger._tenant_unbound()) or exists (select from runledger.artifacts a where a.sha256 = artifact_blobs.sha256))
  with check (true);

create function runledger._isolated_tables() returns text[]
language sql immutable as $$
  select array['runs', 'steps', 'events', 'signals', 'approvals', 'approval_votes', 'operations', 'step_progress', 'stream_chunks',
               'stream_ends', 'artifacts', 'artifact_blobs', 'session_entries', 'session_waiters', 'sessions', 'audit_log']
$$;
comment on function runledger._isolated_tables() is
  'The tables that hold a run''s data and carry the tenant_isolation policy.';

create function runledger.enable_tenant_isolation() returns text[]
language plpgsql volatile as $$
declare
  v_table text;
  v_exempt text;
begin
  if not exists (select from pg_roles where rolname = 'runledger_worker') then
    raise exception using errcode = '42704',
      message = 'enable_tenant_isolation: the role runledger_worker does not exist (run select runledger.grant_roles() first): without it every worker would be bound to a tenant';
  end if;
  -- PostgreSQL exempts superusers and BYPASSRLS roles from row-level security, forced or
  -- not, and the views and the SECURITY DEFINER functions run as their owner.
  select string_agg(distinct format('%s (owned by %s)', o.what, r.rolname), ', ') into v_exempt
    from (select c.oid::regclass::text as what, c.relowner as owner from pg_class c
           where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'v')
          union all
          select p.oid::regprocedure::text, p.proowner from pg_proc p
           where p.pronamespace = 'runledger'::regnamespace and p.prosecdef) o
    join pg_roles r on r.oid = o.owner
   where r.rolsuper or r.rolbypassrls;
  if v_exempt is not null then
    raise exception using errcode = '55000',
      message = 'enable_tenant_isolation: the runledger schema is owned by a superuser or BYPASSRLS role, which row-level security never restricts, so its views and functions would show every tenant: ' || left(v_exempt, 300),
      hint = 'Migrate as a role that is neither superuser nor BYPASSRLS (docs/security.md, tenant isolation), or hand the schema''s objects to one: REASSIGN OWNED BY old_owner TO new_owner.';
  end if;
  foreach v_table in array runledger._isolated_tables() loop
    execute format('alter table runledger.%I enable row level security, force row level security', v_table);
  end loop;
  return runledger._isolated_tables();
end;
$$;
comment on function runledger.enable_tenant_isolation() is
  'Switches tenant isolation on: row-level security, forced, on every table that holds a run''s data. Readers and operators then see and act on only the runs of the tenant their session names (set runledger.tenant = ''...''; see tenant_members); workers, the owner and BYPASSRLS roles see all. Refused (55000) while the schema''s objects belong to a superuser or BYPASSRLS role, which row-level security cannot restrict. Returns the tables. Run by the schema''s owner.';

create function runledger.disable_tenant_isolation() returns text[]
language plpgsql volatile as $$
declare
  v_table text;
begin
  foreach v_table in array runledger._isolated_tables() loop
    execute format('alter table runledger.%I no force row level security, disable row level security', v_table);
  end loop;
  return runledger._isolated_tables();
end;
$$;
comment on function runledger.disable_tenant_isolation() is
  'Switches tenant isolation off (row-level security off on the tables enable_tenant_isolation() names). Run by the schema''s owner.';

create index runs_tenant on runledger.runs (tenant_id, created_at) where tenant_id is not null;

create function runledger._pure_functions() returns text[]
language sql immutable as $$
  select array['now', 'is_terminal', 'run_transitions', 'termination_reasons', 'step_kinds', 'wait_kinds']
$$;
comment on function runledger._pure_functions() is
  'The functions of role_functions that read no table and change nothing: they run as their caller with no settings (not SECURITY DEFINER, no fixed search_path), so the planner inlines them into the statements that call them.';

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

-- The policies of the tables that hold a run's data: visible through its run (the subquery
-- on runs is filtered by the policy on runs). Writes need no check of their own: no role may
-- write these tables, and the functions that do (as the owner) find the run first, through the
-- policy on runs.
do $$
declare
  v_table text;
begin
  foreach v_table in array array['steps', 'events', 'signals', 'approvals', 'operations', 'step_progress', 'stream_chunks',
                                 'stream_ends', 'artifacts', 'audit_log'] loop
    execute format(
      'create policy tenant_isolation on runledger.%1$I for all
         using ((select runledger._tenant_unbound()) or exists (select from runledger.runs r where r.run_id = %1$I.run_id))
         with check (true)',
      v_table);
  end loop;
end;
$$;

-- Sessions belong to a tenant (their key is (session_id, tenant_id)): the policies compare
-- the session's own tenant.
do $$
declare
  v_table text;
begin
  foreach v_table in array array['sessions', 'session_entries', 'session_waiters'] loop
    execute format(
      'create policy tenant_isolation on runledger.%I for all
         using ((select runledger._tenant_unbound()) or tenant_id = (select runledger._session_tenant()))
         with check (true)',
      v_table);
  end loop;
end;
$$;

-- Read-only functions every role that reads needs: the views call now() and _compensations_due();
-- every role's queries call _test_clock_now() where they call now() (inlined), and PostgreSQL
-- checks the right to execute it when the query starts; every role's sessions evaluate the
-- tenant policies, so every role may call what they call.
insert into runledger.role_functions (role_name, function_name)
select r, f
  from unnest(array['runledger_worker', 'runledger_operator', 'runledger_reader']) r,
       unnest(array['now', '_test_clock_now', 'is_terminal', 'run_transitions', 'termination_reasons', 'step_kinds', 'wait_kinds',
                    '_compensations_due', '_tenant_unbound', '_session_tenant']) f;

-- Reads that are functions rather than views (workers and operators; the reader has the views).
insert into runledger.role_functions (role_name, function_name)
select r, f
  from unnest(array['runledger_worker', 'runledger_operator']) r,
       unnest(array['read_stream', 'session_history', 'prune_due']) f;

-- What the engine calls (src/): starting runs, claiming, checkpoints, waits, operations,
-- streams, sessions, artifacts, finishing, the sweeper, retention, the migrator.
insert into runledger.role_functions (role_name, function_name)
select 'runledger_worker', f
  from unnest(array[
    'start_run', 'start_runs', '_start_many', '_start_claimed', '_start_child', '_register_workflow',
    '_register_worker', '_heartbeat', '_stop_worker', '_recover_expired', '_enforce_deadlines', '_wake_due', '_admit_all',
    '_claim_batch', '_trace_execution', '_commit_batch', '_commit_and_claim', '_checkpoint', '_checkpoint_outcome', '_charge_now',
    '_complete_run', '_complete_with_checkpoint', '_fail_run', '_release_run', '_terminate_run', '_dead_letter_run', '_finish_cancel',
    '_wait', '_retry_wait', '_record_retry', '_heartbeat_step',
    '_operation_begin', '_operation_checkpoint', '_operation_park',
    '_compensation_begin', '_compensation_finish',
    '_stream_write', '_stream_poll',
    '_session_acquire', '_session_append', '_session_release', '_session_leave',
    '_record_artifact', '_artifact_blob_held',
    '_maintenance_begin', '_maintenance_end',
    '_take_migration', '_apply_migration', '_migration_failed']) f;

-- The operator actions, each recorded in audit_log.
insert into runledger.role_functions (role_name, function_name)
select 'runledger_operator', f
  from unnest(array[
    'send_signal', 'decide_approval', 'cancel_run', 'compensate_run', 'retry_run', 'resolve_operation',
    'fork_run', 'migrate_run', 'migrate_runs', 'set_queue', 'prune', 'release_session', 'delete_session',
    'prune_artifact_blobs', 'set_retention', 'clear_retention']) f;

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

insert into runledger.migrations (version, name) values (14, '0014_security');
