-- 0032_undone_effects_and_lineage: operator actions that never go on past an undone effect or
-- an operation in flight, migrate_runs' report of the runs it left, and a run's lineage.
--
-- Defines:
--   runs.lineage_id                                    the run a chain of forks started from (null: the run
--                                                      itself, never forked): ctx.lineageId, for idempotency
--                                                      keys that must stay the same in a fork
--   runledger._fork_key_notice(fork, source, ...)      the NOTICE fork_run gives for operations it calls again
--                                                      whose key holds the source's run id
--   runledger._undone_operations(run_id, before_seq)   the operations of a run's checkpoints (before
--                                                      before_seq) whose effect a compensation undid, or
--                                                      tried to: what a replay of those checkpoints must not
--                                                      go on from
--   runledger._undone_refusal(what, run_id, undone)    the RL005 message that names them and says how to
--                                                      do that work again (a fork from before the first)
-- Redefines (released in 0003, 0006, 0015 and 0016; sql/README.md rule 3):
--   runledger._retry_run          RL005 for a run with undone operations (docs/operations.md, "After compensations")
--   runledger._migrate_run        RL005 for a run with undone operations
--   runledger._resolve_operation  RL005 while a worker executes the operation's run: its call may be in flight
--   runledger._migrate_runs, runledger.migrate_runs
--                                 return (run_id, marked, reason): a run it did not mark is a row too, with why
--                                 (another transaction held it locked, or its effects were undone); dropped
--                                 and created again, their grants given back
-- (0020_retention.sql's _fork_run takes the same rule in place: a fork from past an undone
-- operation is RL005; it also sets lineage_id and gives the key NOTICE. 0019_tracing.sql's
-- _claim_batch returns lineage_id with each claimed run, and its _start_claimed leaves a fork
-- to the claims; 0028's _commit_and_claim_flat passes the column on.)

-- A column with no default: added without rewriting the table, and null (no bytes) in every
-- run that was never forked. The claims return it; the worker takes the run id for null.
-- Stored rather than found by walking forked_from at each claim. Callgrind, PostgreSQL 15,
-- bench/instructions.sh's drain (a table of 20,000 runs, batches of 16), the commit before
-- this file and with it: a run claimed by _claim_batch 260,420 -> 261,036 server
-- instructions (+0.24 %), a run claimed and completed by a group commit with a claim
-- 841,942 -> 843,898 (+0.23 %).
alter table runledger.runs add column lineage_id text collate "C";
comment on column runledger.runs.lineage_id is
  'The run a chain of forks started from: fork_run sets it to its source''s lineage_id, or to the source''s run_id when the source was never forked. Null for a run that was never forked (its lineage is itself). ctx.lineageId is this, or run_id when null: an idempotency key made from it is the same in every fork of the run (and in its retries, which keep the run id).';
-- The forks made before this migration: each takes the first run of its chain.
with recursive chain (run_id, lineage_id, depth) as (
  select r.run_id, r.version_manifest->>'forked_from', 1
    from runledger.runs r where r.version_manifest ? 'forked_from'
  union all
  select c.run_id, s.version_manifest->>'forked_from', c.depth + 1
    from chain c join runledger.runs s on s.run_id = c.lineage_id
   where s.version_manifest ? 'forked_from' and c.depth < 1000)
update runledger.runs r set lineage_id = c.lineage_id
  from (select distinct on (run_id) run_id, lineage_id from chain order by run_id, depth desc) c
 where r.run_id = c.run_id;

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

create function runledger._undone_operations(p_run_id text, p_before_seq int default null) returns jsonb
language sql stable
set enable_seqscan = off set jit = off as $$
  -- An operation checkpoint names its ledger row (output.operationId). A fork's copied or
  -- reused checkpoint names a row of an ancestor (copied: that row; reused: the fork's own
  -- row, attempts 0, whose effect is the ancestor's, prior_operation_id): the effect is the
  -- ancestor's, and its undo counts too.
  select coalesce(jsonb_agg(jsonb_build_object('seq', s.seq, 'name', s.name, 'operation_id', coalesce(p.operation_id, o.operation_id),
                                               'run_id', coalesce(p.run_id, o.run_id),
                                               'compensation', coalesce(p.compensation_status, o.compensation_status))
                            order by s.seq), '[]'::jsonb)
    from runledger.steps s
    join runledger.operations o on o.operation_id = s.output->>'operationId'
    left join runledger.operations p on o.attempts = 0 and p.operation_id = o.prior_operation_id
   where s.run_id = p_run_id and s.kind = 'operation' and s.status = 'SUCCEEDED'
     and (p_before_seq is null or s.seq < p_before_seq)
     and coalesce(p.compensation_status, o.compensation_status) is not null
$$;
comment on function runledger._undone_operations(text, int) is
  'The operation checkpoints of a run (those before p_before_seq; all when null) whose effect a compensation undid (compensation_status DONE) or tried to (STARTED: cut short, FAILED), the ancestor''s operation for a checkpoint a fork copied or reused: a JSON array of {seq, name, operation_id, run_id, compensation}, by seq; [] when there is none. retry_run, migrate_run and fork_run refuse to go on from such a checkpoint.';

create function runledger._undone_refusal(p_what text, p_run_id text, p_undone jsonb) returns text
language sql immutable as $$
  select format('%s: run %s has operations whose effects were undone by compensations (%s); going on from its checkpoints '
                'would act as if they stood. To do that work again, fork the run from step %s or earlier '
                '(runledger fork %s --from %s, or select runledger.fork_run(%L, %s)): the fork calls each undone operation '
                'again, as a new attempt under its idempotency key%s',
                p_what, p_run_id,
                (select string_agg(format('%s at step %s: compensation %s', u->>'name', u->>'seq', u->>'compensation'), ', ' order by (u->>'seq')::int)
                   from jsonb_array_elements(p_undone) u),
                p_undone->0->>'seq', p_run_id, p_undone->0->>'seq', p_run_id, p_undone->0->>'seq',
                case when exists (select from jsonb_array_elements(p_undone) u where u->>'compensation' <> 'DONE')
                     then '. A compensation FAILED or cut short (STARTED) is finished first: compensate_run tries it again'
                     else '' end)
$$;
comment on function runledger._undone_refusal(text, text, jsonb) is
  'The message of the RL005 that retry_run, migrate_run and fork_run raise for a run with undone operations (runledger._undone_operations): names each, and says to fork the run from the first one''s step (and to finish a FAILED or STARTED compensation with compensate_run first).';

create or replace function runledger._retry_run(p_run_id text) returns text
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

create or replace function runledger._resolve_operation(p_operation_id text, p_status text, p_result jsonb default null, p_resolved_by text default null)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_op  runledger.operations;
  v_run runledger.runs;
begin
  if p_status not in ('SUCCEEDED', 'FAILED') then
    raise exception using errcode = 'RL003', message = format('resolve_operation: status must be SUCCEEDED or FAILED, not %L', p_status);
  end if;
  select * into v_op from runledger.operations where operation_id = p_operation_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('resolve_operation: operation %L not found', p_operation_id);
  end if;
  if v_op.status not in ('UNKNOWN', 'STARTED') then
    raise exception using errcode = 'RL005', message = format('resolve_operation: operation %s is %s, not UNKNOWN', p_operation_id, v_op.status);
  end if;
  -- A worker executes the run: the call may be in flight, and the worker records its outcome
  -- (over the operator's). An expired lease too: until recovery takes the run back, the
  -- worker holding it may still write. Once no worker holds it, its writes are fenced off.
  select * into v_run from runledger.runs r where r.run_id = v_op.run_id;
  if v_run.status in ('RUNNING', 'CANCELLING') and v_run.lease_owner is not null then
    raise exception using errcode = 'RL005',
      message = format('resolve_operation: operation %s (%s) is %s and its run %s is executed by worker %s (lease %s %s): '
                       'its call may still be in flight, and that worker records the outcome. Wait: a call whose outcome is '
                       'lost leaves the operation UNKNOWN and the run waiting for you (runledger.unknown_operations)%s; '
                       'or cancel the run (cancel_run)',
                       p_operation_id, v_op.name, v_op.status, v_op.run_id, v_run.lease_owner,
                       case when v_run.lease_expires_at > runledger.now() then 'until' else 'expired at' end,
                       v_run.lease_expires_at,
                       case when v_run.lease_expires_at > runledger.now() then ''
                            else ' once recovery has taken the run back from that worker' end);
  end if;
  update runledger.operations
     set status = p_status, result = case when p_status = 'SUCCEEDED' then p_result end,
         error = case when p_status = 'FAILED' then coalesce(p_result, jsonb_build_object('message', 'resolved as failed by an operator')) end,
         resolved_by = coalesce(p_resolved_by, runledger._caller()), updated_at = runledger.now(), finished_at = runledger.now()
   where operation_id = p_operation_id;
  insert into runledger.events (run_id, kind, detail)
  values (v_op.run_id, 'operation_resolved', jsonb_build_object('operation_id', p_operation_id, 'status', p_status, 'by', coalesce(p_resolved_by, runledger._caller())));
  perform runledger._wake(v_op.run_id, 'reconcile', p_operation_id);
  return p_status;
end;
$$;
comment on function runledger._resolve_operation(text, text, jsonb, text) is
  'The action behind runledger.resolve_operation (which records it in audit_log): Operator action: settles an UNKNOWN (or STARTED) operation as SUCCEEDED (p_result is its result) or FAILED (p_result is the error), and wakes the run waiting on it. Returns the status set. RL005 while a worker holds the operation''s run (RUNNING or CANCELLING with an owner, its lease live or expired and not yet recovered): its call may be in flight and the worker records the outcome; wait, or cancel the run.';

create or replace function runledger._migrate_run(p_run_id text, p_to_version text) returns boolean
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

-- The result names every run of the selection, marked or not: a run that another transaction
-- held locked at that moment (a claim, a signal, an operator's open transaction) was skipped
-- by SKIP LOCKED and stayed on its version without a word.
drop function runledger.migrate_runs(text, text, text, int);
drop function runledger._migrate_runs(text, text, text, int);

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

select runledger._secure_functions();
-- The dropped functions lost their grants: the roles role_functions names get them back.
select runledger._give_back_grants(array['migrate_runs', '_migrate_runs']);

insert into runledger.migrations (version, name) values (32, '0032_undone_effects_and_lineage');
