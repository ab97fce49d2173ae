-- 0020_environments: a run's execution environment (a workspace, a browser session, a
-- sandbox), described by a durable manifest. The workflow's environment.create makes it once
-- per run (a step, checkpointed); each attempt of that step records what it made here before
-- its checkpoint, so an environment made by an attempt that crashed is known too. When the run
-- finishes, whatever its status (cancelled and dead-lettered included), every environment of
-- the run is reclaimed: by its own worker at once, or by any worker serving the workflow that
-- finds it due (its own worker gone). A reclaim is leased, and the lease renewed while it runs,
-- so two live workers never reclaim the same environment at the same time; one that fails is
-- tried again later. A run brought back
-- by retry_run finishes again: its environments are reclaimed again then.
--
-- tables: environments
-- functions: _environment_record, _environments_due, _environment_renew, _environment_reclaimed

create table runledger.environments (
  env_id            text collate "C" primary key,
  run_id            text collate "C" not null references runledger.runs (run_id) on delete cascade,
  workflow_name     text collate "C" not null,
  workflow_version  text collate "C" not null,
  manifest          jsonb not null,
  -- The attempt of the create step that made it; the checkpointed one is the run's environment.
  seq               int not null,
  attempt           int not null,
  created_at        timestamptz not null default runledger.now(),
  -- A worker reclaiming it holds it until then.
  reclaim_owner     text collate "C",
  reclaim_until     timestamptz,
  reclaim_attempts  int not null default 0,
  reclaimed_at      timestamptz,
  -- The run's status the reclaim was for.
  reclaimed_status  text collate "C",
  last_error        jsonb
);
create index environments_run on runledger.environments (run_id);
-- The ones not reclaimed since they were made: where the due ones are looked for.
create index environments_unreclaimed on runledger.environments (workflow_name, workflow_version) where reclaimed_at is null;
comment on table runledger.environments is
  'Execution environments of runs (engine.workflow({ environment })): the manifest each attempt of the create step made, the worker reclaiming it (reclaim_owner until reclaim_until), and the last reclaim: when, for which run status, how many attempts, the last error. Reclaimed once the run finishes, whatever its status; again after a retry_run when the run finishes again.';

create function runledger._environment_record(
  p_run_id text, p_token bigint, p_seq int, p_attempt int, p_manifest jsonb)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
  v_id  text := runledger._new_id();
begin
  insert into runledger.environments (env_id, run_id, workflow_name, workflow_version, manifest, seq, attempt)
  values (v_id, p_run_id, v_run.workflow_name, v_run.workflow_version, p_manifest, p_seq, p_attempt);
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'environment_created', jsonb_build_object('env_id', v_id, 'seq', p_seq, 'attempt', p_attempt), p_token);
  return v_id;
end;
$$;
comment on function runledger._environment_record(text, bigint, int, int, jsonb) is
  'Fenced: records the environment an attempt of a run''s environment create step made (its manifest), before the step''s checkpoint; returns its env_id.';

-- Leases up to p_limit environments due for reclaim to p_worker: of finished runs (finished
-- after their last reclaim), of the workflow versions the worker serves (it has their
-- reclaim), not leased to another worker. p_run_id: only that run's (its own worker, at once).
create function runledger._environments_due(
  p_worker_id text, p_workflows text[], p_limit int, p_lease_ms int, p_run_id text default null)
returns table (env_id text, run_id text, workflow_name text, workflow_version text, manifest jsonb, run_status text, attempts int)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
#variable_conflict use_column
declare
  v_now timestamptz := runledger.now();
begin
  return query
  with due as (
    select e.env_id from runledger.environments e join runledger.runs r on r.run_id = e.run_id
     where (p_run_id is null or e.run_id = p_run_id)
       and (e.workflow_name || '@' || e.workflow_version) = any(p_workflows)
       and runledger.is_terminal(r.status)
       and (e.reclaimed_at is null or e.reclaimed_at < r.finished_at)
       and (e.reclaim_until is null or e.reclaim_until < v_now)
     order by r.finished_at
     limit p_limit
       for update of e skip locked)
  , leased as (
  update runledger.environments e
     set reclaim_owner = p_worker_id, reclaim_until = runledger._ms_after(v_now, p_lease_ms, '_environments_due: p_lease_ms'),
         reclaim_attempts = e.reclaim_attempts + 1
    from due, runledger.runs r
   where e.env_id = due.env_id and r.run_id = e.run_id
  returning e.env_id, e.run_id, e.workflow_name, e.workflow_version, e.manifest, r.status::text as run_status, e.reclaim_attempts)
  select l.env_id, l.run_id, l.workflow_name, l.workflow_version, l.manifest, l.run_status, l.reclaim_attempts from leased l;
end;
$$;
comment on function runledger._environments_due(text, text[], int, int, text) is
  'Leases to p_worker_id up to p_limit environments due for reclaim: their run finished (any terminal status) after their last reclaim, their workflow@version is in p_workflows, and no other worker holds them (reclaim_until passed). Each lease counts a reclaim attempt. p_run_id limits it to one run''s.';

-- A reclaim that takes longer than its lease keeps it while its worker lives: renewed on the way,
-- so no other worker starts the same reclaim beside it; a worker that dies stops renewing.
create function runledger._environment_renew(p_env_id text, p_worker_id text, p_lease_ms int) returns boolean
language sql volatile
set enable_seqscan = off set jit = off as $$
  with renewed as (
    update runledger.environments e
       set reclaim_until = runledger._ms_after(runledger.now(), p_lease_ms, '_environment_renew: p_lease_ms')
     where e.env_id = p_env_id and e.reclaim_owner = p_worker_id and e.reclaim_until > runledger.now()
    returning 1)
  select exists (select 1 from renewed)
$$;
comment on function runledger._environment_renew(text, text, int) is
  'The worker reclaiming an environment extends its lease by p_lease_ms from now; false when it no longer holds it (the lease ran out and another worker may have taken it).';

create function runledger._environment_reclaimed(p_env_id text, p_worker_id text, p_error jsonb, p_retry_in_ms int)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_env runledger.environments;
begin
  select * into v_env from runledger.environments e where e.env_id = p_env_id for update;
  if not found or v_env.reclaim_owner is distinct from p_worker_id then
    return false; -- the lease went to another worker meanwhile: its outcome is the one kept
  end if;
  if p_error is null then
    update runledger.environments e
       set reclaimed_at = runledger.now(), reclaimed_status = (select r.status::text from runledger.runs r where r.run_id = e.run_id),
           reclaim_owner = null, reclaim_until = null, last_error = null
     where e.env_id = p_env_id;
    insert into runledger.events (run_id, kind, detail)
    values (v_env.run_id, 'environment_reclaimed', jsonb_build_object('env_id', p_env_id, 'by', p_worker_id, 'attempts', v_env.reclaim_attempts));
  else
    update runledger.environments e
       set reclaim_owner = null, reclaim_until = runledger._ms_after(runledger.now(), p_retry_in_ms, '_environment_reclaimed: p_retry_in_ms'),
           last_error = p_error
     where e.env_id = p_env_id;
    insert into runledger.events (run_id, kind, detail)
    values (v_env.run_id, 'environment_reclaim_failed', jsonb_build_object('env_id', p_env_id, 'by', p_worker_id,
            'attempts', v_env.reclaim_attempts, 'error', p_error, 'retry_in_ms', p_retry_in_ms));
  end if;
  return true;
end;
$$;
comment on function runledger._environment_reclaimed(text, text, jsonb, int) is
  'The outcome of a leased reclaim: p_error null records it reclaimed (for the run''s current status) and ends the lease; else the error is kept and the environment is due again after p_retry_in_ms. False when the lease is no longer p_worker_id''s (its outcome is not recorded).';

insert into runledger.role_functions (role_name, function_name)
select 'runledger_worker', f from unnest(array['_environment_record', '_environments_due', '_environment_renew', '_environment_reclaimed']) f;

select runledger._secure_functions();

do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: the table environments is not granted yet (% may not grant roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (20, '0020_environments');
