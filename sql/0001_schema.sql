-- 0001_schema: the runledger schema, its run state machine, the rules every row obeys,
-- and the tables that hold every durable fact about a run.
--
--   runledger.migrations       which of these files are applied, and the checksum of each
--   runledger.run_status       the run state machine (kept equal to RUN_STATES in TS)
--   runledger.now()            the one clock; honours `set runledger.fake_now` and `runledger.clock_offset`
--   runledger._caller()        the role the caller acts as, also inside SECURITY DEFINER functions
--   runledger.is_terminal()    the statuses a run never leaves on its own
--   runledger.run_transitions()      every status change a run may make, and who makes it
--   runledger.termination_reasons()  why a terminal run stopped
--   runledger.step_kinds()           what a checkpoint records
--   runledger.wait_kinds()           what a WAITING run waits for
--   runledger._check_transition()    trigger function: refuses a status change not in run_transitions()
--   runledger._check_run()     the invariants of a runs row (constraint runs_invariants)
--   runledger._check_step()    the invariants of a steps row (constraint steps_invariants)
--   runledger._check_run_id()  trigger function: a run_id is checked where one is written
--   runledger.workflows        (name, version) pairs known to the engine
--   runledger.runs             one row per run: status, lease, fencing token, termination record
--   runledger.steps            one checkpoint per completed step, PK (run_id, seq)
--   runledger.events           append-only history of each run
--   runledger.workers          live and past worker processes
--
-- Functions called on every run transition are PL/pgSQL, not LANGUAGE sql: PostgreSQL
-- plans a LANGUAGE sql function it cannot inline again on every call in a new
-- transaction, while PL/pgSQL caches its plans for the session (profiles of a worker
-- draining one-step runs spent about a quarter of the server's time in such re-planning).
--
-- Runnable as `psql -v ON_ERROR_STOP=1 -1 -f sql/0001_schema.sql`.

create schema if not exists runledger;
comment on schema runledger is
  'runledger: durable queue-and-workflow engine. Read the tables and views; change state through the functions (\df runledger.*).';

create table runledger.migrations (
  version    int primary key,
  name       text not null,
  breaking   boolean not null default false,
  applied_at timestamptz not null default now(),
  checksum   text
);
comment on table runledger.migrations is
  'Applied runledger migrations (files sql/NNNN_*.sql). A breaking migration newer than the code makes older code refuse to start.';
comment on column runledger.migrations.checksum is
  'sha256 (hex) of the file''s text as applied, recorded by migrate(); migrate() refuses a database whose applied files differ from its own (null: applied with psql, taken as the running build''s).';

create type runledger.run_status as enum (
  'PENDING', 'RUNNING', 'WAITING', 'CANCELLING',
  'SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'
);
comment on type runledger.run_status is
  'Run state machine. Terminal: SUCCEEDED, FAILED, CANCELLED, TERMINATED, DEAD_LETTER. See docs/state-machine.md.';

-- The database clock is the only clock: every time runledger compares (a step's start
-- with a cancel, deadlines, delayed starts, leases, timers) is read from it, and a worker
-- tells the database durations ("started 120 ms ago"), never its own wall-clock time.
-- Tests move it with `set runledger.fake_now = '2030-01-01T00:00:00Z'` (a frozen
-- instant) instead of sleeping, or make it run ahead of (or behind) the real clock with
-- `set runledger.clock_offset = '5 minutes'` (an interval; '-5 minutes' is behind).
create function runledger.now() returns timestamptz
language sql volatile parallel safe as $$
  select coalesce(nullif(current_setting('runledger.fake_now', true), '')::timestamptz,
                  clock_timestamp() + coalesce(nullif(current_setting('runledger.clock_offset', true), '')::interval, interval '0'))
$$;
comment on function runledger.now() is
  'Current time for every runledger function: the setting runledger.fake_now when set (tests: a frozen instant), else clock_timestamp() moved by the setting runledger.clock_offset (tests: an interval, a clock running ahead or behind).';

create function runledger._caller() returns text
language sql stable parallel safe as $$
  -- The role the caller acts as. current_user is the function's owner inside a SECURITY
  -- DEFINER function (every public action is one, 0017_roles.sql); the setting `role`
  -- keeps what SET ROLE chose, and is 'none' when the login acts as itself.
  select case when current_setting('role') = 'none' then session_user::text else current_setting('role') end
$$;
comment on function runledger._caller() is
  'The role the calling session acts as (SET ROLE''s role, else the login), also inside SECURITY DEFINER functions where current_user is the owner. Recorded as db_role in audit_log, approvals and approval_votes, and checked against role approvers.';

create function runledger.is_terminal(p_status runledger.run_status) returns boolean
language sql immutable parallel safe as $$
  select p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
$$;
comment on function runledger.is_terminal(runledger.run_status) is
  'True for the statuses a run never leaves on its own (retry_run, compensate_run and fork_run are explicit operator actions).';

-- The contract lists, defined once for SQL (src/engine/core/states.ts defines them once for
-- TypeScript; test/contracts.test.ts checks that the two agree). Immutable LANGUAGE sql
-- functions of a constant: the planner folds them where the invariants below use them.
create function runledger.run_transitions()
returns table (from_status runledger.run_status, to_status runledger.run_status, by_whom text)
language sql immutable as $$
  values
    ('PENDING'::runledger.run_status, 'RUNNING'::runledger.run_status, 'a claim (_claim_batch, fencing_token + 1), once admitted'),
    ('PENDING', 'CANCELLED', 'cancel_run'),
    ('PENDING', 'CANCELLING', 'cancel_run, or a deadline, with compensations to run'),
    ('PENDING', 'TERMINATED', 'deadline (_enforce_deadlines, or at claim)'),
    ('RUNNING', 'SUCCEEDED', 'the workflow returned (_complete_run)'),
    ('RUNNING', 'FAILED', 'the workflow threw, or its input is invalid (_fail_run)'),
    ('RUNNING', 'TERMINATED', 'deadline, max steps (_terminate_run); budget, no progress (in a checkpoint)'),
    ('RUNNING', 'DEAD_LETTER', 'NON_DETERMINISM, or past max_recovery_attempts'),
    ('RUNNING', 'PENDING', 'lease expired (+1 recovery attempt), or released'),
    ('RUNNING', 'WAITING', 'sleep, signal, approval, child, durable retry backoff, unknown operation'),
    ('RUNNING', 'CANCELLING', 'cancel_run; a policy stop with compensations to run (_terminate_run)'),
    ('WAITING', 'PENDING', 'timer, signal, decision, child ended, resolve_operation (_wake)'),
    ('WAITING', 'RUNNING', 'a claim of a due timer (_claim_batch, queue without limits)'),
    ('WAITING', 'CANCELLED', 'cancel_run'),
    ('WAITING', 'CANCELLING', 'cancel_run, or a deadline, with compensations to run'),
    ('WAITING', 'TERMINATED', 'deadline (_enforce_deadlines, or at claim)'),
    ('CANCELLING', 'CANCELLED', 'the owner (_finish_cancel), or recovery if it died'),
    ('CANCELLING', 'SUCCEEDED', 'the cancel lost the race with the last step (_finish_run)'),
    ('CANCELLING', 'FAILED', 'the cancel lost the race with a failure (_finish_run)'),
    ('CANCELLING', 'TERMINATED', 'the cancel lost the race with a policy stop (_finish_run)'),
    ('CANCELLING', 'DEAD_LETTER', 'the cancel lost the race with a dead-letter (_finish_run)'),
    ('FAILED', 'PENDING', 'retry_run'),
    ('DEAD_LETTER', 'PENDING', 'retry_run'),
    ('FAILED', 'CANCELLING', 'compensate_run'),
    ('CANCELLED', 'CANCELLING', 'compensate_run'),
    ('TERMINATED', 'CANCELLING', 'compensate_run'),
    ('DEAD_LETTER', 'CANCELLING', 'compensate_run')
$$;
comment on function runledger.run_transitions() is
  'The run state machine: every status change a run may make, and who makes it. The trigger runs_transition refuses any other (docs/state-machine.md draws the same list).';

create function runledger.termination_reasons() returns text[]
language sql immutable as $$
  select array['COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET', 'NO_PROGRESS',
               'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM', 'UNVERIFIED']
$$;
comment on function runledger.termination_reasons() is
  'Why a terminal run stopped (runs.termination_reason); see docs/termination.md for the evidence of each.';

create function runledger.step_kinds() returns text[]
language sql immutable as $$
  select array['step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child']
$$;
comment on function runledger.step_kinds() is
  'What a checkpoint records (steps.kind): one per ctx call that takes a step position.';

create function runledger.wait_kinds() returns text[]
language sql immutable as $$
  select array['timer', 'signal', 'approval', 'child', 'retry', 'reconcile']
$$;
comment on function runledger.wait_kinds() is
  'What a WAITING run waits for (runs.wait_kind); see docs/state-machine.md.';

-- PostgreSQL parses and prepares every CHECK constraint of a table again for each
-- statement that writes it (from its stored node tree): with ten constraints on runs,
-- with long lists of names, a profile of a draining worker put a fifth of the server's
-- time there. So the rules of a row sit in one PL/pgSQL function called by one
-- constraint: a small node tree to prepare, and a cached function to run. A row that
-- breaks a rule fails with SQLSTATE 23514 and the name of the rule it broke.
create function runledger._check_run(
  p_status runledger.run_status, p_finished_at timestamptz, p_termination_reason text,
  p_lease_owner text, p_lease_expires_at timestamptz, p_wait_kind text,
  p_budget numeric, p_max_steps int, p_no_progress int, p_retry_budget int, p_max_recovery_attempts int)
returns boolean
language plpgsql immutable as $$
declare
  v_rule text;
begin
  if (p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
     <> (p_finished_at is not null and p_termination_reason is not null) then
    v_rule := 'runs_terminal_has_record';
  elsif p_termination_reason <> all (runledger.termination_reasons()) then
    v_rule := 'runs_termination_reason_check';
  elsif (p_lease_owner is not null) <> (p_lease_expires_at is not null)
     or (p_status not in ('RUNNING', 'CANCELLING') and p_lease_owner is not null)
     or (p_status = 'RUNNING' and p_lease_owner is null) then
    v_rule := 'runs_lease_only_when_executing';
  elsif p_wait_kind <> all (runledger.wait_kinds()) then
    v_rule := 'runs_wait_kind_check';
  elsif (p_status = 'WAITING') <> (p_wait_kind is not null) then
    v_rule := 'runs_wait_kind_only_when_waiting';
  elsif p_budget < 0 then
    v_rule := 'runs_budget_check';
  elsif p_max_steps <= 0 then
    v_rule := 'runs_max_steps_check';
  elsif p_no_progress < 2 then
    v_rule := 'runs_no_progress_check';
  elsif p_retry_budget < 0 then
    v_rule := 'runs_retry_budget_check';
  elsif p_max_recovery_attempts < 0 then
    v_rule := 'runs_max_recovery_attempts_check';
  else
    return true;
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
    message = format('new row for relation "runs" violates check constraint "%s" (status %s)', v_rule, p_status);
end;
$$;
comment on function runledger._check_run(runledger.run_status, timestamptz, text, text, timestamptz, text, numeric, int, int, int, int) is
  'The invariants of a runs row, checked by its constraint runs_invariants; a broken one raises 23514 naming the rule: runs_terminal_has_record (a terminal status, and only one, has finished_at and termination_reason), runs_termination_reason_check, runs_lease_only_when_executing (only RUNNING or CANCELLING runs hold a lease; a RUNNING one always does), runs_wait_kind_check, runs_wait_kind_only_when_waiting, and the ranges of budget, max_steps, no_progress, retry_budget and max_recovery_attempts.';

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

-- A CHECK on runs.run_id would run its regular expression on every UPDATE of a run
-- (PostgreSQL evaluates every CHECK constraint on every update); an id never changes, so
-- it is checked where one is written: on insert, and on the rare update of the id itself.
create function runledger._check_run_id() returns trigger
language plpgsql as $$
begin
  raise exception using errcode = '23514',
    message = format('run_id %L is invalid: 1 to 200 letters, digits and _.:- starting with a letter or digit', new.run_id);
end;
$$;
comment on function runledger._check_run_id() is
  'Trigger function: rejects a run_id that is not 1 to 200 characters of [A-Za-z0-9_.:-] starting with a letter or digit.';

create table runledger.workflows (
  workflow_name         text not null check (workflow_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$'),
  workflow_version      text not null check (workflow_version ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$'),
  queue_name            text not null check (queue_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'),
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
  run_id                text primary key,
  workflow_name         text not null,
  workflow_version      text not null,
  queue_name            text not null,
  status                runledger.run_status not null default 'PENDING',
  input                 jsonb,
  output                jsonb,
  error                 jsonb,
  priority              int not null default 0,
  concurrency_key       text,
  idempotency_key       text,
  -- Whose run this is (0018_tenants.sql): set at start, inherited by child runs and forks.
  tenant_id             text,
  parent_run_id         text references runledger.runs (run_id) on delete set null,
  created_at            timestamptz not null default runledger.now(),
  updated_at            timestamptz not null default runledger.now(),
  started_at            timestamptz,
  finished_at           timestamptz,
  deadline_at           timestamptz,
  wake_at               timestamptz,
  wait_kind             text,
  wait_key              text,
  lease_owner           text,
  lease_expires_at      timestamptz,
  fencing_token         bigint not null default 0,
  recovery_attempts     int not null default 0,
  max_recovery_attempts int not null default 10,
  version_manifest      jsonb not null default '{}',
  -- Set by migrate_run: the version this run moves to once a live worker applies the migration.
  migrate_to            text,
  -- Termination policies (limits), fixed at start: see sql/0005_termination.sql.
  max_steps             int,
  budget                numeric,
  budget_spent          numeric not null default 0,
  -- Budgets in the other dimensions (tokens, cost_usd, tool_calls, turns) and what was spent in them.
  budget_limits         jsonb,
  budget_used           jsonb,
  no_progress           int,
  cancel_requested_at   timestamptz,
  -- Admission (sql/0007_queues.sql): a PENDING run is claimed only once its queue admits it.
  admitted              boolean not null default false,
  admitted_at           timestamptz,
  not_before            timestamptz,
  retry_budget          int,
  retries_used          int not null default 0,
  cancel_reason         text,
  termination_reason    text,
  termination_evidence  jsonb,
  terminated_at         timestamptz,
  policy_version        text,
  -- A CANCELLING run that stops for another reason once its compensations have run.
  stop_record           jsonb,
  constraint runs_invariants check (runledger._check_run(
    status, finished_at, termination_reason, lease_owner, lease_expires_at, wait_kind,
    budget, max_steps, no_progress, retry_budget, max_recovery_attempts))
);
comment on table runledger.runs is
  'One row per workflow run: status, lease (owner, expiry, fencing token), recovery attempts and the termination record (reason, evidence, time, policy version).';
comment on constraint runs_invariants on runledger.runs is
  'Every rule a runs row obeys, in runledger._check_run (see its comment); a broken rule is reported under its own name.';
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

-- The rule is written as an unbounded class plus length(), not as {0,199}: PostgreSQL's
-- regex engine expands a bounded repetition into a large automaton, and that form cost
-- about 19 us per inserted row (a bulk start of 20,000 runs spent 0.35 s in it), this one 0.4 us.
create trigger runs_run_id_insert before insert on runledger.runs
  for each row when (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(new.run_id) > 200) execute function runledger._check_run_id();
create trigger runs_run_id_update before update of run_id on runledger.runs
  for each row when (new.run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(new.run_id) > 200) execute function runledger._check_run_id();

-- The state machine is enforced, not only drawn: a status change that run_transitions()
-- does not list fails with 23514 naming runs_transition. Only status changes fire it.
create function runledger._check_transition() returns trigger
language plpgsql as $$
begin
  if not exists (select 1 from runledger.run_transitions() t where t.from_status = old.status and t.to_status = new.status) then
    raise exception using errcode = '23514', constraint = 'runs_transition', table = 'runs', schema = 'runledger',
      message = format('run %s: %s -> %s is not a transition of the run state machine (runledger.run_transitions())',
                       old.run_id, old.status, new.status);
  end if;
  return new;
end;
$$;
comment on function runledger._check_transition() is
  'Trigger function of runs_transition: refuses a status change that runledger.run_transitions() does not list (SQLSTATE 23514, constraint runs_transition).';
create trigger runs_transition before update of status on runledger.runs
  for each row when (old.status is distinct from new.status) execute function runledger._check_transition();

create unique index runs_idempotency_key on runledger.runs (workflow_name, idempotency_key)
  where idempotency_key is not null;
-- The sweeper looks only at leased runs ordered by lease expiry. The predicate names the
-- lease, not the statuses that hold one: the fenced writes look up one executing run by
-- `run_id = ... and status in ('RUNNING', 'CANCELLING')`, which would prove an index on
-- those statuses usable, and a generic plan cached while the table was empty took it over
-- the primary key (test/plans.test.ts caught it). `lease_expires_at < now` proves this one.
create index runs_lease_expiry on runledger.runs (lease_expires_at)
  where lease_expires_at is not null;
-- Listing finished runs by status, newest first (operators, prune). Only finished ones:
-- an index over every status would also match the hot path's lookups of RUNNING or
-- PENDING runs, and a plan cached while the table was empty takes it over the primary
-- key or the intended partial index (sql/README.md, "Plans").
create index runs_finished on runledger.runs (status, created_at)
  where status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER');
-- Admission picks from the runs not yet admitted, per queue, by priority then age.
create index runs_admission_key on runledger.runs (queue_name, coalesce(concurrency_key, ''), priority, created_at, run_id)
  where status = 'PENDING' and not admitted;
-- Admission counts what occupies a queue's slots.
create index runs_queue_active on runledger.runs (queue_name, concurrency_key)
  where status in ('RUNNING', 'CANCELLING') or (status = 'PENDING' and admitted);
-- Deadlines are enforced by a sweep over runs that hold no worker.
create index runs_deadline on runledger.runs (deadline_at) where status in ('PENDING', 'WAITING') and deadline_at is not null;
create index runs_parent on runledger.runs (parent_run_id) where parent_run_id is not null;

create table runledger.steps (
  run_id        text not null references runledger.runs (run_id) on delete cascade,
  seq           int  not null,
  name          text not null,
  kind          text not null,
  -- WAITING: a durable wait began at this position (its wake time is in output); it
  -- becomes SUCCEEDED with the wait's result when the wait ends.
  status        text not null,
  output        jsonb,
  error         jsonb,
  attempts      int not null default 1,
  started_at    timestamptz not null,
  finished_at   timestamptz not null default runledger.now(),
  fencing_token bigint not null,
  -- md5 of output, kept only for runs with a no_progress limit.
  output_hash   text,
  primary key (run_id, seq),
  constraint steps_invariants check (runledger._check_step(seq, kind, status))
);
comment on table runledger.steps is
  'Checkpoints: one row per completed step of a run, at its position seq. A step whose row exists is never executed again; replay returns output (or rethrows error).';
comment on constraint steps_invariants on runledger.steps is
  'Every rule a steps row obeys, in runledger._check_step (see its comment); a broken rule is reported under its own name.';

create table runledger.events (
  event_id      bigint generated always as identity primary key,
  run_id        text not null references runledger.runs (run_id) on delete cascade,
  at            timestamptz not null default runledger.now(),
  kind          text not null,
  detail        jsonb,
  fencing_token bigint
);
create index events_run on runledger.events (run_id, event_id);
comment on table runledger.events is
  'Append-only history of each run (created, claimed, lease_expired, recovered, completed, failed, dead_lettered, retried, released, ...), written in the same transaction as the change it records.';

create table runledger.workers (
  worker_id         text primary key,
  host              text not null,
  pid               int  not null,
  workflows         text[] not null,
  -- The run migrations it applies, as workflow@from>to.
  migrations        text[] not null default '{}',
  queues            text[] not null,
  concurrency       int not null,
  lease_ms          int not null,
  started_at        timestamptz not null default runledger.now(),
  last_heartbeat_at timestamptz not null default runledger.now(),
  stopped_at        timestamptz
);
comment on table runledger.workers is
  'Worker processes: what they serve (workflow@version, queues), the run migrations they apply (workflow@from>to), their lease length and last heartbeat. A worker silent for longer than its lease is considered dead.';

insert into runledger.migrations (version, name) values (1, '0001_schema');
