-- 0018_tenants: tenant isolation by row-level security.
--
--   runledger.tenant_members               which tenants a role may act for (none listed: any it names)
--   runledger._tenant_unbound()            true for callers isolation does not restrict: workers, the owner, superusers
--   runledger._session_tenant()            the tenant this session acts for: the setting runledger.tenant, if the caller may
--   policies tenant_isolation              on every table that holds a run's data, active once isolation is enabled
--   runledger.enable_tenant_isolation()    switches row-level security on (forced, so views and functions obey it too)
--   runledger.disable_tenant_isolation()   switches it off
--
-- A run's tenant is runs.tenant_id (0001_schema.sql), set at start (option tenant_id, else the
-- session's runledger.tenant) and inherited by child runs and forks. Once isolation is on, a
-- reader or operator sees and acts on only the runs of the tenant its session names
-- (`set runledger.tenant = 'acme'`), and a session that names none sees no run. Workers
-- are not restricted: a worker runs every tenant's workflows. The policies compare tenants
-- on runs only; every other table is visible through its run (`exists` on runs, which is
-- itself filtered), so one comparison decides everything. Row-level security is forced, so
-- it also holds inside views (owned by the schema's owner) and SECURITY DEFINER functions:
-- an operator's cancel_run of another tenant's run finds no run (RL002).

create table runledger.tenant_members (
  role_name text not null,
  tenant_id text not null,
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

create function runledger._check_not_tenant_bound(p_action text) returns void
language plpgsql stable as $$
begin
  if (select c.relrowsecurity from pg_class c where c.oid = 'runledger.runs'::regclass) and not runledger._tenant_unbound() then
    raise exception using errcode = '42501',
      message = format('%s: acts on every tenant; with tenant isolation on it needs an operator that is not bound to a tenant (the schema''s owner, or a BYPASSRLS role)', p_action);
  end if;
end;
$$;
comment on function runledger._check_not_tenant_bound(text) is
  'Refuses (42501) an action on what all tenants share (set_queue) when tenant isolation is on and the caller is bound to a tenant.';

-- The one comparison: a run is visible to its tenant's sessions and to unbound callers.
create policy tenant_isolation on runledger.runs for all
  using ((select runledger._tenant_unbound()) or tenant_id = (select runledger._session_tenant()))
  with check ((select runledger._tenant_unbound()) or tenant_id = (select runledger._session_tenant()));

-- Everything else is visible through its run (the subquery on runs is filtered by the policy above).
-- Writes need no check of their own: no role may write these tables, and the functions that do
-- (as the owner) find the run first, through the policy on runs.
do $$
declare
  v_table text;
begin
  foreach v_table in array array['steps', 'events', 'signals', 'approvals', 'operations', 'step_progress', 'stream_chunks',
                                 'stream_ends', 'artifacts', 'session_entries', 'session_waiters', 'audit_log'] loop
    execute format(
      'create policy tenant_isolation on runledger.%1$I for all
         using ((select runledger._tenant_unbound()) or exists (select from runledger.runs r where r.run_id = %1$I.run_id))
         with check (true)',
      v_table);
  end loop;
end;
$$;
create policy tenant_isolation on runledger.approval_votes for all
  using ((select runledger._tenant_unbound()) or exists (select from runledger.approvals a where a.request_id = approval_votes.request_id))
  with check (true);
create policy tenant_isolation on runledger.sessions for all
  using ((select runledger._tenant_unbound())
         or exists (select from runledger.runs r where r.run_id in (sessions.holder_run_id, sessions.last_holder_run_id))
         or exists (select from runledger.session_entries e where e.session_id = sessions.session_id))
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

-- Every role's sessions evaluate the policies, so every role may call what they call.
insert into runledger.role_functions (role_name, function_name)
select r, f
  from unnest(array['runledger_worker', 'runledger_operator', 'runledger_reader']) r,
       unnest(array['_tenant_unbound', '_session_tenant']) f;
select runledger._secure_functions();
do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  end if;
end;
$$;

create index runs_tenant on runledger.runs (tenant_id, created_at) where tenant_id is not null;

insert into runledger.migrations (version, name) values (18, '0018_tenants');
