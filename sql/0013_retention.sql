-- 0013_retention: retention rules, owner settings and maintenance leases.
--
-- tables: retention, maintenance
-- indexes: retention_rule, runs_retention, runs_idempotency_retention, signals_run, artifacts_run,
--   sessions_idle, audit_log_at
-- triggers: owner_settings_audit
-- functions: _owner_settings_changed, _audit_log_min_keep, _retention_key_held, _retention_fork_live,
--   _prune_due, prune_due, _set_retention, set_retention, _clear_retention, clear_retention,
--   _maintenance_begin, _maintenance_end

create table runledger.retention (
  kind          text collate "C" not null,
  -- null: the default for every workflow without a rule of its own for this kind.
  workflow_name text collate "C",
  -- null: keep forever (a workflow's own null rule overrides the default's interval).
  keep          interval,
  updated_at    timestamptz not null default runledger.now(),
  constraint retention_kind check (kind in ('runs', 'events', 'idempotency', 'signals', 'streams', 'session_entries', 'audit_log')),
  constraint retention_keep check (keep is null or keep >= interval '0'),
  constraint retention_per_workflow check (workflow_name is null or kind in ('runs', 'events', 'idempotency', 'signals', 'streams'))
);
comment on table runledger.retention is
  'How long each kind of finished data is kept (runs, events, idempotency, signals, streams, session_entries, audit_log), per workflow (workflow_name null = the default for workflows without their own rule; session_entries and audit_log have only the default). keep null = forever; no row = forever (idempotency: the key lives as long as its run). Applied by runledger.prune_due(), which workers call on their own (retentionIntervalMs). See docs/retention.md.';

create unique index retention_rule on runledger.retention (kind, coalesce(workflow_name, ''));

create function runledger._owner_settings_changed() returns trigger
language plpgsql as $$
begin
  if tg_op = 'UPDATE' and old is not distinct from new then
    return null;
  end if;
  perform runledger._audit('owner_settings', null, null,
                           jsonb_build_object('old', to_jsonb(old) - 'one', 'new', to_jsonb(new) - 'one'), null);
  return null;
end;
$$;
comment on function runledger._owner_settings_changed() is
  'Trigger function of owner_settings_audit: records a change of runledger.owner_settings in audit_log (action owner_settings, the old and new values, by the login that made it).';

create trigger owner_settings_audit after insert or update or delete on runledger.owner_settings
  for each row execute function runledger._owner_settings_changed();
comment on trigger owner_settings_audit on runledger.owner_settings is
  'Every change of the owner''s settings is recorded in audit_log (runledger._owner_settings_changed).';

create function runledger._audit_log_min_keep() returns interval
language sql stable as $$
  select coalesce((select s.audit_log_min_keep from runledger.owner_settings s), interval '365 days')
$$;
comment on function runledger._audit_log_min_keep() is
  'How long the audit log is kept at least: owner_settings.audit_log_min_keep (365 days when the row is missing). set_retention refuses a shorter audit_log rule; prune_due never removes a younger record.';

create table runledger.maintenance (
  task        text collate "C" primary key,
  -- The worker running the task now (lease_until in the future), or the last one that did.
  worker_id   text collate "C",
  started_at  timestamptz,
  lease_until timestamptz,
  finished_at timestamptz,
  last_result jsonb
);
comment on table runledger.maintenance is
  'Cluster-wide maintenance tasks (retention): which worker runs one now (lease_until in the future) or ran it last, when it started and finished, and what it did. A task runs on one worker at a time, once per interval across the cluster (runledger._maintenance_begin).';

-- Finished runs by when they finished, for retention: only terminal statuses (sql/README.md, "Plans").
create index runs_retention on runledger.runs (finished_at)
  where status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER');

-- Finished runs still holding an idempotency key: a cleared key leaves the index.
create index runs_idempotency_retention on runledger.runs (finished_at)
  where idempotency_key is not null and status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER');

-- A run's signals and artifacts, whatever their state: for the signals kind, and for the
-- cascades of a run's delete (signals_unconsumed and the artifacts' partial unique indexes
-- do not cover every row, so each deleted run read both tables whole before).
create index signals_run on runledger.signals (run_id);

create index artifacts_run on runledger.artifacts (run_id);

-- Free sessions by how long they have been idle.
create index sessions_idle on runledger.sessions (updated_at) where holder_run_id is null;

create index audit_log_at on runledger.audit_log (at);

create function runledger._retention_key_held(p_workflow text, p_finished_at timestamptz) returns boolean
language sql volatile
set enable_seqscan = off set jit = off as $$
  select coalesce((select k.keep is null or p_finished_at >= runledger.now() - k.keep
                     from runledger.retention k
                    where k.kind = 'idempotency' and (k.workflow_name = p_workflow or k.workflow_name is null)
                    order by k.workflow_name nulls last
                    limit 1), false)
$$;
comment on function runledger._retention_key_held(text, timestamptz) is
  'True while an idempotency rule (the workflow''s own, else the default) holds the key of a run of this workflow that finished at that time: keep null, or not yet expired. False when no rule applies (the key lives as long as its run).';

create function runledger._retention_fork_live(p_run_id text) returns boolean
language sql volatile
set enable_seqscan = off set jit = off as $$
  with recursive lineage (run_id, status) as (
    select f.run_id, f.status from runledger.runs f
     where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = p_run_id
    union
    select f.run_id, f.status from lineage l
      join runledger.runs f on f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = l.run_id)
  select exists (select 1 from lineage l where not runledger.is_terminal(l.status))
$$;
comment on function runledger._retention_fork_live(text) is
  'True when a run forked from this run, or from one of its forks (at any depth), is not terminal: the fork may still reuse the lineage''s operations, so retention keeps the run.';

create function runledger._prune_due(p_batch int default 1000, p_dry_run boolean default false)
returns table (kind text, removed bigint)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now    timestamptz := runledger.now();
  v_kind   text;
  v_rule   runledger.retention;
  v_others text[];
  v_cutoff timestamptz;
  v_left   bigint;
  v_n      bigint;
  v_total  bigint;
  v_id     text;
  v_run    runledger.runs;
  v_ids    text[] := '{}';
begin
  if p_batch is null or p_batch < 1 then
    raise exception using errcode = 'RL003', message = 'prune_due: batch must be a whole number >= 1';
  end if;
  -- Keys first (a cleared key lets its run go in the same call), the run's parts, the runs, the rest.
  foreach v_kind in array array['idempotency', 'events', 'signals', 'streams', 'runs', 'session_entries', 'audit_log'] loop
    v_total := 0;
    -- The workflows with a rule of their own for this kind are not under its default.
    v_others := array(select r.workflow_name from runledger.retention r where r.kind = v_kind and r.workflow_name is not null);
    for v_rule in
      select * from runledger.retention r where r.kind = v_kind and r.keep is not null order by r.workflow_name nulls last
    loop
      v_cutoff := v_now - v_rule.keep;
      -- Dry-run counts everything due; a batch stops at p_batch rows per kind.
      v_left := case when p_dry_run then null else p_batch - v_total end;
      exit when v_left is not null and v_left <= 0;
      v_n := 0;
      if v_kind = 'idempotency' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r
           where r.idempotency_key is not null and r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
             and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)));
        else
          with due as (
            select r.run_id from runledger.runs r
             where r.idempotency_key is not null and r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
               and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for no key update skip locked),
          cleared as (
            update runledger.runs r set idempotency_key = null from due where r.run_id = due.run_id returning 1)
          select count(*) into v_n from cleared;
        end if;
      elsif v_kind = 'events' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r join runledger.events e on e.run_id = r.run_id
           where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)));
        else
          with due as (
            select e.run_id, e.event_id from runledger.runs r join runledger.events e on e.run_id = r.run_id
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for update of e skip locked),
          gone as (delete from runledger.events e using due where e.run_id = due.run_id and e.event_id = due.event_id returning 1)
          select count(*) into v_n from gone;
        end if;
      elsif v_kind = 'signals' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r join runledger.signals s on s.run_id = r.run_id
           where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)));
        else
          with due as (
            select s.signal_id from runledger.runs r join runledger.signals s on s.run_id = r.run_id
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for update of s skip locked),
          gone as (delete from runledger.signals g using due where g.signal_id = due.signal_id returning 1)
          select count(*) into v_n from gone;
        end if;
      elsif v_kind = 'streams' then
        -- Chunks first, then the ends of streams whose chunks are all gone: both counted.
        if p_dry_run then
          select (select count(*) from runledger.runs r join runledger.stream_chunks c on c.run_id = r.run_id
                   where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
                     and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others))))
               + (select count(*) from runledger.runs r join runledger.stream_ends e on e.run_id = r.run_id
                   where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
                     and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others))))
            into v_n;
        else
          with due as (
            select c.run_id, c.topic, c."offset" from runledger.runs r join runledger.stream_chunks c on c.run_id = r.run_id
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             limit v_left
               for update of c skip locked),
          gone as (
            delete from runledger.stream_chunks c using due
             where c.run_id = due.run_id and c.topic = due.topic and c."offset" = due."offset" returning 1)
          select count(*) into v_n from gone;
          if v_n < v_left then
            with due as (
              select e.run_id, e.topic from runledger.runs r join runledger.stream_ends e on e.run_id = r.run_id
               where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
                 and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
                 and not exists (select 1 from runledger.stream_chunks c where c.run_id = e.run_id and c.topic = e.topic)
               limit v_left - v_n
                 for update of e skip locked),
            gone as (delete from runledger.stream_ends e using due where e.run_id = due.run_id and e.topic = due.topic returning 1)
            select v_n + count(*) into v_n from gone;
          end if;
        end if;
      elsif v_kind = 'runs' then
        if p_dry_run then
          select count(*) into v_n from runledger.runs r
           where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
             and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
             and not exists (select 1 from runledger.runs c where c.parent_run_id = r.run_id and not runledger.is_terminal(c.status))
             and not exists (select 1 from runledger.runs p where p.run_id = r.parent_run_id and not runledger.is_terminal(p.status))
             and not (r.idempotency_key is not null and runledger._retention_key_held(r.workflow_name, r.finished_at))
             and not (exists (select 1 from runledger.runs f
                               where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = r.run_id)
                      and runledger._retention_fork_live(r.run_id));
        else
          -- One run at a time, from a scan without a sort that stops at p_batch runs: the
          -- protections (a few index probes each) are checked only for the runs it gets to.
          -- FOR UPDATE SKIP LOCKED conflicts with the FOR KEY SHARE of a fork_run or a
          -- child's start reading the run right now: that run is skipped, looked at next time.
          -- A protected run is passed over unlocked; a due one is locked, then checked again.
          for v_run in
            select r.* from runledger.runs r
             where r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') and r.finished_at < v_cutoff
               and (r.workflow_name = v_rule.workflow_name or (v_rule.workflow_name is null and r.workflow_name <> all (v_others)))
          loop
            exit when v_n >= v_left;
            v_id := v_run.run_id;
            continue when exists (select 1 from runledger.runs c where c.parent_run_id = v_id and not runledger.is_terminal(c.status))
                       or exists (select 1 from runledger.runs p where p.run_id = v_run.parent_run_id and not runledger.is_terminal(p.status))
                       or (v_run.idempotency_key is not null and runledger._retention_key_held(v_run.workflow_name, v_run.finished_at))
                       or (exists (select 1 from runledger.runs f
                                    where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = v_id)
                           and runledger._retention_fork_live(v_id));
            perform 1 from runledger.runs r
             where r.run_id = v_id and r.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
               for update skip locked;
            continue when not found;
            -- Locked: a fork or child made while the scan ran has committed by now, and is seen.
            continue when exists (select 1 from runledger.runs c where c.parent_run_id = v_id and not runledger.is_terminal(c.status))
                       or (exists (select 1 from runledger.runs f
                                    where f.version_manifest ? 'forked_from' and f.version_manifest->>'forked_from' = v_id)
                           and runledger._retention_fork_live(v_id));
            v_ids := v_ids || v_id;
            v_n := v_n + 1;
          end loop;
          -- The runs are locked: one delete for all of them (and one pass of each cascade).
          delete from runledger.runs r where r.run_id = any (v_ids);
          v_ids := '{}';
        end if;
      elsif v_kind = 'session_entries' then
        -- Whole idle sessions (free, nobody queued): a batch takes sessions until their
        -- entries reach p_batch (at least one session, however long its history).
        -- A session is keyed by its id and tenant.
        if p_dry_run then
          select coalesce(sum(s.entry_count), 0) into v_n from runledger.sessions s
           where s.holder_run_id is null and s.updated_at < v_cutoff
             and not exists (select 1 from runledger.session_waiters w where w.session_id = s.session_id and w.tenant_id = s.tenant_id);
        else
          with idle as (
            select s.session_id, s.tenant_id, s.entry_count from runledger.sessions s
             where s.holder_run_id is null and s.updated_at < v_cutoff
               and not exists (select 1 from runledger.session_waiters w where w.session_id = s.session_id and w.tenant_id = s.tenant_id)
             order by s.updated_at
             limit v_left
               for update skip locked),
          due as (
            select i.session_id, i.tenant_id, i.entry_count,
                   sum(i.entry_count) over (order by i.session_id, i.tenant_id) as running
              from idle i),
          gone as (
            delete from runledger.sessions s using due
             where s.session_id = due.session_id and s.tenant_id = due.tenant_id
               and (due.running <= v_left or due.running = due.entry_count)
            returning s.entry_count)
          select coalesce(sum(g.entry_count), 0) into v_n from gone g;
        end if;
      elsif v_kind = 'audit_log' then
        -- Never younger than the owner's floor, whatever the rule says (a rule set before the
        -- floor was raised); the records of retention changes stay whatever their age, so a
        -- rule that removes the log cannot remove the record of its own making.
        v_cutoff := v_now - greatest(v_rule.keep, runledger._audit_log_min_keep());
        if p_dry_run then
          select count(*) into v_n from runledger.audit_log a
           where a.at < v_cutoff and a.action not in ('set_retention', 'clear_retention', 'owner_settings');
        else
          with due as (
            select a.audit_id from runledger.audit_log a
             where a.at < v_cutoff and a.action not in ('set_retention', 'clear_retention', 'owner_settings')
             order by a.at limit v_left for update skip locked),
          gone as (delete from runledger.audit_log a using due where a.audit_id = due.audit_id returning 1)
          select count(*) into v_n from gone;
        end if;
      end if;
      v_total := v_total + v_n;
    end loop;
    kind := v_kind;
    removed := v_total;
    return next;
  end loop;
end;
$$;
comment on function runledger._prune_due(int, boolean) is
  'The action behind runledger.prune_due (which records it in audit_log): applies runledger.retention, one batch of at most p_batch rows per kind (idempotency keys cleared, events, signals, stream chunks and ends, runs, session entries, audit records); with p_dry_run, counts everything due and changes nothing. Returns one row per kind.';

create function runledger.prune_due(p_batch int default 1000, p_dry_run boolean default false)
returns table (kind text, removed bigint)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_kinds   text[];
  v_counts  bigint[];
begin
  -- A pass applies the rules every tenant shares; the workers (not bound to a tenant) make it.
  perform runledger._check_not_tenant_bound('prune_due');
  select array_agg(d.kind), array_agg(d.removed) into v_kinds, v_counts from runledger._prune_due(p_batch, p_dry_run) d;
  -- Recorded when it removed something: a worker's pass over nothing due leaves no trace.
  if not coalesce(p_dry_run, false) and exists (select 1 from unnest(v_counts) n where n > 0) then
    perform runledger._audit('prune_due', null, null, jsonb_build_object('batch', p_batch),
                             (select jsonb_object_agg(k, n) from unnest(v_kinds, v_counts) u (k, n)));
  end if;
  return query select u.k, u.n from unnest(v_kinds, v_counts) u (k, n);
end;
$$;
comment on function runledger.prune_due(int, boolean) is
  'Operator action (and the workers'' retention task): applies runledger.retention, one batch of at most p_batch rows per kind: idempotency keys of finished runs cleared, events, signals and streams of finished runs, finished runs with everything they own, idle sessions with their entries, audit records (never one younger than owner_settings.audit_log_min_keep, nor a record of set_retention, clear_retention or owner_settings). Never a run that is not terminal, whose parent, child or fork lineage is not, or whose idempotency key a rule still holds. p_dry_run: counts everything due, changes nothing. Returns (kind, removed) per kind; call again until no kind removes p_batch. Recorded in audit_log when it removed anything. With tenant isolation on, refused (42501) to an operator bound to a tenant: the rules are every tenant''s.';

create function runledger._set_retention(p_kind text, p_keep interval, p_workflow_name text default null) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_kind is null or p_kind not in ('runs', 'events', 'idempotency', 'signals', 'streams', 'session_entries', 'audit_log') then
    raise exception using errcode = 'RL003',
      message = format('set_retention: kind %L is not one of runs, events, idempotency, signals, streams, session_entries, audit_log', p_kind);
  end if;
  if p_keep < interval '0' then
    raise exception using errcode = 'RL003', message = 'set_retention: keep must be an interval >= 0 (or null: forever)';
  end if;
  if p_workflow_name is not null and p_kind in ('session_entries', 'audit_log') then
    raise exception using errcode = 'RL003',
      message = format('set_retention: %s is not kept per workflow (give no workflow)', p_kind);
  end if;
  -- The audit log records the operators who set this rule: they may not shorten it below
  -- the floor the schema's owner set.
  if p_kind = 'audit_log' and p_keep < runledger._audit_log_min_keep() then
    raise exception using errcode = '42501',
      message = format('set_retention: the audit log is kept at least %s (owner_settings.audit_log_min_keep); %s is shorter',
                       runledger._audit_log_min_keep(), p_keep),
      hint = 'Only the schema''s owner lowers the floor: update runledger.owner_settings set audit_log_min_keep = ''...''; (docs/retention.md).';
  end if;
  insert into runledger.retention (kind, workflow_name, keep, updated_at)
  values (p_kind, p_workflow_name, p_keep, runledger.now())
  on conflict (kind, coalesce(workflow_name, '')) do update set keep = excluded.keep, updated_at = excluded.updated_at;
end;
$$;
comment on function runledger._set_retention(text, interval, text) is
  'The action behind runledger.set_retention (which records it in audit_log): sets how long a kind is kept, for one workflow or (workflow null) as the default.';

create function runledger.set_retention(p_kind text, p_keep interval, p_workflow_name text default null) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  -- The rules apply to every tenant's data (0014_security.sql).
  perform runledger._check_not_tenant_bound('set_retention');
  perform runledger._set_retention(p_kind, p_keep, p_workflow_name);
  perform runledger._audit('set_retention', null, p_kind,
                           jsonb_build_object('keep', coalesce(p_keep::text, 'forever'), 'workflow_name', p_workflow_name), null);
end;
$$;
comment on function runledger.set_retention(text, interval, text) is
  'Operator action: keep kind (runs, events, idempotency, signals, streams, session_entries, audit_log) for p_keep (null: forever), for workflow p_workflow_name or (null) as the default for workflows without their own rule. Bad kind, negative keep, or a workflow for session_entries or audit_log: RL003. An audit_log rule shorter than owner_settings.audit_log_min_keep (365 days unless the schema''s owner lowered it): 42501. With tenant isolation on, refused (42501) to an operator bound to a tenant. Recorded in audit_log, and that record is never pruned.';

create function runledger._clear_retention(p_kind text, p_workflow_name text default null) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  delete from runledger.retention r where r.kind = p_kind and coalesce(r.workflow_name, '') = coalesce(p_workflow_name, '');
  return found;
end;
$$;
comment on function runledger._clear_retention(text, text) is
  'The action behind runledger.clear_retention (which records it in audit_log): removes one rule; returns whether there was one.';

create function runledger.clear_retention(p_kind text, p_workflow_name text default null) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_found boolean;
begin
  -- The rules apply to every tenant's data (0014_security.sql).
  perform runledger._check_not_tenant_bound('clear_retention');
  v_found := runledger._clear_retention(p_kind, p_workflow_name);
  perform runledger._audit('clear_retention', null, p_kind, jsonb_build_object('workflow_name', p_workflow_name), to_jsonb(v_found));
  return v_found;
end;
$$;
comment on function runledger.clear_retention(text, text) is
  'Operator action: removes the rule for kind and workflow (null: the default); the workflow falls back to the default, the default to keep forever. Returns whether a rule was removed. With tenant isolation on, refused (42501) to an operator bound to a tenant. Recorded in audit_log, and that record is never pruned.';

create function runledger._maintenance_begin(p_task text, p_worker_id text, p_every_ms bigint, p_lease_ms bigint) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now timestamptz := runledger.now();
begin
  insert into runledger.maintenance (task) values (p_task) on conflict do nothing;
  -- Due (not started within p_every_ms, by any worker) and not leased to another worker.
  update runledger.maintenance m
     set worker_id = p_worker_id, started_at = v_now, lease_until = v_now + make_interval(secs => p_lease_ms / 1000.0)
   where m.task = p_task
     and (m.started_at is null or m.started_at <= v_now - make_interval(secs => p_every_ms / 1000.0))
     and (m.lease_until is null or m.lease_until < v_now);
  return found;
end;
$$;
comment on function runledger._maintenance_begin(text, text, bigint, bigint) is
  'A worker asks for a cluster-wide task (retention): true, and the task is leased to it for p_lease_ms, when no worker started it within p_every_ms and no other worker holds its lease. Once per interval across the cluster, on one worker at a time.';

create function runledger._maintenance_end(p_task text, p_worker_id text, p_result jsonb, p_lease_ms bigint default null) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now timestamptz := runledger.now();
begin
  -- p_lease_ms: still running, the lease is renewed; null: done, the lease is let go.
  update runledger.maintenance m
     set lease_until = case when p_lease_ms is null then null else v_now + make_interval(secs => p_lease_ms / 1000.0) end,
         finished_at = case when p_lease_ms is null then v_now else m.finished_at end,
         last_result = coalesce(p_result, m.last_result)
   where m.task = p_task and m.worker_id = p_worker_id and m.lease_until >= v_now;
  return found;
end;
$$;
comment on function runledger._maintenance_end(text, text, jsonb, bigint) is
  'The worker holding a task''s lease renews it (p_lease_ms) or lets it go (null), recording what it did; false when the lease is no longer its own (expired and taken, or never held), and it should stop.';

insert into runledger.migrations (version, name) values (13, '0013_retention');
