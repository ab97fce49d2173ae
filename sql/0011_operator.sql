-- 0011_operator: operator actions on whole runs. (The others sit with their concept:
-- retry_run in 0003_recovery, decide_approval in 0004_waits, cancel_run in
-- 0005_termination, resolve_operation in 0006_operations, set_queue in 0007_queues.)
--
--   runledger.fork_run(run_id, from_step, version)  a new run that reuses the source's checkpoints before from_step
--   runledger.prune(older_than)            deletes finished runs (and everything they own) older than that

create function runledger._fork_run(p_run_id text, p_from_step int, p_version text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_src  runledger.runs;
  v_id   text := runledger._new_id();
  v_done int;
  v_now  timestamptz := runledger.now();
  v_manifest jsonb;
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
    policy_version, created_at, updated_at)
  values (
    v_id, v_src.workflow_name, coalesce(p_version, v_src.workflow_version), v_src.queue_name, v_src.input, v_src.priority, v_src.concurrency_key,
    v_src.tenant_id,
    -- The fork gets the same lifetime the source had, counted from now.
    v_now + (v_src.deadline_at - v_src.created_at), v_src.max_recovery_attempts,
    v_manifest || jsonb_build_object('forked_from', p_run_id, 'from_step', p_from_step),
    v_src.max_steps, v_src.budget, v_src.no_progress, v_src.retry_budget, v_src.policy_version, v_now, v_now);
  -- Finished checkpoints before from_step are reused: those steps do not run again in the fork.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token, output_hash)
  select v_id, s.seq, s.name, s.kind, s.status, s.output, s.error, s.attempts, s.started_at, s.finished_at, 0, s.output_hash
    from runledger.steps s
   where s.run_id = p_run_id and s.seq < p_from_step and s.status <> 'WAITING';
  insert into runledger.events (run_id, kind, detail, at) values
    (v_id, 'created', jsonb_build_object('forked_from', p_run_id, 'from_step', p_from_step,
                                          'from_version', v_src.workflow_version, 'version', coalesce(p_version, v_src.workflow_version)), v_now),
    (p_run_id, 'forked', jsonb_build_object('fork', v_id, 'from_step', p_from_step, 'version', coalesce(p_version, v_src.workflow_version)), v_now);
  perform runledger._make_runnable(v_id, 0);
  return v_id;
end;
$$;
comment on function runledger._fork_run(text, int, text) is
  'The action behind runledger.fork_run (which records it in audit_log): Operator action: starts a new run of the same workflow and input that reuses the source run''s checkpoints before step from_step (0 = start over) and runs the rest, on the source''s version or on version (a registered version of the workflow, with its manifest). Returns the new run_id. Operations copied this way are not compensated by the fork.';

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

insert into runledger.migrations (version, name) values (11, '0011_operator');
