-- 0022_workflow_world: the Workflow SDK's World on runledger (runledger/workflow-world). A
-- Workflow SDK run is an event log (wf_events) and the entities the log materializes: the run
-- (wf_runs), its steps, hooks and waits, and its streams' chunks. The World writes each event
-- and its entity change in one transaction under the run's row lock, so that the log and the
-- entities never disagree and two writers of one run take turns. The SDK's queue messages are
-- runs of the runledger workflow 'workflow-world' (one run per message, input { runId, ... }):
-- runledger's queues, leases and recovery deliver them, and the view workflow_world_runs puts
-- each SDK run beside the runledger runs that delivered its messages.
--
-- tables: wf_runs, wf_events, wf_steps, wf_hooks, wf_waits, wf_stream_chunks
-- views: workflow_world_runs
-- indexes: runs_workflow_world (the deliveries of an SDK run), runs_workflow_world_key (by idempotency key)

-- Payload columns (input, output, error, event_data, metadata ...) are json, not jsonb: the
-- World writes the SDK's values as JSON with binary data as { "__type": "Uint8Array", "data":
-- base64 } and dates as { "__type": "Date", "value": ISO }, and json keeps a \u0000 escape
-- that jsonb refuses.
create table runledger.wf_runs (
  run_id            text collate "C" primary key,
  deployment_id     text collate "C" not null,
  workflow_name     text collate "C" not null,
  status            text collate "C" not null default 'pending'
                    check (status in ('pending', 'running', 'completed', 'failed', 'cancelled')),
  spec_version      int,
  input             json,
  output            json,
  error             json,
  error_code        text collate "C",
  execution_context json,
  attributes        jsonb not null default '{}',
  -- Fields of the run_created event the table has no column for, kept as the SDK sent them.
  extra             json,
  created_at        timestamptz not null default runledger.now(),
  updated_at        timestamptz not null default runledger.now(),
  started_at        timestamptz,
  completed_at      timestamptz,
  expired_at        timestamptz
);
create index wf_runs_name on runledger.wf_runs (workflow_name, run_id);
create index wf_runs_status on runledger.wf_runs (status, run_id);
comment on table runledger.wf_runs is
  'Workflow SDK runs (runledger/workflow-world): one row per run, materialized from its events in wf_events (status pending, running, completed, failed or cancelled; input, output and error as the SDK serialized them).';

create table runledger.wf_events (
  event_id       text collate "C" primary key,
  run_id         text collate "C" not null,
  event_type     text collate "C" not null,
  correlation_id text collate "C",
  event_data     json,
  spec_version   int,
  created_at     timestamptz not null default runledger.now()
);
create index wf_events_run on runledger.wf_events (run_id, event_id);
create index wf_events_correlation on runledger.wf_events (correlation_id, event_id);
-- A replayed or concurrent invocation that creates the same step, hook, wait or attribute
-- write again is refused here (the World answers EntityConflictError, the SDK's dedup signal).
create unique index wf_events_entity_creation on runledger.wf_events (run_id, correlation_id, event_type)
  where event_type in ('step_created', 'hook_created', 'wait_created', 'attr_set');
comment on table runledger.wf_events is
  'The event log of each Workflow SDK run (runledger/workflow-world), in event_id order (ULIDs): run_created ... run_completed, step_*, hook_*, wait_*, attr_set. The SDK replays a run from it.';

create table runledger.wf_steps (
  run_id       text collate "C" not null,
  step_id      text collate "C" not null,
  step_name    text collate "C" not null,
  status       text collate "C" not null default 'pending'
               check (status in ('pending', 'running', 'completed', 'failed', 'cancelled')),
  input        json,
  output       json,
  error        json,
  attempt      int not null default 0,
  started_at   timestamptz,
  completed_at timestamptz,
  retry_after  timestamptz,
  spec_version int,
  created_at   timestamptz not null default runledger.now(),
  updated_at   timestamptz not null default runledger.now(),
  primary key (run_id, step_id)
);
comment on table runledger.wf_steps is
  'The steps of Workflow SDK runs (runledger/workflow-world): status, attempts, input, output or error, and when a retry may start (retry_after).';

create table runledger.wf_hooks (
  hook_id      text collate "C" primary key,
  run_id       text collate "C" not null,
  -- A token names one live hook at a time; it is free again once the hook is disposed or its run ends.
  token        text collate "C" not null unique,
  metadata     json,
  is_webhook   boolean not null default true,
  is_system    boolean not null default false,
  spec_version int,
  created_at   timestamptz not null default runledger.now()
);
create index wf_hooks_run on runledger.wf_hooks (run_id, hook_id);
comment on table runledger.wf_hooks is
  'The live hooks of Workflow SDK runs (runledger/workflow-world): a hook waits for payloads sent to its token (resumeHook); it is deleted when disposed or when its run ends.';

create table runledger.wf_waits (
  run_id         text collate "C" not null,
  correlation_id text collate "C" not null,
  status         text collate "C" not null default 'waiting' check (status in ('waiting', 'completed')),
  resume_at      timestamptz,
  completed_at   timestamptz,
  spec_version   int,
  created_at     timestamptz not null default runledger.now(),
  updated_at     timestamptz not null default runledger.now(),
  primary key (run_id, correlation_id)
);
comment on table runledger.wf_waits is
  'The sleeps of Workflow SDK runs (runledger/workflow-world): waiting until resume_at, then completed.';

create table runledger.wf_stream_chunks (
  seq         bigint generated always as identity primary key,
  stream_name text collate "C" not null,
  run_id      text collate "C",
  data        bytea not null,
  -- The closing row of a stream: no data, written once by close().
  eof         boolean not null default false,
  created_at  timestamptz not null default runledger.now()
);
create index wf_stream_chunks_stream on runledger.wf_stream_chunks (stream_name, seq);
create index wf_stream_chunks_run on runledger.wf_stream_chunks (run_id, stream_name);
comment on table runledger.wf_stream_chunks is
  'The chunks of Workflow SDK streams (runledger/workflow-world), in seq order per stream; a row with eof closes the stream. A reader tails it on NOTIFY runledger_wf_stream.';

-- The deliveries of one SDK run: the runledger runs of the workflow 'workflow-world' whose
-- input names it.
create index runs_workflow_world on runledger.runs ((input ->> 'runId'), created_at)
  where workflow_name = 'workflow-world';
-- A message's idempotency key is taken while a delivery with it lives: the World's queue()
-- looks it up among the deliveries, history included.
create index runs_workflow_world_key on runledger.runs ((input ->> 'idempotencyKey'))
  where workflow_name = 'workflow-world' and input ->> 'idempotencyKey' is not null;

create view runledger.workflow_world_runs as
select w.run_id,
       w.workflow_name,
       w.status,
       w.deployment_id,
       w.created_at,
       w.started_at,
       w.completed_at,
       w.error_code,
       w.attributes,
       (select count(*)::int from runledger.wf_steps s where s.run_id = w.run_id) as steps,
       (select count(*)::int from runledger.wf_hooks h where h.run_id = w.run_id) as live_hooks,
       (select count(*)::int from runledger.wf_waits t where t.run_id = w.run_id and t.status = 'waiting') as waiting_sleeps,
       d.deliveries,
       d.deliveries_active,
       d.deliveries_failed,
       d.last_delivery_run_id
  from runledger.wf_runs w
  left join lateral (
    select count(*)::int as deliveries,
           (count(*) filter (where r.status in ('PENDING', 'RUNNING', 'WAITING')))::int as deliveries_active,
           (count(*) filter (where r.status in ('FAILED', 'DEAD_LETTER')))::int as deliveries_failed,
           (array_agg(r.run_id order by r.created_at desc))[1] as last_delivery_run_id
      from runledger.runs r
     where r.workflow_name = 'workflow-world' and r.input ->> 'runId' = w.run_id
  ) d on true;
comment on view runledger.workflow_world_runs is
  'One row per Workflow SDK run (runledger/workflow-world): its status and workflow, its steps, live hooks and pending sleeps, and the runledger runs that delivered its queue messages (how many, still active, failed or dead-lettered, the latest one''s run_id for runledger.runs and the console).';

-- The roles read the new tables (worker, operator) and view (all three) once grant_roles() runs
-- again: here, where the migrating role may; elsewhere a DBA runs it, as after 0014.
do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: the Workflow SDK tables are not granted yet (% may not grant roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (22, '0022_workflow_world');
