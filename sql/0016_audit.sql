-- 0016_audit: every operator action, recorded in the transaction that does it.
--
--   runledger.audit_log                     one row per operator action: who (login, role, the name given), what, which run, arguments, result
--   runledger._audit(...)                   writes one row
--   the operator actions themselves:        send_signal, decide_approval, cancel_run, compensate_run, retry_run,
--                                           resolve_operation, fork_run, migrate_run, migrate_runs, set_queue, prune,
--                                           release_session, delete_session, prune_artifact_blobs
--
-- Each public action is a thin function here over the action's body (runledger._<action>,
-- in the file of its concept), so the engine's own calls of a body (a cancel cascading to
-- child runs, a session handed to the next run, migrate_runs marking runs) are part of the
-- one action that caused them and are not recorded again. A refused action raises and
-- leaves no row: its transaction rolls back with it.

create table runledger.audit_log (
  audit_id    bigint generated always as identity primary key,
  at          timestamptz not null default runledger.now(),
  -- Who, as the database knows it: the login and the role it acted as.
  db_user     text not null default session_user,
  db_role     text not null default runledger._caller(),
  -- Who, as the caller says (decide_approval's decided_by, resolve_operation's resolved_by).
  asserted_by text,
  action      text not null,
  -- The run acted on, when the action has one (not a foreign key: the record outlives a pruned run).
  run_id      text,
  -- What else it acted on: a request, an operation, a queue, a session.
  target      text,
  arguments   jsonb not null default '{}',
  result      jsonb
);
create index audit_log_run on runledger.audit_log (run_id, audit_id) where run_id is not null;
comment on table runledger.audit_log is
  'One row per operator action (send_signal, decide_approval, cancel_run, compensate_run, retry_run, resolve_operation, fork_run, migrate_run, migrate_runs, set_queue, prune, release_session, delete_session, prune_artifact_blobs; and prune_due, set_retention, clear_retention of 0020_retention.sql), written in the same transaction as the action: who (db_user = session_user, db_role = runledger._caller(), asserted_by = the name the caller gave), what, on which run and target, with which arguments, and what it returned. Kept when runs are pruned.';

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
  v_status text := runledger._resolve_operation(p_operation_id, p_status, p_result, p_resolved_by);
begin
  -- The result is the caller's data: recorded is that one was given, not its content.
  perform runledger._audit('resolve_operation', (select o.run_id from runledger.operations o where o.operation_id = p_operation_id),
                           p_operation_id, jsonb_build_object('status', p_status, 'with_result', p_result is not null),
                           to_jsonb(v_status), p_resolved_by);
  return v_status;
end;
$$;
comment on function runledger.resolve_operation(text, text, jsonb, text) is
  'Operator action: settles an UNKNOWN operation as SUCCEEDED (with its result) or FAILED, and wakes the run waiting on it. Returns the status set. Recorded in audit_log.';

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
returns setof text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_ids text[] := array(select runledger._migrate_runs(p_workflow, p_from_version, p_to_version, p_limit));
begin
  perform runledger._audit('migrate_runs', null, p_workflow,
                           jsonb_build_object('from_version', p_from_version, 'to_version', p_to_version, 'limit', p_limit),
                           jsonb_build_object('marked', cardinality(v_ids), 'run_ids', to_jsonb(v_ids)));
  return query select unnest(v_ids);
end;
$$;
comment on function runledger.migrate_runs(text, text, text, int) is
  'Operator action: migrate_run for the PENDING, WAITING and DEAD_LETTER runs of workflow@from_version, oldest first, at most limit of them (the canary form). Returns the run ids it marked. Recorded in audit_log as one action.';

create function runledger.set_queue(p_name text, p_options jsonb) returns runledger.queues
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_queue runledger.queues;
begin
  -- Queues are shared by every tenant (0018_tenants.sql).
  perform runledger._check_not_tenant_bound('set_queue');
  v_queue := runledger._set_queue(p_name, p_options);
  perform runledger._audit('set_queue', null, p_name, p_options, to_jsonb(v_queue));
  return v_queue;
end;
$$;
comment on function runledger.set_queue(text, jsonb) is
  'Operator action: creates or changes a queue''s limits (concurrency, per_key_concurrency, rate_limit_max, rate_limit_period_ms) and pause; returns its row. Recorded in audit_log.';

create function runledger.prune(p_older_than interval) returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_count bigint := runledger._prune(p_older_than);
begin
  perform runledger._audit('prune', null, null, jsonb_build_object('older_than', p_older_than::text), to_jsonb(v_count));
  return v_count;
end;
$$;
comment on function runledger.prune(interval) is
  'Operator action: deletes finished runs (terminal, finished before now - older_than) with their steps, events, operations, signals and approvals, and workers stopped before then. Returns how many runs it removed. The audit log is kept. Recorded in audit_log.';

create function runledger.release_session(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_next text := runledger._release_session(p_session_id);
begin
  perform runledger._audit('release_session', null, p_session_id, '{}', to_jsonb(v_next));
  return v_next;
end;
$$;
comment on function runledger.release_session(text) is
  'Operator repair: takes a session from the run holding it and hands it to the next waiting run; returns that run (null: nobody waited). Recorded in audit_log.';

create function runledger.delete_session(p_session_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_removed int := runledger._delete_session(p_session_id);
begin
  perform runledger._audit('delete_session', null, p_session_id, '{}', to_jsonb(v_removed));
  return v_removed;
end;
$$;
comment on function runledger.delete_session(text) is
  'Operator action: deletes a session that no run holds or waits for, with its entries; returns how many entries it removed. Recorded in audit_log.';

create function runledger.prune_artifact_blobs() returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_removed bigint := runledger._prune_artifact_blobs();
begin
  perform runledger._audit('prune_artifact_blobs', null, null, '{}', to_jsonb(v_removed));
  return v_removed;
end;
$$;
comment on function runledger.prune_artifact_blobs() is
  'Operator action: deletes artifact contents no artifact refers to any more; returns how many it removed. Recorded in audit_log.';

insert into runledger.migrations (version, name) values (16, '0016_audit');
