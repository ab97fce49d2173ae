-- 0001_schema: the runledger schema, its run state machine and the tables that
-- hold every durable fact about a run.
--
--   runledger.migrations  which of these files are applied
--   runledger.run_status  the run state machine (kept equal to RUN_STATES in TS)
--   runledger.now()       the one clock; honours `set runledger.fake_now`
--   runledger.workflows   (name, version) pairs known to the engine
--   runledger.runs        one row per run: status, lease, fencing token, termination record
--   runledger.steps       one checkpoint per completed step, PK (run_id, seq)
--   runledger.events      append-only history of each run
--   runledger.workers     live and past worker processes
--
-- Runnable as `psql -v ON_ERROR_STOP=1 -1 -f sql/0001_schema.sql`.

create schema if not exists runledger;
comment on schema runledger is
  'runledger: durable queue-and-workflow engine. Read the tables and views; change state through the functions (\df runledger.*).';

create table runledger.migrations (
  version    int primary key,
  name       text not null,
  breaking   boolean not null default false,
  applied_at timestamptz not null default now()
);
comment on table runledger.migrations is
  'Applied runledger migrations (files sql/NNNN_*.sql). A breaking migration newer than the code makes older code refuse to start.';

create type runledger.run_status as enum (
  'PENDING', 'RUNNING', 'WAITING', 'CANCELLING',
  'SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'
);
comment on type runledger.run_status is
  'Run state machine. Terminal: SUCCEEDED, FAILED, CANCELLED, TERMINATED, DEAD_LETTER. See docs/state-machine.md.';

-- The database clock is the only clock. Tests move it with
-- `set runledger.fake_now = '2030-01-01T00:00:00Z'` instead of sleeping.
create function runledger.now() returns timestamptz
language sql volatile parallel safe as $$
  select coalesce(nullif(current_setting('runledger.fake_now', true), '')::timestamptz, clock_timestamp())
$$;
comment on function runledger.now() is
  'Current time for every runledger function: the setting runledger.fake_now when set (tests), else clock_timestamp().';

create function runledger.is_terminal(p_status runledger.run_status) returns boolean
language sql immutable parallel safe as $$
  select p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
$$;
comment on function runledger.is_terminal(runledger.run_status) is
  'True for the statuses a run never leaves on its own (retry_run or fork_run are explicit operator actions).';

create table runledger.workflows (
  workflow_name         text not null check (workflow_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,49}$'),
  workflow_version      text not null check (workflow_version ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,19}$'),
  queue_name            text not null check (queue_name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'),
  max_recovery_attempts int  not null check (max_recovery_attempts >= 0),
  -- Default limits of runs started from SQL: {"deadline": "2 days", "max_steps": 500, "budget": 1000, "no_progress": 3}.
  limits                jsonb not null default '{}',
  registered_at         timestamptz not null default runledger.now(),
  primary key (workflow_name, workflow_version)
);
comment on table runledger.workflows is
  'Workflow (name, version) pairs registered by engines and workers. start_run uses it to resolve the default version, queue and recovery limit of a run started from SQL.';

create table runledger.runs (
  run_id                text primary key check (run_id ~ '^[A-Za-z0-9][A-Za-z0-9_.:-]{0,199}$'),
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
  parent_run_id         text references runledger.runs (run_id) on delete set null,
  created_at            timestamptz not null default runledger.now(),
  updated_at            timestamptz not null default runledger.now(),
  started_at            timestamptz,
  finished_at           timestamptz,
  deadline_at           timestamptz,
  wake_at               timestamptz,
  wait_kind             text check (wait_kind in ('timer', 'signal', 'approval', 'child', 'retry', 'reconcile')),
  wait_key              text,
  lease_owner           text,
  lease_expires_at      timestamptz,
  fencing_token         bigint not null default 0,
  recovery_attempts     int not null default 0,
  max_recovery_attempts int not null default 10 check (max_recovery_attempts >= 0),
  version_manifest      jsonb not null default '{}',
  -- Termination policies (limits), fixed at start: see sql/0006_termination.sql.
  max_steps             int check (max_steps > 0),
  budget                numeric check (budget >= 0),
  budget_spent          numeric not null default 0,
  no_progress           int check (no_progress >= 2),
  cancel_requested_at   timestamptz,
  -- Admission (sql/0008_queues.sql): a PENDING run is dispatched only once its queue admits it.
  admitted              boolean not null default false,
  admitted_at           timestamptz,
  not_before            timestamptz,
  retry_budget          int check (retry_budget >= 0),
  retries_used          int not null default 0,
  cancel_reason         text,
  termination_reason    text check (termination_reason in (
                          'COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET',
                          'NO_PROGRESS', 'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM')),
  termination_evidence  jsonb,
  terminated_at         timestamptz,
  policy_version        text,
  -- A terminal run has its termination record and finish time; a live one has neither.
  constraint runs_terminal_has_record check (
    runledger.is_terminal(status) = (finished_at is not null and termination_reason is not null)),
  -- Only an executing run has an owner; waiting and pending runs hold no worker.
  -- (A CANCELLING run may be without an owner while it waits for a worker to finish its compensations.)
  constraint runs_lease_only_when_executing check (
    (lease_owner is not null) = (lease_expires_at is not null)
    and (status in ('RUNNING', 'CANCELLING') or lease_owner is null)
    and (status <> 'RUNNING' or lease_owner is not null)),
  constraint runs_wait_kind_only_when_waiting check ((status = 'WAITING') = (wait_kind is not null))
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
comment on column runledger.runs.no_progress is
  'N: the same step name returning the same result (hash) N times in a row ends the run TERMINATED with reason NO_PROGRESS.';
comment on column runledger.runs.termination_reason is
  'Why a terminal run stopped: COMPLETED, FAILED, CANCELLED, DEADLINE, MAX_STEPS, BUDGET, NO_PROGRESS, MAX_RECOVERY_ATTEMPTS, NON_DETERMINISM.';

create unique index runs_idempotency_key on runledger.runs (workflow_name, idempotency_key)
  where idempotency_key is not null;
-- The sweeper looks only at executing runs ordered by lease expiry.
create index runs_lease_expiry on runledger.runs (lease_expires_at)
  where status in ('RUNNING', 'CANCELLING');
create index runs_status_created on runledger.runs (status, created_at);
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
  seq           int  not null check (seq >= 0),
  name          text not null,
  kind          text not null check (kind in ('step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child')),
  -- WAITING: a durable wait began at this position (its wake time is in output); it
  -- becomes SUCCEEDED with the wait's result when the wait ends.
  status        text not null check (status in ('SUCCEEDED', 'FAILED', 'WAITING')),
  output        jsonb,
  error         jsonb,
  attempts      int not null default 1,
  started_at    timestamptz not null,
  finished_at   timestamptz not null default runledger.now(),
  fencing_token bigint not null,
  -- md5 of output, kept only for runs with a no_progress limit.
  output_hash   text,
  primary key (run_id, seq)
);
comment on table runledger.steps is
  'Checkpoints: one row per completed step of a run, at its position seq. A step whose row exists is never executed again; replay returns output (or rethrows error).';

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
  queues            text[] not null,
  concurrency       int not null,
  lease_ms          int not null,
  started_at        timestamptz not null default runledger.now(),
  last_heartbeat_at timestamptz not null default runledger.now(),
  stopped_at        timestamptz
);
comment on table runledger.workers is
  'Worker processes: what they serve (workflow@version, queues), their lease length and last heartbeat. A worker silent for longer than its lease is considered dead.';

insert into runledger.migrations (version, name) values (1, '0001_schema');
