-- 0010_operator: the audit log and the operator actions: signal, approve, cancel, compensate, retry, resolve, fork, migrate, prune.
--
-- tables: audit_log
-- indexes: runs_migrating, steps_patch_markers, audit_log_run, runs_forked_from
-- functions: _retry_run, _fork_run, _prune, _migratable, _check_migration_served, _migrate_run,
--   _migrate_runs, _take_migration, _apply_migration, _migration_failed, _audit, send_signal,
--   decide_approval, cancel_run, compensate_run, retry_run, resolve_operation, fork_run, migrate_run,
--   migrate_runs, set_queue, prune, _fork_key_notice

create function runledger._retry_run(p_run_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run     runledger.runs;
  v_dropped jsonb;
  v_reset   jsonb;
  v_undone  jsonb;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('retry_run: run %L not found', p_run_id);
  end if;
  if v_run.status not in ('DEAD_LETTER', 'FAILED') then
    raise exception using errcode = 'RL005',
      message = format('retry_run: run %s is %s; only DEAD_LETTER and FAILED runs can be retried', p_run_id, v_run.status);
  end if;
  -- A retry replays the run's checkpoints and goes on: never from an effect a compensation
  -- undid (it would ship against a refunded charge). Doing that work again is a fork from
  -- before it, which calls the operation again.
  v_undone := runledger._undone_operations(p_run_id);
  if v_undone <> '[]'::jsonb then
    raise exception using errcode = 'RL005', message = runledger._undone_refusal('retry_run', p_run_id, v_undone);
  end if;
  -- The failed step that ended the run is run again; every successful checkpoint stays.
  delete from runledger.steps s
   where s.run_id = p_run_id and s.status = 'FAILED'
     and s.seq = (select max(seq) from runledger.steps where run_id = p_run_id)
  returning jsonb_build_object('seq', s.seq, 'name', s.name, 'error', s.error) into v_dropped;
  -- A failed operation at that step is callable again: the ledger row goes back to PLANNED
  -- (same operation_id and idempotency key, no attempt made yet); the failure it held is
  -- kept in the 'retried' event. An UNKNOWN one stays UNKNOWN (reconcile or an operator settles it).
  update runledger.operations o
     set status = 'PLANNED', attempts = 0, error = null, result = null, finished_at = null, resolved_by = null,
         updated_at = runledger.now()
    from (select * from runledger.operations
           where run_id = p_run_id and seq = (v_dropped->>'seq')::int and status = 'FAILED' for update) old
   where o.operation_id = old.operation_id
  returning jsonb_build_object('operation_id', old.operation_id, 'name', old.name, 'idempotency_key', old.idempotency_key,
                               'attempts', old.attempts, 'error', old.error, 'resolved_by', old.resolved_by) into v_reset;

  update runledger.runs
     set status = 'PENDING', error = null, output = null, finished_at = null, updated_at = runledger.now(),
         recovery_attempts = 0, termination_reason = null, termination_evidence = null,
         terminated_at = null
   where run_id = p_run_id;
  -- The old termination record is kept in the history.
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'retried', jsonb_strip_nulls(jsonb_build_object(
            'previous_status', v_run.status, 'termination_reason', v_run.termination_reason,
            'termination_evidence', v_run.termination_evidence, 'error', v_run.error,
            'dropped_failed_step', v_dropped, 'reset_operation', v_reset)), v_run.fencing_token);
  perform runledger._make_runnable(p_run_id, 0);
  return 'PENDING';
end;
$$;
comment on function runledger._retry_run(text) is
  'The action behind runledger.retry_run (which records it in audit_log): Operator action: a DEAD_LETTER or FAILED run goes back to PENDING with its successful checkpoints intact (the last failed step runs again; a FAILED operation at that step goes back to PLANNED, called again with the same idempotency key) and recovery attempts reset; the old termination record and the operation''s failure stay in events. Returns the new status. RL005 for a run whose compensations undid (or tried to undo) an operation it would replay (runledger._undone_operations): the message says to fork it from before the first, which calls the operation again.';

-- A fork reads its source FOR KEY SHARE: prune_due skips (SKIP LOCKED) a run being forked,
-- and a fork waits for a prune that holds the source.
create function runledger._fork_run(p_run_id text, p_from_step int, p_version text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_src  runledger.runs;
  v_id   text := runledger._new_id();
  v_done int;
  v_now  timestamptz := runledger.now();
  v_manifest jsonb;
  v_undone jsonb;
  v_keys   text;
begin
  -- FOR KEY SHARE: retention (prune_due) skips the source while the fork is being made.
  select * into v_src from runledger.runs where run_id = p_run_id for key share;
  if not found then
    raise exception using errcode = 'RL002', message = format('fork_run: run %L not found', p_run_id);
  end if;
  select count(*) into v_done from runledger.steps where run_id = p_run_id and status <> 'WAITING';
  if p_from_step is null or p_from_step < 0 or p_from_step > v_done then
    raise exception using errcode = 'RL003',
      message = format('fork_run: from_step must be between 0 and %s (the checkpoints of run %s), not %s', v_done, p_run_id, p_from_step);
  end if;
  -- A copied checkpoint of an operation whose effect a compensation undid would let the fork
  -- go on as if it stood (ship against a refunded charge): fork from before it, which calls
  -- the operation again (_operation_begin: a new attempt under its key).
  v_undone := runledger._undone_operations(p_run_id, p_from_step);
  if v_undone <> '[]'::jsonb then
    raise exception using errcode = 'RL005', message = runledger._undone_refusal('fork_run', p_run_id, v_undone);
  end if;
  v_manifest := v_src.version_manifest;
  if p_version is not null and p_version <> v_src.workflow_version then
    -- The fork runs on another version's code (after a fix, or past a non-determinism):
    -- it takes that version's manifest, as a run started on it would.
    select w.manifest into v_manifest from runledger.workflows w
     where w.workflow_name = v_src.workflow_name and w.workflow_version = p_version;
    if not found then
      raise exception using errcode = 'RL006',
        message = format('fork_run: workflow %s has no version %L registered (a worker or engine that defines it registers it)', v_src.workflow_name, p_version);
    end if;
    v_manifest := coalesce(v_manifest, '{}');
  end if;
  insert into runledger.runs (
    run_id, workflow_name, workflow_version, queue_name, input, priority, concurrency_key, tenant_id,
    deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress, retry_budget,
    policy_version, created_at, updated_at, lineage_id)
  values (
    v_id, v_src.workflow_name, coalesce(p_version, v_src.workflow_version), v_src.queue_name, v_src.input, v_src.priority, v_src.concurrency_key,
    v_src.tenant_id,
    -- The fork gets the same lifetime the source had, counted from now.
    v_now + (v_src.deadline_at - v_src.created_at), v_src.max_recovery_attempts,
    v_manifest || jsonb_build_object('forked_from', p_run_id, 'from_step', p_from_step),
    v_src.max_steps, v_src.budget, v_src.no_progress, v_src.retry_budget, v_src.policy_version, v_now, v_now,
    -- ctx.lineageId: the run the chain of forks started from.
    coalesce(v_src.lineage_id, v_src.run_id));
  -- Finished checkpoints before from_step are reused: those steps do not run again in the fork.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token, output_hash)
  select v_id, s.seq, s.name, s.kind, s.status, s.output, s.error, s.attempts, s.started_at, s.finished_at, 0, s.output_hash
    from runledger.steps s
   where s.run_id = p_run_id and s.seq < p_from_step and s.status <> 'WAITING';
  insert into runledger.events (run_id, kind, detail, at) values
    (v_id, 'created', jsonb_build_object('forked_from', p_run_id, 'from_step', p_from_step,
                                          'from_version', v_src.workflow_version, 'version', coalesce(p_version, v_src.workflow_version)), v_now),
    (p_run_id, 'forked', jsonb_build_object('fork', v_id, 'from_step', p_from_step, 'version', coalesce(p_version, v_src.workflow_version)), v_now);
  -- The operations the fork runs again whose key holds the source's run id: made from ctx.runId,
  -- such a key is new in the fork, which then calls again (a second payment). Said, not refused:
  -- a key made from ctx.lineageId holds it too when the source was never forked.
  select string_agg(format('%s (step %s, key %s)', o.name, o.seq, o.idempotency_key), ', ' order by o.seq) into v_keys
    from runledger.operations o
   where o.run_id = p_run_id and o.seq >= p_from_step and strpos(o.idempotency_key, p_run_id) > 0;
  if v_keys is not null then
    raise notice using message = runledger._fork_key_notice(v_id, p_run_id, v_src.lineage_id is null, v_keys);
  end if;
  perform runledger._make_runnable(v_id, 0);
  return v_id;
end;
$$;
comment on function runledger._fork_run(text, int, text) is
  'The action behind runledger.fork_run (which records it in audit_log): Operator action: starts a new run of the same workflow and input that reuses the source run''s checkpoints before step from_step (0 = start over) and runs the rest, on the source''s version or on version (a registered version of the workflow, with its manifest). Returns the new run_id. Operations copied this way are not compensated by the fork. The fork''s lineage_id is the source''s (or the source''s run id). RL005 when a checkpoint it would copy is of an operation a compensation undid (runledger._undone_operations: fork from before it). A NOTICE lists the operations from from_step on whose idempotency key holds the source''s run id (made from ctx.runId, the fork calls them again under a new key).';

create function runledger._prune(p_older_than interval) returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_cutoff timestamptz := runledger.now() - p_older_than;
  v_count  bigint;
begin
  if p_older_than is null or p_older_than < interval '0' then
    raise exception using errcode = 'RL003', message = 'prune: older_than must be an interval >= 0';
  end if;
  -- Steps, events, operations, signals, approvals and progress go with their run (on delete cascade).
  with gone as (
    delete from runledger.runs r
     where runledger.is_terminal(r.status) and r.finished_at < v_cutoff
    returning 1)
  select count(*) into v_count from gone;
  delete from runledger.workers w where w.stopped_at < v_cutoff;
  return v_count;
end;
$$;
comment on function runledger._prune(interval) is
  'The action behind runledger.prune (which records it in audit_log): Deletes finished runs (terminal, finished before now - older_than) with their steps, events, operations, signals and approvals, and workers stopped before then. Returns how many runs it removed.';

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
  v_run    runledger.runs;
  v_undone jsonb;
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
  -- A migrated run goes on from its checkpoints, as a retried one does: never from an undone effect.
  v_undone := runledger._undone_operations(p_run_id);
  if v_undone <> '[]'::jsonb then
    raise exception using errcode = 'RL005', message = runledger._undone_refusal('migrate_run', p_run_id, v_undone)
      || format(' (fork_run''s version argument runs the fork on version %s)', p_to_version);
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
  'The action behind runledger.migrate_run (which records it in audit_log): Operator action: marks a PENDING, WAITING or DEAD_LETTER run to continue on version to_version of its workflow. A live worker that serves that version and has a migration from the run''s version applies it (the workflow''s migrate, in the run''s transaction) and records the event migrated with both manifests; a migrate that fails is recorded as migration_failed and the run is left as it was. Returns false when the run was already marked for that version. Refused (and nothing changed): an unknown run (RL002), a finished or executing run (RL005), a run whose compensations undid an operation it would replay (RL005: fork it instead, runledger._undone_operations), no live worker with the version and the migration (RL006).';

create function runledger._migrate_runs(p_workflow text, p_from_version text, p_to_version text, p_limit int default null)
returns table (run_id text, marked boolean, reason text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_id     text;
  v_undone jsonb;
  v_seen   text[] := '{}';
  v_last   runledger.runs;
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
    v_seen := v_seen || v_id;
    v_undone := runledger._undone_operations(v_id);
    if v_undone <> '[]'::jsonb then
      return query select v_id, false, format('compensations undid %s: fork it from step %s instead',
        (select string_agg(u->>'name', ', ' order by (u->>'seq')::int) from jsonb_array_elements(v_undone) u), v_undone->0->>'seq');
      continue;
    end if;
    perform runledger._migrate_run(v_id, p_to_version);
    return query select v_id, true, null::text;
  end loop;
  -- The runs SKIP LOCKED passed over: those of the selection another transaction held locked.
  -- With a limit that was reached, the ones before the last run taken; otherwise all of them
  -- (at most the part of the limit left). Read without a lock: they may have changed since.
  select * into v_last from runledger.runs r where r.run_id = v_seen[cardinality(v_seen)];
  return query
    select r.run_id, false, 'locked by another transaction at that moment: not marked; call migrate_runs again'::text
      from runledger.runs r
     where r.workflow_name = p_workflow and r.workflow_version = p_from_version
       and runledger._migratable(r.status) and r.migrate_to is distinct from p_to_version
       and not (r.run_id = any(v_seen))
       and (p_limit is null or cardinality(v_seen) < p_limit or (r.created_at, r.run_id) < (v_last.created_at, v_last.run_id))
     order by r.created_at, r.run_id
     limit case when p_limit is null or cardinality(v_seen) >= p_limit then null else p_limit - cardinality(v_seen) end;
end;
$$;
comment on function runledger._migrate_runs(text, text, text, int) is
  'The action behind runledger.migrate_runs (which records it in audit_log): Operator action: migrate_run for the PENDING, WAITING and DEAD_LETTER runs of workflow@from_version, oldest first, at most limit of them (the canary form: migrate a few, watch them, then the rest with limit null). Returns a row per run of the selection: marked true for each run it marked, false with the reason for each it did not: a run whose compensations undid an operation (fork it instead), or one another transaction held locked at that moment (a claim, a signal, an open transaction: not waited for; call again).';

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

create table runledger.audit_log (
  audit_id    bigint generated always as identity primary key,
  at          timestamptz not null default runledger.now(),
  -- Who, as the database knows it: the login and the role it acted as.
  db_user     text collate "C" not null default session_user,
  db_role     text collate "C" not null default runledger._caller(),
  -- Who, as the caller says (decide_approval's decided_by, resolve_operation's resolved_by).
  asserted_by text collate "C",
  action      text collate "C" not null,
  -- The run acted on, when the action has one (not a foreign key: the record outlives a pruned run).
  run_id      text collate "C",
  -- What else it acted on: a request, an operation, a queue, a session.
  target      text collate "C",
  arguments   jsonb not null default '{}',
  result      jsonb
);
comment on table runledger.audit_log is
  'One row per operator action (send_signal, decide_approval, cancel_run, compensate_run, retry_run, resolve_operation, fork_run, migrate_run, migrate_runs, set_queue, prune, release_session, delete_session, prune_artifact_blobs; and prune_due, set_retention, clear_retention (0013_retention.sql), and owner_settings, a change of runledger.owner_settings by the schema''s owner), written in the same transaction as the action: who (db_user = session_user, db_role = runledger._caller(), asserted_by = the name the caller gave), what, on which run and target, with which arguments, and what it returned. Kept when runs are pruned; the audit_log retention rule never removes a record younger than owner_settings.audit_log_min_keep, nor one of set_retention, clear_retention or owner_settings.';

create index audit_log_run on runledger.audit_log (run_id, audit_id) where run_id is not null;

create function runledger._audit(
  p_action text, p_run_id text, p_target text, p_arguments jsonb, p_result jsonb, p_asserted_by text default null)
returns void language sql volatile as $$
  insert into runledger.audit_log (action, run_id, target, arguments, result, asserted_by)
  values (p_action, p_run_id, p_target, jsonb_strip_nulls(coalesce(p_arguments, '{}')), p_result, p_asserted_by)
$$;
comment on function runledger._audit(text, text, text, jsonb, jsonb, text) is
  'Records one operator action in runledger.audit_log (the caller''s login and role are taken from session_user and runledger._caller()).';

create function runledger.send_signal(p_run_id text, p_topic text, p_payload jsonb, p_signal_id text default null)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_accepted boolean := runledger._send_signal(p_run_id, p_topic, p_payload, p_signal_id);
begin
  -- The payload is the caller's data: the record names the topic and signal, not what it carried.
  perform runledger._audit('send_signal', p_run_id, p_topic, jsonb_build_object('signal_id', p_signal_id), to_jsonb(v_accepted));
  return v_accepted;
end;
$$;
comment on function runledger.send_signal(text, text, jsonb, text) is
  'Delivers a signal to a run''s durable inbox; returns false (changing nothing) when signal_id was already accepted. Wakes the run if it waits on this topic; otherwise the signal waits for a later wait. Unknown run: RL002; finished run: RL005. Recorded in audit_log.';

create function runledger.decide_approval(p_request_id text, p_approved boolean, p_decided_by text, p_note text default null)
returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_decision jsonb := runledger._decide_approval(p_request_id, p_approved, p_decided_by, p_note);
begin
  perform runledger._audit('decide_approval', (select a.run_id from runledger.approvals a where a.request_id = p_request_id),
                           p_request_id, jsonb_build_object('approved', p_approved, 'note', p_note), v_decision, p_decided_by);
  return v_decision;
end;
$$;
comment on function runledger.decide_approval(text, boolean, text, text) is
  'Decides a pending approval request. The first decision wins and stays as audit evidence (with the deciding login and role); later calls return it with recorded = false. An approver outside the request''s list: RL007; expired request: RL005. Wakes the waiting run. Recorded in audit_log.';

create function runledger.cancel_run(p_run_id text, p_reason text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_status text := runledger._cancel_run(p_run_id, p_reason);
begin
  perform runledger._audit('cancel_run', p_run_id, null, jsonb_build_object('reason', p_reason), to_jsonb(v_status));
  return v_status;
end;
$$;
comment on function runledger.cancel_run(text, text) is
  'Operator action: cancels a run (and its unfinished child runs). PENDING and WAITING runs end at once (CANCELLED, or CANCELLING when compensations are due); a RUNNING run is stopped by its worker. Returns the run''s new status; a finished run is left as it is. Recorded in audit_log.';

create function runledger.compensate_run(p_run_id text, p_reason text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_status text := runledger._compensate_run(p_run_id, p_reason);
begin
  perform runledger._audit('compensate_run', p_run_id, null, jsonb_build_object('reason', p_reason), to_jsonb(v_status));
  return v_status;
end;
$$;
comment on function runledger.compensate_run(text, text) is
  'Operator action: runs the compensations of a finished run (FAILED, CANCELLED, TERMINATED, DEAD_LETTER) that are not DONE, on a worker serving its version; the run keeps its status. Returns CANCELLING while they run, or the run''s status when none is left. Recorded in audit_log.';

create function runledger.retry_run(p_run_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_status text := runledger._retry_run(p_run_id);
begin
  perform runledger._audit('retry_run', p_run_id, null, '{}', to_jsonb(v_status));
  return v_status;
end;
$$;
comment on function runledger.retry_run(text) is
  'Operator action: brings a DEAD_LETTER or FAILED run back to PENDING; its successful checkpoints stay and the failed step runs again. Returns PENDING. Recorded in audit_log.';

create function runledger.resolve_operation(p_operation_id text, p_status text, p_result jsonb default null, p_resolved_by text default null)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_status text;
begin
  -- A null status passed the action's check (null not in (...) is null) and broke the
  -- operations row's not-null constraint (23502).
  if p_status is null then
    raise exception using errcode = 'RL003', message = 'resolve_operation: status must be SUCCEEDED or FAILED, not null';
  end if;
  v_status := runledger._resolve_operation(p_operation_id, p_status, p_result, p_resolved_by);
  -- The result is the caller's data: recorded is that one was given, not its content.
  perform runledger._audit('resolve_operation', (select o.run_id from runledger.operations o where o.operation_id = p_operation_id),
                           p_operation_id, jsonb_build_object('status', p_status, 'with_result', p_result is not null),
                           to_jsonb(v_status), p_resolved_by);
  return v_status;
end;
$$;
comment on function runledger.resolve_operation(text, text, jsonb, text) is
  'Operator action: settles an UNKNOWN operation as SUCCEEDED (with its result) or FAILED, and wakes the run waiting on it. Returns the status set. A status other than SUCCEEDED or FAILED (null included): RL003. Recorded in audit_log.';

create function runledger.fork_run(p_run_id text, p_from_step int, p_version text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_fork text := runledger._fork_run(p_run_id, p_from_step, p_version);
begin
  perform runledger._audit('fork_run', p_run_id, v_fork, jsonb_build_object('from_step', p_from_step, 'version', p_version), to_jsonb(v_fork));
  return v_fork;
end;
$$;
comment on function runledger.fork_run(text, int, text) is
  'Operator action: starts a new run of the same workflow and input that reuses the source run''s checkpoints before step from_step (0 = start over) and runs the rest, on the source''s version or on version (a registered version of the workflow, with its manifest). Returns the new run_id. Operations copied this way are not compensated by the fork. Recorded in audit_log.';

create function runledger.migrate_run(p_run_id text, p_to_version text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_marked boolean := runledger._migrate_run(p_run_id, p_to_version);
begin
  perform runledger._audit('migrate_run', p_run_id, null, jsonb_build_object('to_version', p_to_version), to_jsonb(v_marked));
  return v_marked;
end;
$$;
comment on function runledger.migrate_run(text, text) is
  'Operator action: marks a PENDING, WAITING or DEAD_LETTER run to continue on version to_version of its workflow; a live worker with the migration applies it (event migrated, or migration_failed with the run left as it was). Returns false when the run was already marked for that version. Refused (nothing changed): an unknown run (RL002), a finished or executing run (RL005), no live worker with the version and the migration (RL006). Recorded in audit_log.';

create function runledger.migrate_runs(p_workflow text, p_from_version text, p_to_version text, p_limit int default null)
returns table (run_id text, marked boolean, reason text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_rows jsonb := (select coalesce(jsonb_agg(jsonb_build_object('run_id', m.id, 'marked', m.marked, 'reason', m.reason) order by m.n), '[]')
                     from runledger._migrate_runs(p_workflow, p_from_version, p_to_version, p_limit) with ordinality m(id, marked, reason, n));
  v_marked  jsonb := (select coalesce(jsonb_agg(e->'run_id'), '[]') from jsonb_array_elements(v_rows) e where (e->>'marked')::boolean);
  v_skipped jsonb := (select coalesce(jsonb_agg(jsonb_build_object('run_id', e->'run_id', 'reason', e->'reason')), '[]')
                        from jsonb_array_elements(v_rows) e where not (e->>'marked')::boolean);
begin
  perform runledger._audit('migrate_runs', null, p_workflow,
                           jsonb_build_object('from_version', p_from_version, 'to_version', p_to_version, 'limit', p_limit),
                           jsonb_build_object('marked', jsonb_array_length(v_marked), 'run_ids', v_marked,
                                              'skipped', jsonb_array_length(v_skipped), 'skipped_runs', v_skipped));
  return query select e->>'run_id', (e->>'marked')::boolean, e->>'reason' from jsonb_array_elements(v_rows) with ordinality x(e, n) order by x.n;
end;
$$;
comment on function runledger.migrate_runs(text, text, text, int) is
  'Operator action: migrate_run for the PENDING, WAITING and DEAD_LETTER runs of workflow@from_version, oldest first, at most limit of them (the canary form). Returns a row per run: marked true for the runs it marked; false, with the reason, for a run it left on its version (another transaction held it locked at that moment: call again; its compensations undid an operation: fork it instead). Recorded in audit_log as one action, the runs it left included.';

create function runledger.set_queue(p_name text, p_options jsonb) returns runledger.queues
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_queue runledger.queues;
begin
  -- Queues are shared by every tenant (0014_security.sql).
  perform runledger._check_not_tenant_bound('set_queue');
  v_queue := runledger._set_queue(p_name, p_options);
  perform runledger._audit('set_queue', null, p_name, p_options, to_jsonb(v_queue));
  return v_queue;
end;
$$;
comment on function runledger.set_queue(text, jsonb) is
  'Operator action: creates or changes a queue''s limits (concurrency, per_key_concurrency, rate_limit_max, rate_limit_period_ms) and pause; returns its row. Recorded in audit_log.';

-- What every tenant shares (0014_security.sql): pruning by age removes every tenant's finished
-- runs and the workers table; the artifact blobs are stored once for all tenants.
create function runledger.prune(p_older_than interval) returns bigint
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

-- The forks of a run (fork_run writes forked_from into the manifest).
create index runs_forked_from on runledger.runs ((version_manifest->>'forked_from')) where version_manifest ? 'forked_from';

create function runledger._fork_key_notice(p_fork text, p_source text, p_source_never_forked boolean, p_keys text) returns text
language sql immutable as $$
  select format('fork_run: the fork %s runs again operations of run %s whose idempotency keys hold that run''s id: %s. '
                'A key made from ctx.runId is new in the fork, which then calls the operation again under it: a second '
                'effect (a second payment, a second ticket). A key made from ctx.lineageId (the same in every fork) or from '
                'the business entity stays the same, and the fork reuses the effect the source recorded%s',
                p_fork, p_source, p_keys,
                case when p_source_never_forked
                     then format(' (run %s was never forked: its lineage id is its run id, so a key made from ctx.lineageId is listed too)', p_source)
                     else '' end)
$$;
comment on function runledger._fork_key_notice(text, text, boolean, text) is
  'The NOTICE fork_run gives when operations the fork runs again (from from_step on) have idempotency keys that hold the source''s run id (p_keys: name, step and key of each): made from ctx.runId, each is called again under a new key in the fork.';

insert into runledger.migrations (version, name) values (10, '0010_operator');
