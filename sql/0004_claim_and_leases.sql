-- 0004_claim_and_leases: workers, claims, leases and their fencing tokens, recovery of expired leases.
--
-- tables: workers
-- indexes: runs_lease_expiry, runs_ready, runs_not_before, runs_timer, runs_cancelling_unowned
-- functions: _lock_executing, _fence, _dead_letter_run, _release_run, _register_worker, _heartbeat,
--   _stop_worker, _recover_expired, _dispatch, _claim_batch, _trace_execution

-- The sweeper looks only at leased runs ordered by lease expiry. The predicate names the
-- lease, not the statuses that hold one: the fenced writes look up one executing run by
-- `run_id = ... and status in ('RUNNING', 'CANCELLING')`, which would prove an index on
-- those statuses usable, and a generic plan cached while the table was empty took it over
-- the primary key (test/plans.slow.test.ts caught it). `lease_expires_at < now` proves this one.
create index runs_lease_expiry on runledger.runs (lease_expires_at)
  where lease_expires_at is not null;

create table runledger.workers (
  worker_id         text collate "C" primary key,
  host              text collate "C" not null,
  pid               int  not null,
  workflows         text[] collate "C" not null,
  -- The run migrations it applies, as workflow@from>to.
  migrations        text[] collate "C" not null default '{}',
  queues            text[] collate "C" not null,
  concurrency       int not null,
  lease_ms          int not null,
  started_at        timestamptz not null default runledger.now(),
  last_heartbeat_at timestamptz not null default runledger.now(),
  stopped_at        timestamptz
);
comment on table runledger.workers is
  'Worker processes: what they serve (workflow@version, queues), the run migrations they apply (workflow@from>to), their lease length and last heartbeat. A worker silent for longer than its lease is considered dead.';

-- The run an execution holds, locked until commit: a takeover (which updates this row)
-- waits for us, and once it has happened our token no longer matches. A lock, not an
-- update: no new row version per step. The row is found by its key alone and the token
-- and status are checked after: a WHERE naming the statuses too let cached plans take a
-- partial index whose predicate those statuses imply (runs_queue_active) instead of the
-- primary key (sql/README.md, "Plans that cannot go stale"). FOR UPDATE returns the
-- latest version, so a takeover that committed while we waited fails the check.
create function runledger._lock_executing(p_run_id text, p_token bigint) returns runledger.runs
language plpgsql volatile as $$
declare
  v_run runledger.runs;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.fencing_token is distinct from p_token or v_run.status not in ('RUNNING', 'CANCELLING') then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing)', p_run_id, p_token);
  end if;
  return v_run;
end;
$$;
comment on function runledger._lock_executing(text, bigint) is
  'Returns the run, locked until commit, if it is RUNNING or CANCELLING under fencing token p_token; else raises RL001 LEASE_LOST. The lock every fenced write of an executing run starts from (_fence adds the deadline).';

create function runledger._fence(p_run_id text, p_token bigint, p_now timestamptz default null) returns runledger.runs
language plpgsql volatile as $$
declare
  v_run runledger.runs := runledger._lock_executing(p_run_id, p_token);
  v_now timestamptz := coalesce(p_now, runledger.now());
begin
  if v_run.deadline_at <= v_now then
    -- Nothing commits past the deadline; the worker then ends the run (TERMINATED, DEADLINE).
    raise exception using errcode = 'RL009', message = format('run %s: deadline %s passed', p_run_id, v_run.deadline_at);
  end if;
  return v_run;
end;
$$;
comment on function runledger._fence(text, bigint, timestamptz) is
  'Returns the run, locked until commit, if the caller still holds it with this fencing token; else raises RL001 LEASE_LOST. Past the run''s deadline raises RL009, so nothing commits after it.';

create function runledger._dead_letter_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb, p_policy_version text,
  p_error jsonb default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_error jsonb := coalesce(p_error, jsonb_build_object('name', 'DeadLettered', 'code', p_reason,
                     'message', coalesce(p_evidence->>'message', format('dead-lettered: %s', p_reason))));
begin
  perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', p_reason, null, v_error,
    coalesce(p_evidence, '{}'::jsonb) || jsonb_build_object('last_error', v_error), p_policy_version);
end;
$$;
comment on function runledger._dead_letter_run(text, bigint, text, jsonb, text, jsonb) is
  'Fenced move to DEAD_LETTER (e.g. NON_DETERMINISM) with evidence and the error that put it there (p_error, or one built from the reason and evidence.message) in runs.error and evidence.last_error; the run leaves the automatic path until retry_run.';

create function runledger._release_run(p_run_id text, p_token bigint, p_delay_ms bigint, p_reason text,
  p_counts_attempt boolean default false, p_error jsonb default null)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run   runledger.runs;
  v_now   timestamptz := runledger.now();
  v_error jsonb := coalesce(p_error, jsonb_build_object('name', 'Released', 'code', upper(p_reason),
                     'message', format('the worker gave the run back: %s', p_reason)));
begin
  -- By its key, checked after (sql/README.md, "Plans that cannot go stale").
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found or v_run.fencing_token is distinct from p_token or v_run.status <> 'RUNNING' then
    return false;
  end if;
  if p_counts_attempt and runledger._made_progress(p_run_id, p_token) then
    -- As in _recover_expired: the count is of failures since the run last made progress.
    v_run.recovery_attempts := 0;
  end if;
  if p_counts_attempt and v_run.recovery_attempts + 1 > v_run.max_recovery_attempts then
    -- An execution that keeps failing for infrastructure reasons must not loop forever; the
    -- dead letter says why the last one failed.
    perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, v_error,
      jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                         'last_release', p_reason, 'last_error', v_error),
      'runledger/1');
    return true;
  end if;
  update runledger.runs
     set status = 'PENDING', lease_owner = null, lease_expires_at = null, updated_at = v_now,
         recovery_attempts = v_run.recovery_attempts + case when p_counts_attempt then 1 else 0 end
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, 'released', jsonb_strip_nulls(jsonb_build_object('reason', p_reason, 'delay_ms', p_delay_ms,
                                                                     'counts_attempt', p_counts_attempt, 'error', p_error)),
          p_token, v_now);
  perform runledger._make_runnable(p_run_id, p_delay_ms);
  return true;
end;
$$;
comment on function runledger._release_run(text, bigint, bigint, text, boolean, jsonb) is
  'A worker gives a run back: RUNNING -> PENDING, re-dispatched after p_delay_ms. A graceful stop does not count a recovery attempt; an infrastructure failure does (p_counts_attempt; counting again from 1 when this execution committed a checkpoint, _made_progress), and past max_recovery_attempts the run is dead-lettered instead, with p_error (the error the worker released it for; built from p_reason when null) in runs.error and evidence.last_error. The event released keeps p_error too.';

create function runledger._register_worker(
  p_worker_id text, p_host text, p_pid int, p_workflows text[], p_queues text[], p_concurrency int, p_lease_ms int,
  p_migrations text[] default '{}')
returns void language sql volatile as $$
  insert into runledger.workers (worker_id, host, pid, workflows, queues, concurrency, lease_ms, migrations)
  values (p_worker_id, p_host, p_pid, p_workflows, p_queues, p_concurrency, p_lease_ms, coalesce(p_migrations, '{}'))
  on conflict (worker_id) do update
     set last_heartbeat_at = runledger.now(), stopped_at = null
$$;
comment on function runledger._register_worker(text, text, int, text[], text[], int, int, text[]) is
  'A worker process announces what it serves (workflow@version, queues), the run migrations it applies (workflow@from>to), its concurrency and lease length.';

-- A worker's group commit locks several of its runs in one transaction, in run_id order.
-- Its heartbeat, which renews all its leases in one statement, and its graceful stop lock
-- them in the same order, so they wait for each other instead of deadlocking.
create function runledger._heartbeat(p_worker_id text, p_lease_ms int, p_except text[] default '{}') returns text[]
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now  timestamptz := runledger.now();
  v_runs text[];
begin
  update runledger.workers set last_heartbeat_at = v_now, stopped_at = null where worker_id = p_worker_id;
  -- One statement renews every lease this worker holds. A run taken over by another
  -- worker has another lease_owner and is not renewed: the caller sees it missing.
  with held as (
    select r.run_id from runledger.runs r
     where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
       -- Runs inside a step that heartbeats itself are kept alive by that step only.
       and r.run_id <> all (p_except)
     order by r.run_id
     for update
  ), renewed as (
    update runledger.runs r
       set lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0)
      from held
     where r.run_id = held.run_id and r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
    returning r.run_id)
  select coalesce(array_agg(run_id), '{}') into v_runs from renewed;
  return v_runs;
end;
$$;
comment on function runledger._heartbeat(text, int, text[]) is
  'Worker heartbeat: marks the worker alive and renews the leases of all runs it owns, except p_except (runs whose current step heartbeats itself); returns the ids renewed.';

create function runledger._stop_worker(p_worker_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz := runledger.now();
  v_run   record;
  v_count int := 0;
begin
  for v_run in
    select r.run_id, r.fencing_token, r.status, r.queue_name from runledger.runs r
     where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
     order by r.run_id
     for update
  loop
    if v_run.status = 'RUNNING' then
      if runledger._release_run(v_run.run_id, v_run.fencing_token, 0, 'worker_stopped', false) then
        v_count := v_count + 1;
      end if;
    else
      -- Stopped while cancelling (a compensation still running): still CANCELLING, without
      -- an owner, for the next claim to finish the cancel at once, as _recover_expired does
      -- after a lease expiry, but without counting a recovery attempt (nothing failed).
      update runledger.runs set lease_owner = null, lease_expires_at = null, updated_at = v_now
       where run_id = v_run.run_id;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'released', jsonb_build_object('reason', 'worker_stopped', 'delay_ms', 0, 'counts_attempt', false,
                                                           'cancelling', true), v_run.fencing_token, v_now);
      perform runledger._dispatch(v_run.run_id, v_run.queue_name);
      v_count := v_count + 1;
    end if;
  end loop;
  update runledger.workers set stopped_at = v_now where worker_id = p_worker_id;
  return v_count;
end;
$$;
comment on function runledger._stop_worker(text) is
  'Graceful worker stop: every run the worker still holds is given back at once (event released, not a recovery attempt): a RUNNING one goes back to PENDING, a CANCELLING one stays CANCELLING without an owner for the next claim to finish its cancel. Marks the worker stopped; returns how many runs it released.';

create function runledger._recover_expired(p_limit int default 1000) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz := runledger.now();
  v_run   runledger.runs;
  v_count int := 0;
  v_attempts int;
  v_error    jsonb;
begin
  -- SKIP LOCKED: several workers sweep at once without blocking on each other or on
  -- a run whose owner is committing a checkpoint right now.
  for v_run in
    select * from runledger.runs r
     where r.status in ('RUNNING', 'CANCELLING') and r.lease_expires_at < v_now
     order by r.lease_expires_at
     limit p_limit
     for update skip locked
  loop
    v_count := v_count + 1;
    if v_run.status = 'CANCELLING' and runledger._compensations_due(v_run.run_id)
       and v_run.recovery_attempts < v_run.max_recovery_attempts then
      -- Its owner died while cancelling (or stopping), with compensations still to run:
      -- another worker takes the run (still CANCELLING) and finishes them; it never
      -- resumes the work. Each expiry counts an attempt, so a compensation that kills its
      -- worker every time is given up on after max_recovery_attempts (below).
      update runledger.runs set lease_owner = null, lease_expires_at = null, updated_at = v_now,
                                recovery_attempts = v_run.recovery_attempts + 1
       where run_id = v_run.run_id;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'lease_expired', jsonb_build_object('last_owner', v_run.lease_owner, 'cancelling', true,
                                                                'recovery_attempts', v_run.recovery_attempts + 1), v_run.fencing_token, v_now);
      perform runledger._dispatch(v_run.run_id, v_run.queue_name);
    elsif v_run.status = 'CANCELLING' then
      -- Its owner died while cancelling: complete the cancellation instead of resuming the
      -- work (a stopping run ends with its stop_record, see _finish_run). Compensations
      -- still due here were given up on: the evidence and the event say which.
      if runledger._compensations_due(v_run.run_id) then
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        values (v_run.run_id, 'compensations_abandoned',
                jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                                   'compensations', runledger._compensation_summary(v_run.run_id)), v_run.fencing_token, v_now);
      end if;
      perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'CANCELLED', 'CANCELLED', null, null,
        jsonb_build_object('reason', v_run.cancel_reason, 'requested_at', v_run.cancel_requested_at,
                           'completed_by', 'recovery', 'last_owner', v_run.lease_owner), null);
    else
      -- Attempts count the lease expiries since the run last made progress: an execution
      -- that committed a checkpoint under its fencing token starts the count again.
      v_attempts := case when runledger._made_progress(v_run.run_id, v_run.fencing_token) then 0 else v_run.recovery_attempts end;
      if v_attempts + 1 > v_run.max_recovery_attempts then
        -- Through _finish_run (and _finished): the event, the parent's wake-up and the
        -- admission of the next run of a limited queue, in this transaction.
        -- The last error that put it here is the expiry itself (its owner died or hung):
        -- in runs.error and in the evidence, as _release_run records a worker's error.
        v_error := jsonb_build_object('name', 'LeaseExpired', 'code', 'LEASE_EXPIRED',
          'message', format('the lease of worker %s expired at %s without a checkpoint, %s times in a row (max_recovery_attempts %s)',
                            v_run.lease_owner, v_run.lease_expires_at, v_attempts + 1, v_run.max_recovery_attempts));
        perform runledger._finish_run(v_run.run_id, v_run.fencing_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, v_error,
          jsonb_build_object(
            'recovery_attempts', v_attempts,
            'max_recovery_attempts', v_run.max_recovery_attempts,
            'last_owner', v_run.lease_owner,
            'lease_expired_at', v_run.lease_expires_at,
            'last_error', v_error),
          'runledger/1');
      else
        update runledger.runs
           set status = 'PENDING', recovery_attempts = v_attempts + 1, updated_at = v_now,
               lease_owner = null, lease_expires_at = null
         where run_id = v_run.run_id;
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        values (v_run.run_id, 'lease_expired',
                jsonb_strip_nulls(jsonb_build_object('last_owner', v_run.lease_owner, 'lease_expired_at', v_run.lease_expires_at,
                                   'recovery_attempt', v_attempts + 1,
                                   'progress_reset', case when v_attempts <> v_run.recovery_attempts then true end)),
                v_run.fencing_token, v_now);
        perform runledger._make_runnable(v_run.run_id, 0);
      end if;
    end if;
  end loop;

  -- A worker silent for two lease lengths is dead; its runs were (or are being) recovered above.
  update runledger.workers w set stopped_at = v_now
   where w.stopped_at is null and w.last_heartbeat_at < v_now - make_interval(secs => 2 * w.lease_ms / 1000.0);
  return v_count;
end;
$$;
comment on function runledger._recover_expired(int) is
  'Sweeper, run by every live worker: each RUNNING run whose lease expired goes back to PENDING counting one recovery attempt and is re-dispatched, or, past max_recovery_attempts, to DEAD_LETTER with its termination record and the error LEASE_EXPIRED (runs.error, evidence.last_error) (through _finish_run: parent woken, queue slot freed). Attempts count expiries since the last progress: an expired execution that committed a checkpoint under its fencing token (_made_progress) starts the count again at 1. A CANCELLING one with compensations due is left without an owner for the next claim (counting an attempt; past max_recovery_attempts they are given up on, event compensations_abandoned); without, or given up on, it ends CANCELLED (or with its stop_record). Marks silent workers stopped. Returns how many runs it handled.';

-- What a worker claims, in its order: priority (lower first), then age.
create index runs_ready on runledger.runs (queue_name, priority, created_at)
  where status = 'PENDING' and admitted;

-- When the next delayed start or timer of a queue is due (a worker arms a timer for it).
create index runs_not_before on runledger.runs (queue_name, not_before)
  where status = 'PENDING' and admitted and not_before is not null;

create index runs_timer on runledger.runs (queue_name, wake_at)
  where status = 'WAITING' and wake_at is not null;

-- _claim_batch looks for CANCELLING runs without an owner in every claim; without an
-- index of their own the planner walked every executing run of the queue to find none.
create index runs_cancelling_unowned on runledger.runs (queue_name) where status = 'CANCELLING' and lease_owner is null;

create function runledger._dispatch(p_run_id text, p_queue text, p_delay_ms bigint default 0) returns void
language plpgsql volatile as $$
declare
  v_due timestamptz;
begin
  if p_delay_ms > 0 then
    -- A delayed PENDING run becomes claimable at not_before; a WAITING run already has its wake_at.
    v_due := runledger._ms_after(runledger.now(), p_delay_ms, '_dispatch');
    update runledger.runs set not_before = v_due
     where run_id = p_run_id and status = 'PENDING' and (not_before is null or not_before < v_due);
  end if;
  -- Workers serving the queue claim at once, or arm a timer for the delay ("queue+ms"):
  -- a delay, not a time, so a worker's clock never meets the database's. A worker arms
  -- at most setTimeout's ceiling (24.8 days) and finds a later one by claiming then.
  -- Identical notifications in one transaction are delivered once.
  perform pg_notify('runledger_runnable', p_queue || case when p_delay_ms > 0 then '+' || p_delay_ms else '' end);
end;
$$;
comment on function runledger._dispatch(text, text, bigint) is
  'Announces that a run of queue p_queue is (or after p_delay_ms will be) runnable: sets not_before for a delayed PENDING run and notifies runledger_runnable with the queue name (and "+" the delay in ms). Workers claim from the runs table; a lost notification only delays a run until the next poll.';

-- Its statements keep one plan per session (plan_cache_mode = force_generic_plan). Their
-- limits are parameters, and a generic plan with an unknown limit is estimated to read a
-- tenth of the index, so PL/pgSQL's cost test kept choosing a custom plan: the claim of
-- the ready runs and the deadline check were planned again on every call, a large share of
-- a drained run's server time on runs with its many indexes. The generic plans are the
-- same index scans (test/plans.slow.test.ts checks them, made on a table the statistics call
-- empty and on one never analysed).
create function runledger._claim_batch(
  p_worker_id text, p_queues text[], p_workflows text[], p_limit int, p_lease_ms int,
  p_reclaim_except text[] default null, p_deferred jsonb default null)
returns table (
  run_id text, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb,
  cancel_requested boolean, checkpoints jsonb, progress jsonb, next_due_in_ms bigint,
  traceparent text, execution_traceparent text, lineage_id text)
language plpgsql volatile
set enable_seqscan = off set jit = off set plan_cache_mode = force_generic_plan as $$
declare
  v_now   timestamptz := runledger.now();
  v_ids   text[] := '{}';
  v_queue text;
  v_seen  text[] := '{}';
  v_limited boolean;
  v_next  timestamptz;
  v_deferred     jsonb := p_deferred;
  v_deferred_ids text[];
  v_deferred_at  timestamptz[];
begin
  if p_limit is null or p_limit < 1 then
    raise exception using errcode = 'RL003', message = format('_claim_batch: limit must be >= 1, not %s', p_limit);
  end if;
  if p_queues is null or p_workflows is null then
    raise exception using errcode = 'RL003', message = '_claim_batch: queues and workflows must be arrays (empty claims nothing)';
  end if;
  if p_reclaim_except is not null then
    -- A claim whose reply was lost may have committed: take back this worker's runs
    -- that it is not executing (new token), before anything else.
    v_ids := array(
      select r.run_id from runledger.runs r
       where r.lease_owner = p_worker_id and r.status in ('RUNNING', 'CANCELLING')
         and not (r.run_id = any(p_reclaim_except))
       limit p_limit
       for update skip locked);
  end if;

  foreach v_queue in array p_queues loop
    exit when cardinality(v_ids) >= p_limit;
    continue when v_queue = any(v_seen); -- a queue named twice is looked at once
    v_seen := v_seen || v_queue;
    -- A run past its deadline is never put back to work: it ends here instead.
    perform runledger._stop_unowned((d.r).run_id, 'TERMINATED', 'DEADLINE', runledger._deadline_evidence(d.r, v_now))
       from (select r from runledger.runs r
              where r.deadline_at <= v_now and r.status in ('PENDING', 'WAITING') and r.queue_name = v_queue
              limit p_limit
              for update skip locked) d;
    -- A cancelled run whose owner died before its compensations finished.
    v_ids := v_ids || array(
      select r.run_id from runledger.runs r
       where r.queue_name = v_queue and r.status = 'CANCELLING' and r.lease_owner is null
         and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
       limit p_limit - cardinality(v_ids)
       for update skip locked);
    v_limited := runledger._queue_limited(v_queue);
    if v_limited then
      -- In a queue with limits a due timer wakes the run into admission instead.
      perform runledger._wake(t.run_id, t.wait_kind, t.wait_key)
         from (select r.run_id, r.wait_kind, r.wait_key from runledger.runs r
                where r.queue_name = v_queue and r.status = 'WAITING' and r.wake_at <= v_now
                  and (r.deadline_at is null or r.deadline_at > v_now)
                order by r.wake_at
                limit p_limit
                for update skip locked) t;
      -- Admitted runs in the order admission chose (priority, fair turns across keys,
      -- age), so a claim with fewer free slots than admitted runs keeps that order. At
      -- most the queue's concurrency is admitted and unclaimed: the sort is small.
      v_ids := v_ids || array(
        select r.run_id from runledger.runs r
         where r.queue_name = v_queue and r.status = 'PENDING' and r.admitted
           and (r.not_before is null or r.not_before <= v_now)
           and (r.deadline_at is null or r.deadline_at > v_now)
           and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
         order by r.admitted_at nulls first, r.priority, r.created_at
         limit p_limit - cardinality(v_ids)
         for update skip locked);
      -- Then the runs the admission rounds of a group commit chose and handed to this claim
      -- (p_deferred, from _commit_and_claim), in their rounds' order: each goes from PENDING
      -- to RUNNING in the one update below, with the admitted_at its round gave it;
      -- _admit_deferred admits the ones left. (`admitted is not true`: see _admit_deferred.)
      if v_deferred is not null and cardinality(v_ids) < p_limit then
        v_ids := v_ids || array(
          select r.run_id
            from jsonb_to_recordset(v_deferred) d(q text, id text, at timestamptz)
            join runledger.runs r on r.run_id = d.id
           where d.q = v_queue and r.status = 'PENDING' and r.admitted is not true
             and (r.deadline_at is null or r.deadline_at > v_now)
             and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
           order by d.at
           limit p_limit - cardinality(v_ids)
           for update of r skip locked);
        select array_agg(d.id), array_agg(d.at) into v_deferred_ids, v_deferred_at
          from jsonb_to_recordset(v_deferred) d(id text, at timestamptz);
      end if;
      continue;
    else
      -- Runs already under way (a sleep ended, a wait timed out, a retry backoff passed) go first.
      v_ids := v_ids || array(
        select r.run_id from runledger.runs r
         where r.queue_name = v_queue and r.status = 'WAITING' and r.wake_at <= v_now
           and (r.deadline_at is null or r.deadline_at > v_now)
           and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
         order by r.wake_at
         limit p_limit - cardinality(v_ids)
         for update skip locked);
    end if;
    v_ids := v_ids || array(
      select r.run_id from runledger.runs r
       where r.queue_name = v_queue and r.status = 'PENDING' and r.admitted
         and (r.not_before is null or r.not_before <= v_now)
         -- Past its deadline: ended above, or by the next claim or the deadline sweep; never claimed.
         and (r.deadline_at is null or r.deadline_at > v_now)
         and (r.workflow_name || '@' || r.workflow_version) = any(p_workflows)
       order by r.priority, r.created_at
       limit p_limit - cardinality(v_ids)
       for update skip locked);
  end loop;

  if cardinality(v_ids) > 0 then
    -- Compare-and-set on the rows locked above: a new fencing token and a lease for each.
    return query
      with claimed as (
        update runledger.runs r
           set status = case when r.status = 'CANCELLING' then 'CANCELLING'::runledger.run_status else 'RUNNING' end,
               fencing_token = r.fencing_token + 1, lease_owner = p_worker_id,
               wait_kind = null, wait_key = null, wake_at = null, admitted = false,
               admitted_at = coalesce(v_deferred_at[array_position(v_deferred_ids, r.run_id)], r.admitted_at),
               lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0),
               started_at = coalesce(r.started_at, v_now), updated_at = v_now
         where r.run_id = any(v_ids)
        returning r.*
      ), logged as (
        insert into runledger.events (run_id, kind, detail, fencing_token, at)
        select c.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), c.fencing_token, v_now from claimed c
      )
      select c.run_id, c.workflow_name, c.workflow_version, c.input, c.fencing_token,
             c.recovery_attempts, c.max_steps, c.budget, c.budget_spent, c.budget_limits, c.budget_used, c.status = 'CANCELLING',
             -- output wrapped in a one-element array so JSON null and "no value" (SQL NULL) stay distinct.
             coalesce((select jsonb_agg(jsonb_build_array(s.seq, s.name, s.status,
                                          case when s.output is null then null else jsonb_build_array(s.output) end,
                                          s.error, s.kind) order by s.seq)
                         from runledger.steps s where s.run_id = c.run_id), '[]'::jsonb),
             (select jsonb_object_agg(p.seq::text, p.progress) from runledger.step_progress p where p.run_id = c.run_id),
             null::bigint, c.traceparent, c.execution_traceparent, c.lineage_id
        from claimed c;
  end if;

  if cardinality(v_ids) < p_limit then
    -- Nothing more is runnable now: say in how long something next will be (a delay on
    -- the database clock, so the worker's clock plays no part in when it claims again).
    foreach v_queue in array v_seen loop
      v_next := least(v_next,
        (select min(r.not_before) from runledger.runs r
          where r.queue_name = v_queue and r.status = 'PENDING' and r.admitted and r.not_before > v_now),
        (select min(r.wake_at) from runledger.runs r
          where r.queue_name = v_queue and r.status = 'WAITING' and r.wake_at > v_now));
    end loop;
    return query select null::text, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb, null::boolean, null::jsonb, null::jsonb,
                        ceil(extract(epoch from v_next - v_now) * 1000)::bigint, null::text, null::text, null::text;
  end if;
end;
$$;
comment on function runledger._claim_batch(text, text[], text[], int, int, text[], jsonb) is
  'Worker claim of up to p_limit runnable runs of the given queues and workflow@version keys, in one statement: CANCELLING runs without an owner, then due timers, then admitted PENDING runs by priority and age; in a queue with limits, by admitted_at, then the runs p_deferred names (the admission rounds of a group commit with a claim, _commit_and_claim, hand it theirs). Rows are locked FOR UPDATE SKIP LOCKED, so workers never wait on each other. Each becomes RUNNING with fencing_token + 1 and a lease, and is returned with its checkpoints (and its traceparent and the previous execution''s, for tracing, and its lineage_id, null for a run never forked). Runs past their deadline are TERMINATED on the way; a due timer in a queue with limits is woken into admission. When fewer than p_limit were claimed, a last row with run_id null gives next_due_in_ms, the milliseconds until the next delayed start or timer on the database clock (null if none). p_reclaim_except (the runs the worker is executing) also takes back this worker''s other runs: a claim whose reply was lost.';

-- Tracing: the worker that claimed a run records the span of this execution, so the next
-- execution (after a crash, on another worker) can link to it. Fenced by the token: a worker
-- that lost the run writes nothing. Not an event: it changes nothing about the run.
create function runledger._trace_execution(p_run_id text, p_token bigint, p_traceparent text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_traceparent is null or not runledger._is_traceparent(p_traceparent) then
    raise exception using errcode = 'RL003',
      message = format('_trace_execution: %L is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)', p_traceparent);
  end if;
  update runledger.runs r set execution_traceparent = p_traceparent
   where r.run_id = p_run_id and r.fencing_token = p_token and r.lease_owner is not null;
  return found;
end;
$$;
comment on function runledger._trace_execution(text, bigint, text) is
  'Records p_traceparent, the span of the execution that holds the run with fencing token p_token, in runs.execution_traceparent (the next execution''s span links to it). Returns false, writing nothing, when that execution no longer holds the run. RL003 for a value that is not a W3C traceparent.';

insert into runledger.migrations (version, name) values (4, '0004_claim_and_leases');
