-- 0002_runs: workflows, runs, steps, events and the rules every row obeys.
--
-- tables: workflows, runs, steps, events
-- indexes: runs_idempotency_key, runs_finished, runs_parent
-- triggers: runs_delete_history, runs_truncate_history, runs_invariants
-- functions: _check_run, _check_step, _register_workflow, _delete_run_history, _truncate_run_history

-- Every rule of a runs row, and of a change of its status, in one BEFORE ROW trigger.
--
-- A trigger, not a CHECK constraint or a WHEN clause: for every statement that writes runs,
-- PostgreSQL reads a constraint's or a WHEN clause's stored expression again from its text and
-- prepares it, while a trigger without a WHEN clause is looked up once per statement and its
-- plans stay cached in the session. One call per row checks everything: the status change
-- first (an UPDATE that changes status, against _transition_pairs(), a constant once
-- planned), then the run_id (on INSERT, or an UPDATE that changes it), then the row's rules.
--
-- One CASE expression names the first broken rule (null when none is): PL/pgSQL evaluates
-- it once per row. A broken rule fails with SQLSTATE 23514 and the rule's name as the
-- constraint (runs_transition, runs_run_id_check, runs_terminal_has_record, ...).
-- A trigger, unlike a constraint, does not fire under session_replication_role = replica
-- (a logical replica applying rows its origin already checked) and can be disabled by the
-- table's owner; docs/state-machine.md says so.
create function runledger._check_run() returns trigger
language plpgsql as $$
declare
  v_rule text;
begin
  v_rule := case
    when tg_op = 'UPDATE' and old.status is distinct from new.status
         and (old.status::text || '>' || new.status::text) <> all (runledger._transition_pairs()) then 'runs_transition'
    -- An unbounded class plus length(), not {0,199}: a bounded repetition expands into a
    -- large automaton, costly for every inserted row. A run_id never changes: an
    -- UPDATE is checked only if it changes one.
    when (tg_op = 'INSERT' or new.run_id is distinct from old.run_id)
         and (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(new.run_id) > 200) then 'runs_run_id_check'
    when (new.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
         <> (new.finished_at is not null and new.termination_reason is not null) then 'runs_terminal_has_record'
    when new.termination_reason <> all (runledger.termination_reasons()) then 'runs_termination_reason_check'
    when (new.lease_owner is not null) <> (new.lease_expires_at is not null)
         or (new.status not in ('RUNNING', 'CANCELLING') and new.lease_owner is not null)
         or (new.status = 'RUNNING' and new.lease_owner is null) then 'runs_lease_only_when_executing'
    when new.wait_kind <> all (runledger.wait_kinds()) then 'runs_wait_kind_check'
    when (new.status = 'WAITING') <> (new.wait_kind is not null) then 'runs_wait_kind_only_when_waiting'
    when new.budget < 0 then 'runs_budget_check'
    when new.max_steps <= 0 then 'runs_max_steps_check'
    when new.no_progress < 2 then 'runs_no_progress_check'
    when new.retry_budget < 0 then 'runs_retry_budget_check'
    when new.max_recovery_attempts < 0 then 'runs_max_recovery_attempts_check'
  end;
  if v_rule is null then
    return new;
  elsif v_rule = 'runs_transition' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run %s: %s -> %s is not a transition of the run state machine (runledger.run_transitions())',
                       old.run_id, old.status, new.status);
  elsif v_rule = 'runs_run_id_check' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run_id %L is invalid: 1 to 200 letters, digits and _.:- starting with a letter or digit', new.run_id);
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
    message = format('new row for relation "runs" violates check constraint "%s" (status %s)', v_rule, new.status);
end;
$$;
comment on function runledger._check_run() is
  'Trigger function of runs_invariants: every rule a runs row obeys; a broken one raises 23514 naming it: runs_transition (a status change that runledger.run_transitions() does not list), runs_run_id_check (1 to 200 characters of [A-Za-z0-9_.:-] starting with a letter or digit), runs_terminal_has_record (a terminal status, and only one, has finished_at and termination_reason), runs_termination_reason_check, runs_lease_only_when_executing (only RUNNING or CANCELLING runs hold a lease; a RUNNING one always does), runs_wait_kind_check, runs_wait_kind_only_when_waiting, and the ranges of budget, max_steps, no_progress, retry_budget and max_recovery_attempts.';

-- The same for steps, written once per checkpoint.
create function runledger._check_step(p_seq int, p_kind text, p_status text) returns boolean
language plpgsql immutable as $$
declare
  v_rule text;
begin
  if p_seq < 0 then
    v_rule := 'steps_seq_check';
  elsif p_kind <> all (runledger.step_kinds()) then
    v_rule := 'steps_kind_check';
  elsif p_status not in ('SUCCEEDED', 'FAILED', 'WAITING') then
    v_rule := 'steps_status_check';
  else
    return true;
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'steps', schema = 'runledger',
    message = format('new row for relation "steps" violates check constraint "%s" (kind %s, status %s)', v_rule, p_kind, p_status);
end;
$$;
comment on function runledger._check_step(int, text, text) is
  'The invariants of a steps row, checked by its constraint steps_invariants; a broken one raises 23514 naming the rule: steps_seq_check (seq >= 0), steps_kind_check, steps_status_check (SUCCEEDED, FAILED or WAITING).';

create table runledger.workflows (
  workflow_name         text collate "C" not null check (workflow_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$'),
  workflow_version      text collate "C" not null check (workflow_version ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$'),
  queue_name            text collate "C" not null check (queue_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'),
  max_recovery_attempts int  not null check (max_recovery_attempts >= 0),
  -- Default limits of runs started from SQL: {"deadline": "2 days", "max_steps": 500, "budget": 1000, "no_progress": 3}.
  limits                jsonb not null default '{}',
  -- The version manifest runs of this version start with (runtime, checkpoint schema, the workflow's own).
  manifest              jsonb,
  registered_at         timestamptz not null default runledger.now(),
  primary key (workflow_name, workflow_version)
);
comment on table runledger.workflows is
  'Workflow (name, version) pairs registered by engines and workers. start_run uses it to resolve the default version, queue and recovery limit of a run started from SQL.';

-- The value rules of a run (wait_kind, termination_reason, the ranges of the limits) and
-- the rules between its columns are all in _check_run, under the names they are reported by.
create table runledger.runs (
  run_id                text collate "C" primary key,
  workflow_name         text collate "C" not null,
  workflow_version      text collate "C" not null,
  queue_name            text collate "C" not null,
  status                runledger.run_status not null default 'PENDING',
  input                 jsonb,
  output                jsonb,
  error                 jsonb,
  priority              int not null default 0,
  concurrency_key       text collate "C",
  idempotency_key       text collate "C",
  -- Whose run this is (0014_security.sql): set at start, inherited by child runs and forks.
  tenant_id             text collate "C",
  parent_run_id         text collate "C" references runledger.runs (run_id) on delete set null,
  created_at            timestamptz not null default runledger.now(),
  updated_at            timestamptz not null default runledger.now(),
  started_at            timestamptz,
  finished_at           timestamptz,
  deadline_at           timestamptz,
  wake_at               timestamptz,
  wait_kind             text collate "C",
  wait_key              text collate "C",
  lease_owner           text collate "C",
  lease_expires_at      timestamptz,
  fencing_token         bigint not null default 0,
  recovery_attempts     int not null default 0,
  max_recovery_attempts int not null default 10,
  version_manifest      jsonb not null default '{}',
  -- Set by migrate_run: the version this run moves to once a live worker applies the migration.
  migrate_to            text collate "C",
  -- Termination policies (limits), fixed at start: see sql/0008_termination.sql.
  max_steps             int,
  budget                numeric,
  budget_spent          numeric not null default 0,
  -- Budgets in the other dimensions (tokens, cost_usd, tool_calls, turns) and what was spent in them.
  budget_limits         jsonb,
  budget_used           jsonb,
  no_progress           int,
  cancel_requested_at   timestamptz,
  -- Admission (sql/0009_queues.sql): a PENDING run is claimed only once its queue admits it.
  admitted              boolean not null default false,
  admitted_at           timestamptz,
  not_before            timestamptz,
  retry_budget          int,
  retries_used          int not null default 0,
  cancel_reason         text collate "C",
  termination_reason    text collate "C",
  termination_evidence  jsonb,
  terminated_at         timestamptz,
  policy_version        text collate "C",
  -- A CANCELLING run that stops for another reason once its compensations have run.
  stop_record           jsonb,
  -- The trace context of the start (W3C traceparent) and of the execution that claimed it last.
  traceparent           text collate "C",
  execution_traceparent text collate "C",
  -- True once the run holds or queues for a session: only such runs fire runs_session_release.
  in_sessions           boolean,
  -- The run a chain of forks started from (null for a run never forked): ctx.lineageId.
  lineage_id            text collate "C"
);
comment on table runledger.runs is
  'One row per workflow run: status, lease (owner, expiry, fencing token), recovery attempts and the termination record (reason, evidence, time, policy version).';
comment on column runledger.runs.fencing_token is
  'Incremented on every claim. Every checkpoint write checks it in the same transaction, so a worker that lost its lease cannot commit.';
comment on column runledger.runs.recovery_attempts is
  'How many times the run was recovered after its lease expired (its worker died or stalled). Past max_recovery_attempts the run is dead-lettered.';
comment on column runledger.runs.wait_key is
  'What a WAITING run waits for: the signal topic, the approval request id or the child run id (null for timers).';
comment on column runledger.runs.budget is
  'Budget in units charged by steps (ctx.charge: tokens, money...); budget_spent past it ends the run TERMINATED with reason BUDGET, atomically with the checkpoint that spent it.';
comment on column runledger.runs.budget_limits is
  'Budgets besides units, as {"tokens": n, "cost_usd": n, "tool_calls": n, "turns": n} (limits.budget given as an object); budget_used holds what was spent per dimension. Spending past any of them ends the run TERMINATED (BUDGET) with that dimension in the evidence, atomically with the write that spent it.';
comment on column runledger.runs.no_progress is
  'N: the same step name returning the same result (hash) N times in a row ends the run TERMINATED with reason NO_PROGRESS.';
comment on column runledger.runs.stop_record is
  'Only on a CANCELLING run: the terminal record it ends with once its compensations have run, {status, reason, evidence, error} (a policy stop such as DEADLINE or BUDGET, or the record compensate_run set aside); null for a plain cancel, which ends CANCELLED.';
comment on column runledger.runs.migrate_to is
  'Set by migrate_run: the version of its workflow this run is to continue on. A live worker with a migration for the pair applies it (runledger._apply_migration) and clears it; a failed migration clears it and leaves the run as it was (events migrated, migration_failed).';
comment on column runledger.runs.termination_reason is
  'Why a terminal run stopped: COMPLETED, FAILED, CANCELLED, DEADLINE, MAX_STEPS, BUDGET, NO_PROGRESS, MAX_RECOVERY_ATTEMPTS, NON_DETERMINISM, UNVERIFIED (the workflow''s verify refused its output).';
comment on column runledger.runs.traceparent is
  'The W3C traceparent (00-<trace id>-<span id>-<flags>) of the context the run was started in (engine.start, or the traceparent option of start_run / start_runs); null when it was started outside a trace. Every execution of the run opens its span under it, so all of them, after crashes and on other workers, belong to one trace.';
comment on column runledger.runs.execution_traceparent is
  'The W3C traceparent of the span of the run''s latest execution, written by the worker that claimed it (runledger._trace_execution) when it records traces: the next execution links its span to it. Null when no execution was traced.';
comment on column runledger.runs.in_sessions is
  'True once the run has held a session or queued for one (set by triggers on sessions and session_waiters); null otherwise. When such a run ends, runs_session_release lets go of its sessions and its places in their queues.';
comment on column runledger.runs.lineage_id is
  'The run a chain of forks started from: fork_run sets it to its source''s lineage_id, or to the source''s run_id when the source was never forked. Null for a run that was never forked (its lineage is itself). ctx.lineageId is this, or run_id when null: an idempotency key made from it is the same in every fork of the run (and in its retries, which keep the run id).';

create unique index runs_idempotency_key on runledger.runs (workflow_name, idempotency_key)
  where idempotency_key is not null;

-- Listing finished runs by status, newest first (operators, prune). Only finished ones:
-- an index over every status would also match the hot path's lookups of RUNNING or
-- PENDING runs, and a plan cached while the table was empty takes it over the primary
-- key or the intended partial index (sql/README.md, "Plans").
create index runs_finished on runledger.runs (status, created_at)
  where status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER');

create index runs_parent on runledger.runs (parent_run_id) where parent_run_id is not null;

create table runledger.steps (
  -- No foreign key: the triggers runs_delete_history and runs_truncate_history delete a run's steps with it.
  run_id        text collate "C" not null,
  seq           int  not null,
  name          text collate "C" not null,
  kind          text collate "C" not null,
  -- WAITING: a durable wait began at this position (its wake time is in output); it
  -- becomes SUCCEEDED with the wait's result when the wait ends.
  status        text collate "C" not null,
  output        jsonb,
  error         jsonb,
  attempts      int not null default 1,
  started_at    timestamptz not null,
  finished_at   timestamptz not null default runledger.now(),
  fencing_token bigint not null,
  -- md5 of output, kept only for runs with a no_progress limit.
  output_hash   text collate "C",
  primary key (run_id, seq),
  constraint steps_invariants check (runledger._check_step(seq, kind, status))
);
comment on table runledger.steps is
  'Checkpoints: one row per completed step of a run, at its position seq. A step whose row exists is never executed again; replay returns output (or rethrows error).';
comment on constraint steps_invariants on runledger.steps is
  'Every rule a steps row obeys, in runledger._check_step (see its comment); a broken rule is reported under its own name.';

create table runledger.events (
  event_id      bigint generated always as identity,
  -- No foreign key: the triggers runs_delete_history and runs_truncate_history delete a run's events with it.
  run_id        text collate "C" not null,
  at            timestamptz not null default runledger.now(),
  kind          text collate "C" not null,
  detail        jsonb,
  fencing_token bigint,
  primary key (run_id, event_id)
);
comment on table runledger.events is
  'Append-only history of each run (created, claimed, lease_expired, recovered, completed, failed, dead_lettered, retried, released, ...), written in the same transaction as the change it records.';
comment on constraint events_pkey on runledger.events is
  'The key of an event is its run and its place in that run''s history (event_id, an identity, increases with time): a run''s history is read, deleted and pruned by run.';

create function runledger._register_workflow(p_name text, p_version text, p_queue text, p_max_recovery_attempts int, p_limits jsonb default '{}',
  p_manifest jsonb default null)
returns void language sql volatile as $$
  insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts, limits, manifest)
  values (p_name, p_version, p_queue, p_max_recovery_attempts, coalesce(p_limits, '{}'), p_manifest)
  on conflict (workflow_name, workflow_version) do update
     set queue_name = excluded.queue_name, max_recovery_attempts = excluded.max_recovery_attempts,
         limits = excluded.limits, manifest = coalesce(excluded.manifest, runledger.workflows.manifest),
         registered_at = runledger.now()
$$;
comment on function runledger._register_workflow(text, text, text, int, jsonb, jsonb) is
  'Records a workflow (name, version) with its default queue, recovery limit, limits (deadline, max_steps, budget, no_progress) and version manifest, so start_run from SQL can resolve them (a run started from SQL records that manifest).';

create function runledger._delete_run_history() returns trigger
language plpgsql
set enable_seqscan = off as $$
begin
  -- By each table's key (run_id first), whatever the transition table's size: the planner
  -- has no statistics for it, and a plan that reads all of events or steps would cost a
  -- deleted run a table scan.
  delete from runledger.steps s where s.run_id = any (array(select g.run_id from gone g));
  delete from runledger.events e where e.run_id = any (array(select g.run_id from gone g));
  return null;
end;
$$;
comment on function runledger._delete_run_history() is
  'Trigger function of runs_delete_history: deletes the checkpoints (steps) and events of the runs a statement deleted (steps.run_id and events.run_id have no foreign key; this is their ON DELETE CASCADE).';

create trigger runs_delete_history after delete on runledger.runs
  referencing old table as gone
  for each statement execute function runledger._delete_run_history();
comment on trigger runs_delete_history on runledger.runs is
  'Deleting runs deletes their checkpoints and events in the same statement (no foreign key, see runledger._delete_run_history).';

create function runledger._truncate_run_history() returns trigger
language plpgsql as $$
begin
  truncate runledger.steps, runledger.events;
  return null;
end;
$$;
comment on function runledger._truncate_run_history() is
  'Trigger function of runs_truncate_history: TRUNCATE of runs empties steps and events (there is no foreign key to cascade through).';

create trigger runs_truncate_history after truncate on runledger.runs
  for each statement execute function runledger._truncate_run_history();
comment on trigger runs_truncate_history on runledger.runs is
  'TRUNCATE of runs empties steps and events too (no foreign key, see runledger._truncate_run_history).';

create trigger runs_invariants before insert or update on runledger.runs
  for each row execute function runledger._check_run();
comment on trigger runs_invariants on runledger.runs is
  'Every rule a runs row and a change of its status obey, in runledger._check_run (see its comment); a broken rule is reported under its own name (SQLSTATE 23514).';

insert into runledger.migrations (version, name) values (2, '0002_runs');
