-- 0033_tenant_sessions_and_shared_actions: what a tenant owns and what all tenants share
-- (docs/security.md#tenant-isolation, docs/sessions.md#sessions-belong-to-a-tenant).
--
-- Sessions belong to a tenant: a session is keyed by its id and the tenant of the runs that
-- use it, so a run of tenant B that opens the id a run of tenant A opened gets a history of
-- its own, and never reads, waits behind or appends to A's. Runs without a tenant share the
-- key part '' (as before). The public API is unchanged: ctx.session(id) takes the tenant
-- from its run, and the operator functions from the session's runledger.tenant.
--
-- Defines:
--   the columns sessions.tenant_id, session_entries.tenant_id, session_waiters.tenant_id
--                                           the tenant of the session ('' for runs without one)
--   keys                                    sessions (session_id, tenant_id); session_entries
--                                           (session_id, tenant_id, seq); the foreign keys of entries
--                                           and waiters on (session_id, tenant_id); the index
--                                           session_waiters_order (session_id, tenant_id, ticket)
--   runledger._run_tenant(run_id)           a run's tenant as a session key part ('' for none)
--   runledger._session_scope()              the tenant an operator's call on a session addresses:
--                                           the session's runledger.tenant ('' for none)
--   the policies tenant_isolation           on sessions, session_entries and session_waiters: the
--                                           row's tenant_id against the session's tenant
--   the view session_list                   its tenant_id (null for none)
-- Redefines (released in 0013 and 0016; sql/README.md rule 3):
--   runledger._session_handoff(), runledger._session_free()
--                                           take the tenant (the versions without it are dropped)
--   runledger._session_acquire(), _session_leave(), _session_release(), _session_append()
--                                           the same arguments; the session is the run's tenant's
--   runledger.session_history(), runledger._release_session(), runledger._delete_session()
--                                           the session of the tenant the caller's session names
--   runledger.release_session(), runledger.delete_session()
--                                           their audit rows name that tenant
--   runledger.prune(), runledger.prune_artifact_blobs()
--                                           refused (42501) to an operator bound to a tenant, as
--                                           set_queue is: they act on every tenant's data
-- (0027_status_change_checks.sql's _session_on_terminal frees the ended run's sessions under its
-- tenant; 0020_retention.sql's _prune_due removes idle sessions by their key, and its
-- set_retention, clear_retention and prune_due refuse a tenant's operator the same way.)
--
-- Existing sessions take the tenant of the run holding them, else of their last holder, else
-- of the run of their first entry, else none; their entries go with them. A queued run whose
-- tenant differs from its session's (possible before this file) queues for its own tenant's
-- session of that id, created here and handed to it.

alter table runledger.sessions add column tenant_id text collate "C" not null default '';
alter table runledger.session_entries add column tenant_id text collate "C" not null default '';
alter table runledger.session_waiters add column tenant_id text collate "C" not null default '';
comment on column runledger.sessions.tenant_id is
  'The tenant whose runs use this session ('''' for runs without a tenant): with session_id, the session''s key. A run opens, appends to and waits for only its own tenant''s session of an id.';
comment on column runledger.session_entries.tenant_id is
  'The tenant of the entry''s session (with session_id, its key).';
comment on column runledger.session_waiters.tenant_id is
  'The tenant of the session queued for (with session_id, its key): the queued run''s own.';

alter table runledger.session_entries drop constraint session_entries_session_id_fkey;
alter table runledger.session_waiters drop constraint session_waiters_session_id_fkey;
update runledger.sessions s
   set tenant_id = t.tenant_id
  from (select s2.session_id,
               coalesce((select r.tenant_id from runledger.runs r where r.run_id = s2.holder_run_id),
                        (select r.tenant_id from runledger.runs r where r.run_id = s2.last_holder_run_id),
                        (select r.tenant_id from runledger.session_entries e join runledger.runs r on r.run_id = e.run_id
                          where e.session_id = s2.session_id order by e.seq limit 1)) as tenant_id
          from runledger.sessions s2) t
 where t.session_id = s.session_id and t.tenant_id is not null;
update runledger.session_entries e set tenant_id = s.tenant_id
  from runledger.sessions s where s.session_id = e.session_id and s.tenant_id <> '';
update runledger.session_waiters w set tenant_id = r.tenant_id
  from runledger.runs r where r.run_id = w.run_id and r.tenant_id is not null;
alter table runledger.sessions drop constraint sessions_pkey,
  add constraint sessions_pkey primary key (session_id, tenant_id);
insert into runledger.sessions (session_id, tenant_id)
select distinct w.session_id, w.tenant_id from runledger.session_waiters w
 where not exists (select from runledger.sessions s where s.session_id = w.session_id and s.tenant_id = w.tenant_id);
alter table runledger.session_entries drop constraint session_entries_pkey,
  add constraint session_entries_pkey primary key (session_id, tenant_id, seq),
  add constraint session_entries_session_id_fkey foreign key (session_id, tenant_id)
    references runledger.sessions (session_id, tenant_id) on delete cascade;
alter table runledger.session_waiters
  add constraint session_waiters_session_id_fkey foreign key (session_id, tenant_id)
    references runledger.sessions (session_id, tenant_id) on delete cascade;
drop index runledger.session_waiters_order;
create index session_waiters_order on runledger.session_waiters (session_id, tenant_id, ticket);

create function runledger._run_tenant(p_run_id text) returns text
language sql stable as $$
  select coalesce((select r.tenant_id from runledger.runs r where r.run_id = p_run_id), '')
$$;
comment on function runledger._run_tenant(text) is
  'A run''s tenant as the tenant part of a session''s key: runs.tenant_id, '''' for a run without one.';

create function runledger._session_scope() returns text
language sql stable as $$
  select coalesce(current_setting('runledger.tenant', true), '')
$$;
comment on function runledger._session_scope() is
  'The tenant whose session an operator''s call (session_history, release_session, delete_session) addresses: the setting runledger.tenant of the caller''s session, '''' (runs without a tenant) when it names none. With tenant isolation on, a caller bound to a tenant finds only that tenant''s sessions (the policies).';

-- The policies compare the session's own tenant (they went through the runs that held a
-- session or appended to it, which a session of two tenants' runs let both see).
drop policy tenant_isolation on runledger.sessions;
drop policy tenant_isolation on runledger.session_entries;
drop policy tenant_isolation on runledger.session_waiters;
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

drop function runledger._session_free(text, text);
drop function runledger._session_handoff(text);

create function runledger._session_handoff(p_session_id text, p_tenant_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_next   text;
  v_status runledger.run_status;
begin
  -- The caller holds the session row, free. The first waiter whose run has not ended
  -- takes it; waiters whose run ended or vanished are dropped on the way.
  loop
    select w.run_id into v_next from runledger.session_waiters w
     where w.session_id = p_session_id and w.tenant_id = p_tenant_id order by w.ticket limit 1;
    if not found then
      return null;
    end if;
    -- The waiter's run is locked before its place is taken: a cancel or end of that run
    -- committing right now has removed its place (the trigger runs_session_release) by the
    -- time the lock is granted, and the delete then finds nothing.
    select r.status into v_status from runledger.runs r where r.run_id = v_next for update;
    delete from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = v_next;
    if found and v_status is not null and not runledger.is_terminal(v_status) then
      update runledger.sessions
         set holder_run_id = v_next, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id and tenant_id = p_tenant_id;
      perform runledger._send_signal(v_next, 'session:' || p_session_id, jsonb_build_object('session_id', p_session_id));
      return v_next;
    end if;
  end loop;
end;
$$;
comment on function runledger._session_handoff(text, text) is
  'The session (locked by the caller, free) goes to its first waiter whose run has not ended, which is signalled on topic session:<id> (send_signal wakes it if it waits). Returns the new holder, or null when nobody waits.';

create function runledger._session_free(p_session_id text, p_tenant_id text, p_reason text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  update runledger.sessions
     set last_holder_run_id = holder_run_id, holder_run_id = null, held_at = null,
         released_at = runledger.now(), release_reason = p_reason, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = p_tenant_id and holder_run_id is not null;
  return runledger._session_handoff(p_session_id, p_tenant_id);
end;
$$;
comment on function runledger._session_free(text, text, text) is
  'The holder of the session (locked by the caller) lets go, for p_reason (released, ended, operator); the session goes to the next waiter. Returns the new holder or null.';

create or replace function runledger._session_acquire(p_session_id text, p_run_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
  v_status  runledger.run_status;
  v_ticket  bigint;
begin
  perform runledger._session_check_id(p_session_id);
  insert into runledger.sessions (session_id, tenant_id) values (p_session_id, v_tenant)
  on conflict (session_id, tenant_id) do nothing;
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if v_session.holder_run_id is not null and v_session.holder_run_id <> p_run_id then
    -- A holder that ended lets go by the trigger runs_session_release; one found ended or
    -- gone anyway (a run row deleted by hand) is treated as gone.
    select r.status into v_status from runledger.runs r where r.run_id = v_session.holder_run_id;
    if v_status is null or runledger.is_terminal(v_status) then
      delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
      perform runledger._session_free(p_session_id, v_tenant, 'ended');
      select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
    end if;
  end if;
  if v_session.holder_run_id is null then
    -- Free: a free session has nobody queued (a hand-off gives it to the first waiter),
    -- but should someone be, they come first.
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    if exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
      perform runledger._session_handoff(p_session_id, v_tenant);
      select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
    end if;
  end if;
  if v_session.holder_run_id is null then
    update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
     where session_id = p_session_id and tenant_id = v_tenant
    returning * into v_session;
  end if;
  if v_session.holder_run_id = p_run_id then
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  insert into runledger.session_waiters (session_id, tenant_id, run_id) values (p_session_id, v_tenant, p_run_id)
  on conflict (session_id, run_id) do nothing;
  select w.ticket into v_ticket from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = p_run_id;
  return jsonb_build_object(
    'held', false, 'holder', v_session.holder_run_id,
    'position', (select count(*) from runledger.session_waiters w
                  where w.session_id = p_session_id and w.tenant_id = v_tenant and w.ticket <= v_ticket));
end;
$$;
comment on function runledger._session_acquire(text, text) is
  'Inside a run''s transaction step: holds the session of that id of the run''s tenant for p_run_id if it is free (or already its own, or its holder ended) and answers {held: true, entry_count}; otherwise queues the run (once) and answers {held: false, holder, position}. Creates the session on first use (per tenant: another tenant''s session of the same id is another session). Invalid id: RL003.';

create or replace function runledger._session_leave(p_session_id text, p_run_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
begin
  select * into v_session from runledger.sessions
   where session_id = p_session_id and tenant_id = runledger._run_tenant(p_run_id) for update;
  if found and v_session.holder_run_id = p_run_id then
    -- The hand-off came just as the wait timed out: the session is the run's.
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
  return jsonb_build_object('held', false, 'holder', v_session.holder_run_id);
end;
$$;
comment on function runledger._session_leave(text, text) is
  'A queued run gives up (its wait timed out): it leaves the queue of its tenant''s session, unless the session was handed to it meanwhile ({held: true, entry_count}).';

create or replace function runledger._session_release(p_session_id text, p_run_id text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant text := runledger._run_tenant(p_run_id);
begin
  perform 1 from runledger.sessions
   where session_id = p_session_id and tenant_id = v_tenant and holder_run_id = p_run_id for update;
  if not found then
    return false;
  end if;
  perform runledger._session_free(p_session_id, v_tenant, 'released');
  return true;
end;
$$;
comment on function runledger._session_release(text, text) is
  'The holder lets go of the session (session.release()); the next waiter gets it and is woken. False when p_run_id does not hold it.';

create or replace function runledger._session_append(p_session_id text, p_run_id text, p_position int, p_entries jsonb) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
  v_count   int;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL005', message = format('session %s is not held by run %s: it does not exist', p_session_id, p_run_id);
  end if;
  if v_session.holder_run_id is distinct from p_run_id then
    if v_session.holder_run_id is null and v_session.last_holder_run_id = p_run_id and v_session.release_reason = 'ended'
       and not exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
      -- The run held it when it ended and has been brought back (retry_run); nobody has held
      -- it since, so its history is still the one the run read: it takes it back.
      update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id and tenant_id = v_tenant;
    else
      raise exception using errcode = 'RL005',
        message = format('session %s is not held by run %s (%s)', p_session_id, p_run_id,
                         coalesce('held by ' || v_session.holder_run_id, 'it is free'));
    end if;
  end if;
  if jsonb_typeof(p_entries) is distinct from 'array' or exists (
       select 1 from jsonb_array_elements(p_entries) e
        where jsonb_typeof(e) <> 'object' or not (e ? 'content')
           or coalesce(e->>'role', '') not in ('system', 'user', 'assistant', 'tool')) then
    raise exception using errcode = 'RL003',
      message = format('session %s: entries must be an array of {role: system|user|assistant|tool, content}', p_session_id);
  end if;
  insert into runledger.session_entries (session_id, tenant_id, seq, role, content, run_id, step_position, entry_index)
  select p_session_id, v_tenant, v_session.entry_count + e.ordinality::int, e.value->>'role', e.value->'content', p_run_id, p_position,
         e.ordinality::int - 1
    from jsonb_array_elements(p_entries) with ordinality e;
  get diagnostics v_count = row_count;
  update runledger.sessions set entry_count = entry_count + v_count, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = v_tenant;
  return jsonb_build_object('first_seq', v_session.entry_count + 1, 'last_seq', v_session.entry_count + v_count);
end;
$$;
comment on function runledger._session_append(text, text, int, jsonb) is
  'Inside the holder''s transaction step at p_position: appends the entries ([{role, content}], numbered after the last) to the session of the run''s tenant and answers {first_seq, last_seq}. A run that does not hold the session: RL005 (a run that held it when it ended and was retried takes it back if nobody held it since and nobody waits). Bad entries: RL003.';

create or replace function runledger.session_history(p_session_id text)
returns table (seq int, role text, content jsonb, run_id text, step_position int, created_at timestamptz)
language plpgsql stable
set enable_seqscan = off set jit = off as $$
declare
  v_tenant text := runledger._session_scope();
begin
  perform runledger._session_check_id(p_session_id);
  if not exists (select 1 from runledger.sessions s where s.session_id = p_session_id and s.tenant_id = v_tenant) then
    raise exception using errcode = 'RL002', message = format('session_history: session %L not found', p_session_id);
  end if;
  return query
    select e.seq, e.role, e.content, e.run_id, e.step_position, e.created_at
      from runledger.session_entries e
     where e.session_id = p_session_id and e.tenant_id = v_tenant
     order by e.seq;
end;
$$;
comment on function runledger.session_history(text) is
  'A session''s history in order: seq, role, content, and the run and step position that appended each entry. The session is the one of the tenant the caller''s session names (runledger.tenant; none: the runs without a tenant). Unknown session: RL002; invalid id: RL003.';

create or replace function runledger._release_session(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('release_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is null then
    return null;
  end if;
  insert into runledger.events (run_id, kind, detail)
  select r.run_id, 'session_released', jsonb_build_object('session_id', p_session_id, 'by', 'operator')
    from runledger.runs r where r.run_id = v_session.holder_run_id;
  return runledger._session_free(p_session_id, v_tenant, 'operator');
end;
$$;
comment on function runledger._release_session(text) is
  'The action behind runledger.release_session (which records it in audit_log): Operator repair: takes a session (of the tenant the caller''s session names) from its holder (a run stuck while holding it) and hands it to the next waiter, which is woken. Returns the new holder (null: nobody waited, or it was free). The former holder''s next append fails with RL005 (SESSION_NOT_HELD); its history records a session_released event. Unknown session: RL002.';

create or replace function runledger._delete_session(p_session_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('delete_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is not null
     or exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
    raise exception using errcode = 'RL005',
      message = format('delete_session: session %s is held by run %s or has runs queued; release it first (release_session)', p_session_id,
                       coalesce(v_session.holder_run_id, '-'));
  end if;
  delete from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
  return v_session.entry_count;
end;
$$;
comment on function runledger._delete_session(text) is
  'The action behind runledger.delete_session (which records it in audit_log): Operator action: deletes a session (of the tenant the caller''s session names) that nobody holds or waits for, with its history (entries are kept until then, whatever prune() removes). Returns how many entries went. Held or queued for: RL005; unknown: RL002.';

create or replace function runledger.release_session(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_next text := runledger._release_session(p_session_id);
begin
  perform runledger._audit('release_session', null, p_session_id,
                           jsonb_build_object('tenant_id', nullif(runledger._session_scope(), '')), to_jsonb(v_next));
  return v_next;
end;
$$;
comment on function runledger.release_session(text) is
  'Operator repair: takes a session (of the tenant the caller''s session names in runledger.tenant; none: the runs without a tenant) from the run holding it and hands it to the next waiting run; returns that run (null: nobody waited). Recorded in audit_log, with the tenant.';

create or replace function runledger.delete_session(p_session_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_removed int := runledger._delete_session(p_session_id);
begin
  perform runledger._audit('delete_session', null, p_session_id,
                           jsonb_build_object('tenant_id', nullif(runledger._session_scope(), '')), to_jsonb(v_removed));
  return v_removed;
end;
$$;
comment on function runledger.delete_session(text) is
  'Operator action: deletes a session (of the tenant the caller''s session names in runledger.tenant; none: the runs without a tenant) that no run holds or waits for, with its entries; returns how many entries it removed. Recorded in audit_log, with the tenant.';

create or replace view runledger.session_list as
select s.session_id,
       s.holder_run_id,
       r.status as holder_status,
       r.workflow_name as holder_workflow,
       s.held_at,
       coalesce(w.run_ids, '{}') as waiting_run_ids,
       coalesce(cardinality(w.run_ids), 0) as waiters,
       s.entry_count as entries,
       s.last_holder_run_id,
       s.release_reason,
       s.released_at,
       s.created_at,
       s.updated_at,
       nullif(s.tenant_id, '') as tenant_id
  from runledger.sessions s
  left join runledger.runs r on r.run_id = s.holder_run_id
  left join lateral (
    select array_agg(q.run_id order by q.ticket) as run_ids from runledger.session_waiters q
     where q.session_id = s.session_id and q.tenant_id = s.tenant_id
  ) w on true;
comment on view runledger.session_list is
  'Every session: its holder (run, status, workflow, since when), the runs queued for it in order, its entry count, how it was last let go, and its tenant (null: runs without a tenant; a session id is one session per tenant). select * from runledger.session_history(id) lists one session''s entries (of the tenant runledger.tenant names).';

-- What every tenant shares (0018_tenants.sql): pruning by age removes every tenant's finished
-- runs and the workers table; the artifact blobs are stored once for all tenants.
create or replace function runledger.prune(p_older_than interval) returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_count bigint;
begin
  perform runledger._check_not_tenant_bound('prune');
  v_count := runledger._prune(p_older_than);
  perform runledger._audit('prune', null, null, jsonb_build_object('older_than', p_older_than::text), to_jsonb(v_count));
  return v_count;
end;
$$;
comment on function runledger.prune(interval) is
  'Operator action: deletes finished runs (terminal, finished before now - older_than) with their steps, events, operations, signals and approvals, and workers stopped before then. Returns how many runs it removed. The audit log is kept. With tenant isolation on, refused (42501) to an operator bound to a tenant. Recorded in audit_log.';

create or replace function runledger.prune_artifact_blobs() returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_removed bigint;
begin
  perform runledger._check_not_tenant_bound('prune_artifact_blobs');
  v_removed := runledger._prune_artifact_blobs();
  perform runledger._audit('prune_artifact_blobs', null, null, '{}', to_jsonb(v_removed));
  return v_removed;
end;
$$;
comment on function runledger.prune_artifact_blobs() is
  'Operator action: deletes artifact contents no artifact refers to any more; returns how many it removed. With tenant isolation on, refused (42501) to an operator bound to a tenant: a blob is stored once for every tenant. Recorded in audit_log.';

comment on function runledger._check_not_tenant_bound(text) is
  'Refuses (42501) an action on what all tenants share (set_queue, set_retention, clear_retention, prune_due, prune, prune_artifact_blobs) when tenant isolation is on and the caller is bound to a tenant.';

-- A queued run whose tenant differs from its session's (queued before this file) waits on a
-- session of its own tenant now, made free above: it is handed over and woken.
do $$
declare
  v_key record;
begin
  for v_key in
    select s.session_id, s.tenant_id from runledger.sessions s
     where s.holder_run_id is null
       and exists (select from runledger.session_waiters w where w.session_id = s.session_id and w.tenant_id = s.tenant_id)
     order by s.session_id, s.tenant_id
  loop
    perform 1 from runledger.sessions s where s.session_id = v_key.session_id and s.tenant_id = v_key.tenant_id for update;
    perform runledger._session_handoff(v_key.session_id, v_key.tenant_id);
  end loop;
end;
$$;

-- The redefined functions lost SECURITY DEFINER and their search_path (create or replace):
-- secured again; their grants stay.
select runledger._secure_functions();

insert into runledger.migrations (version, name) values (33, '0033_tenant_sessions_and_shared_actions');
