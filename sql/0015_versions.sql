-- 0015_versions: moving a run to another version of its workflow, and patches.
--
--   runledger.migrate_run(run_id, to_version)              marks a run for migration (a live worker applies it)
--   runledger.migrate_runs(workflow, from, to, limit)      marks up to limit runs of a version, oldest first (the canary form)
--   runledger._take_migration(pairs)                       a worker locks one marked run it has a migration for
--   runledger._apply_migration(...)                        writes what the workflow's migrate returned, in that transaction
--   runledger._migration_failed(...)                       a migrate that threw or returned something invalid: recorded, run unchanged
--   runledger.patches                                      (view) the patches runs took, and the runs from before each that may still replay
--
-- A migration is the user's code (the new version's `migrations: { '1': migrate }`), so
-- SQL only marks the run (migrate_to) and checks that a live worker has that migration;
-- the worker runs migrate and writes its result in the transaction that holds the run's
-- row. Only runs no worker executes are moved: PENDING, WAITING and DEAD_LETTER ones.

create index runs_migrating on runledger.runs (workflow_name, workflow_version) where migrate_to is not null;

-- The statuses a run may be migrated in: no worker executes it (no lease), and it is not finished.
create function runledger._migratable(p_status runledger.run_status) returns boolean
language sql immutable parallel safe as $$
  select p_status in ('PENDING', 'WAITING', 'DEAD_LETTER')
$$;
comment on function runledger._migratable(runledger.run_status) is
  'True for the statuses migrate_run takes: PENDING, WAITING and DEAD_LETTER (no worker executes the run, and it is not finished).';

-- Checks that a live worker serves workflow@to and applies the migration workflow@from>to.
create function runledger._check_migration_served(p_workflow text, p_from text, p_to text, p_what text) returns void
language plpgsql stable as $$
begin
  if not exists (select 1 from runledger.live_workers w where (p_workflow || '@' || p_to) = any(w.workflows)) then
    raise exception using errcode = 'RL006',
      message = format('%s: no live worker serves %s@%s; start one, then migrate', p_what, p_workflow, p_to);
  end if;
  if not exists (select 1 from runledger.live_workers w where (p_workflow || '@' || p_from || '>' || p_to) = any(w.migrations)) then
    raise exception using errcode = 'RL006',
      message = format('%s: no live worker has a migration of %s from version %s to %s (migrations: { %L: migrate } on version %s)',
                       p_what, p_workflow, p_from, p_to, p_from, p_to);
  end if;
end;
$$;
comment on function runledger._check_migration_served(text, text, text, text) is
  'Raises RL006 (UNKNOWN_WORKFLOW) unless a live worker serves workflow@to and has registered the migration workflow@from>to.';

create function runledger._migrate_run(p_run_id text, p_to_version text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  if p_to_version is null or p_to_version !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$' then
    raise exception using errcode = 'RL003', message = format('migrate_run: to_version %L is not a version name', p_to_version);
  end if;
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('migrate_run: run %L not found', p_run_id);
  end if;
  if v_run.workflow_version = p_to_version then
    raise exception using errcode = 'RL005',
      message = format('migrate_run: run %s is already on version %s of %s', p_run_id, p_to_version, v_run.workflow_name);
  end if;
  if not runledger._migratable(v_run.status) then
    raise exception using errcode = 'RL005',
      message = format('migrate_run: run %s is %s; only PENDING, WAITING and DEAD_LETTER runs are migrated (%s)', p_run_id, v_run.status,
                       case when runledger.is_terminal(v_run.status) then 'a finished run stays on the version it finished on'
                            else 'a worker executes it now: migrate it once it waits or is released' end);
  end if;
  perform runledger._check_migration_served(v_run.workflow_name, v_run.workflow_version, p_to_version, 'migrate_run');
  if v_run.migrate_to = p_to_version then
    return false; -- already marked: the worker applies it once
  end if;
  update runledger.runs set migrate_to = p_to_version, updated_at = runledger.now() where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'migration_requested',
          jsonb_build_object('from_version', v_run.workflow_version, 'to_version', p_to_version,
                             'status', v_run.status, 'manifest', v_run.version_manifest), v_run.fencing_token);
  -- Workers with the migration apply it at once instead of at their next sweep.
  perform pg_notify('runledger_migrate', v_run.workflow_name || '@' || v_run.workflow_version || '>' || p_to_version);
  return true;
end;
$$;
comment on function runledger._migrate_run(text, text) is
  'The action behind runledger.migrate_run (which records it in audit_log): Operator action: marks a PENDING, WAITING or DEAD_LETTER run to continue on version to_version of its workflow. A live worker that serves that version and has a migration from the run''s version applies it (the workflow''s migrate, in the run''s transaction) and records the event migrated with both manifests; a migrate that fails is recorded as migration_failed and the run is left as it was. Returns false when the run was already marked for that version. Refused (and nothing changed): an unknown run (RL002), a finished or executing run (RL005), no live worker with the version and the migration (RL006).';

create function runledger._migrate_runs(p_workflow text, p_from_version text, p_to_version text, p_limit int default null)
returns setof text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_id text;
begin
  if p_limit is not null and p_limit < 1 then
    raise exception using errcode = 'RL003', message = format('migrate_runs: limit must be >= 1 (or null for all), not %s', p_limit);
  end if;
  if p_from_version = p_to_version then
    raise exception using errcode = 'RL003', message = 'migrate_runs: from_version and to_version are the same';
  end if;
  perform runledger._check_migration_served(p_workflow, p_from_version, p_to_version, 'migrate_runs');
  for v_id in
    select r.run_id from runledger.runs r
     where r.workflow_name = p_workflow and r.workflow_version = p_from_version
       and runledger._migratable(r.status) and r.migrate_to is distinct from p_to_version
     order by r.created_at, r.run_id
     limit p_limit
     for update skip locked
  loop
    perform runledger._migrate_run(v_id, p_to_version);
    return next v_id;
  end loop;
end;
$$;
comment on function runledger._migrate_runs(text, text, text, int) is
  'The action behind runledger.migrate_runs (which records it in audit_log): Operator action: migrate_run for the PENDING, WAITING and DEAD_LETTER runs of workflow@from_version, oldest first, at most limit of them (the canary form: migrate a few, watch them, then the rest with limit null). Returns the run ids it marked.';

create function runledger._take_migration(p_pairs text[])
returns table (run_id text, workflow_name text, from_version text, to_version text, status runledger.run_status,
               input jsonb, version_manifest jsonb, checkpoints jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  -- A marked run that finished on its old version meanwhile is not migrated.
  with dropped as (
    update runledger.runs r set migrate_to = null
     where r.migrate_to is not null and runledger.is_terminal(r.status) and r.status <> 'DEAD_LETTER'
    returning r.run_id, r.workflow_version, r.status, r.fencing_token)
  insert into runledger.events (run_id, kind, detail, fencing_token)
  select d.run_id, 'migration_dropped', jsonb_build_object('version', d.workflow_version, 'status', d.status), d.fencing_token
    from dropped d;
  return query
  select r.run_id, r.workflow_name, r.workflow_version, r.migrate_to, r.status, r.input, r.version_manifest,
         -- output wrapped in a one-element array, as claims return it: JSON null and "no value" stay distinct.
         coalesce((select jsonb_agg(jsonb_build_object('seq', s.seq, 'name', s.name, 'kind', s.kind, 'status', s.status,
                                                       'output', case when s.output is null then null else jsonb_build_array(s.output) end,
                                                       'error', s.error) order by s.seq)
                     from runledger.steps s where s.run_id = r.run_id), '[]')
    from (select m.run_id from runledger.runs m
           where m.migrate_to is not null and runledger._migratable(m.status)
             and (m.workflow_name || '@' || m.workflow_version || '>' || m.migrate_to) = any(p_pairs)
           order by m.updated_at
           limit 1
           for update skip locked) t
    join runledger.runs r on r.run_id = t.run_id;
end;
$$;
comment on function runledger._take_migration(text[]) is
  'A worker''s migrator: locks one run marked for a migration it has (pairs: workflow@from>to) and returns its input, manifest and checkpoints; the worker then calls _apply_migration or, after rolling back, _migration_failed. Also clears the mark of runs that finished meanwhile (event migration_dropped).';

create function runledger._apply_migration(
  p_run_id text, p_to_version text, p_input jsonb, p_checkpoints jsonb, p_manifest jsonb, p_worker_id text)
returns runledger.run_status
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run     runledger.runs;
  v_before  jsonb;
  v_wait    runledger.steps;
  v_kept    int;
  v_status  runledger.run_status;
  v_old_len int;
  v_bound   int;
  v_prefix  int;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.migrate_to is distinct from p_to_version or not runledger._migratable(v_run.status) then
    raise exception using errcode = 'RL005',
      message = format('_apply_migration: run %s is not marked for a migration to %s, or no longer PENDING, WAITING or DEAD_LETTER', p_run_id, p_to_version);
  end if;
  select coalesce(jsonb_agg(jsonb_build_object('seq', s.seq, 'name', s.name, 'kind', s.kind, 'status', s.status) order by s.seq), '[]')
    into v_before from runledger.steps s where s.run_id = p_run_id;
  if p_checkpoints is not null then
    if jsonb_typeof(p_checkpoints) <> 'array' then
      raise exception using errcode = 'RL003', message = '_apply_migration: checkpoints must be a JSON array';
    end if;
    -- A waiting run keeps the position of its wait: its wake-up (signal, approval, timer) is bound to it.
    if v_run.status = 'WAITING' then
      select * into v_wait from runledger.steps s where s.run_id = p_run_id and s.status = 'WAITING';
      if found and not coalesce((p_checkpoints->v_wait.seq->>'name') = v_wait.name
                                and (p_checkpoints->v_wait.seq->>'status') = 'WAITING'
                                and jsonb_array_length(p_checkpoints) = v_wait.seq + 1, false) then
        raise exception using errcode = 'RL003',
          message = format('_apply_migration: run %s waits at step %s (%s %s); a migration of a waiting run keeps that wait as its last checkpoint, at the same position',
                           p_run_id, v_wait.seq, v_wait.kind, v_wait.name);
      end if;
    end if;
    -- Other records name step positions: the operation ledger, approvals, consumed signals,
    -- stream chunks, session entries, artifacts. Their positions keep their checkpoints (names
    -- and kinds; outputs may change), so the new code meets them where they were made.
    select count(*) into v_old_len from runledger.steps s where s.run_id = p_run_id;
    select greatest((select max(o.seq) from runledger.operations o where o.run_id = p_run_id),
                    (select max(a.seq) from runledger.approvals a where a.run_id = p_run_id),
                    (select max(g.consumed_seq) from runledger.signals g where g.run_id = p_run_id),
                    (select max(c.seq) from runledger.stream_chunks c where c.run_id = p_run_id),
                    (select max(e.step_position) from runledger.session_entries e where e.run_id = p_run_id),
                    (select max(f.step_position) from runledger.artifacts f where f.run_id = p_run_id))
      into v_bound;
    if v_bound is not null then
      v_prefix := least(v_bound + 1, v_old_len);
      if jsonb_array_length(p_checkpoints) < v_prefix
         or (v_bound >= v_old_len and jsonb_array_length(p_checkpoints) <> v_old_len)
         or exists (select 1 from runledger.steps s
                     where s.run_id = p_run_id and s.seq < v_prefix
                       and ((p_checkpoints->s.seq->>'name') is distinct from s.name
                            or coalesce(p_checkpoints->s.seq->>'kind', 'step') is distinct from s.kind)) then
        raise exception using errcode = 'RL003',
          message = format('_apply_migration: run %s has records tied to step positions up to %s (operations, approvals, signals, streams, session entries or artifacts); a migration keeps its checkpoints 0..%s with their names and kinds (their outputs may change)%s',
                           p_run_id, v_bound, v_prefix - 1,
                           case when v_bound >= v_old_len then ', and adds none after them' else '' end);
      end if;
    end if;
    delete from runledger.steps s where s.run_id = p_run_id;
    insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
    select p_run_id, (c.ord - 1)::int, c.item->>'name', coalesce(c.item->>'kind', 'step'), coalesce(c.item->>'status', 'SUCCEEDED'),
           case when jsonb_typeof(c.item->'output') = 'array' then c.item->'output'->0 end, case when c.item->'error' = 'null'::jsonb then null else c.item->'error' end,
           1, runledger.now(), runledger.now(), v_run.fencing_token
      from jsonb_array_elements(p_checkpoints) with ordinality as c(item, ord);
    -- Heartbeat progress of positions that hold no checkpoint now belonged to the old code.
    delete from runledger.step_progress p
     where p.run_id = p_run_id and p.seq >= jsonb_array_length(p_checkpoints);
  end if;
  select count(*) into v_kept from runledger.steps s where s.run_id = p_run_id;

  v_status := case when v_run.status = 'DEAD_LETTER' then 'PENDING'::runledger.run_status else v_run.status end;
  update runledger.runs
     set workflow_version = p_to_version, migrate_to = null,
         input = coalesce(p_input, input),
         version_manifest = coalesce(p_manifest, '{}') || jsonb_build_object('migrated_from', v_run.workflow_version),
         status = v_status, updated_at = runledger.now(),
         -- A dead-lettered run comes back as retry_run brings it back.
         error = case when v_run.status = 'DEAD_LETTER' then null else error end,
         finished_at = case when v_run.status = 'DEAD_LETTER' then null else finished_at end,
         recovery_attempts = case when v_run.status = 'DEAD_LETTER' then 0 else recovery_attempts end,
         termination_reason = case when v_run.status = 'DEAD_LETTER' then null else termination_reason end,
         termination_evidence = case when v_run.status = 'DEAD_LETTER' then null else termination_evidence end,
         terminated_at = case when v_run.status = 'DEAD_LETTER' then null else terminated_at end
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'migrated', jsonb_strip_nulls(jsonb_build_object(
            'from_version', v_run.workflow_version, 'to_version', p_to_version, 'worker', p_worker_id,
            'previous_status', v_run.status, 'status', v_status,
            'manifest_before', v_run.version_manifest, 'manifest_after', coalesce(p_manifest, '{}'),
            'input_changed', p_input is not null and p_input is distinct from v_run.input,
            'checkpoints_before', v_before, 'checkpoints_kept', v_kept,
            'termination_reason', v_run.termination_reason, 'termination_evidence', v_run.termination_evidence)),
          v_run.fencing_token);
  if v_run.status = 'DEAD_LETTER' then
    -- Back in the automatic path, through admission like any run that becomes PENDING.
    perform runledger._make_runnable(p_run_id, 0);
  elsif v_run.status = 'PENDING' and v_run.admitted then
    -- Already admitted (its queue slot and rate admission stay as they were): only the
    -- new version's workers are told, so they claim it at once.
    perform runledger._dispatch(p_run_id, v_run.queue_name);
  end if;
  return v_status;
end;
$$;
comment on function runledger._apply_migration(text, text, jsonb, jsonb, jsonb, text) is
  'A worker''s migrator, in the transaction of _take_migration: moves the run to to_version with the input (null: unchanged), the checkpoints (null: unchanged; else they replace the history, positions 0..n-1, each {name, kind, status, output: [value] or null, error}) and the new version''s manifest the workflow''s migrate produced; records the event migrated with both manifests. A DEAD_LETTER run becomes PENDING; a WAITING one must keep its wait as its last checkpoint.';

create function runledger._migration_failed(p_run_id text, p_to_version text, p_error jsonb, p_worker_id text) returns void
language sql volatile
set enable_seqscan = off set jit = off as $$
  with cleared as (
    update runledger.runs r set migrate_to = null
     where r.run_id = p_run_id and r.migrate_to = p_to_version
    returning r.run_id, r.workflow_version, r.fencing_token)
  insert into runledger.events (run_id, kind, detail, fencing_token)
  select c.run_id, 'migration_failed',
         jsonb_build_object('from_version', c.workflow_version, 'to_version', p_to_version, 'error', p_error, 'worker', p_worker_id),
         c.fencing_token
    from cleared c
$$;
comment on function runledger._migration_failed(text, text, jsonb, text) is
  'A worker''s migrator, after rolling back: the migration of the run to to_version failed (its migrate threw, or returned what cannot be written). Clears the mark and records the event migration_failed with the error; the run is left as it was.';

-- Patch markers: ctx.patched('fix-1') records the step '@patch:fix-1' where a run takes the new code.
create index steps_patch_markers on runledger.steps (name) where name like '@patch:%';

create view runledger.patches as
with taken as (
  select r.workflow_name, r.workflow_version, substr(s.name, 8) as patch,
         count(*) as runs_taken,
         count(*) filter (where r.status not in ('SUCCEEDED', 'CANCELLED', 'TERMINATED')) as replayable_taken,
         min(s.finished_at) as first_taken_at
    from runledger.steps s
    join runledger.runs r on r.run_id = s.run_id
   where s.name like '@patch:%'
   group by r.workflow_name, r.workflow_version, substr(s.name, 8))
select t.workflow_name, t.workflow_version, t.patch, t.runs_taken, t.replayable_taken, t.first_taken_at,
       b.replayable_before
  from taken t
  cross join lateral (
    select count(*) as replayable_before
      from runledger.runs o
     where o.workflow_name = t.workflow_name and o.workflow_version = t.workflow_version
       and o.status not in ('SUCCEEDED', 'CANCELLED', 'TERMINATED') and o.created_at < t.first_taken_at
       and not exists (select 1 from runledger.steps p where p.run_id = o.run_id and p.name = '@patch:' || t.patch)) b;
comment on view runledger.patches is
  'Per workflow version and patch (ctx.patched): runs that took it, how many of them may still execute or replay (not SUCCEEDED, CANCELLED or TERMINATED), when it was first taken, and replayable_before: runs from before the patch that did not take it and may still replay, so still need the old branch. At replayable_before = 0 the old branch can go (ctx.deprecatePatch); at replayable_taken = 0 the deprecatePatch call can go too.';

insert into runledger.migrations (version, name) values (15, '0015_versions');
