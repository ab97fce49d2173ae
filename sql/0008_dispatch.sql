-- breaking: workers claim runs from runledger.runs; a runledger build that dispatched runs as graphile-worker jobs would wait for jobs that never come.
-- 0008_dispatch: workers claim runnable runs straight from runledger.runs.
--
--   runledger._dispatch(...)      announces that a run is (or will be) runnable: NOTIFY runledger_runnable
--   runledger._claim_batch(...)   claims up to N runnable runs in one statement (SKIP LOCKED)
--   runledger._start_claimed(...) starts a run and claims it for the caller's own worker, in one transaction
--
-- The runs table says which runs can execute (PENDING and admitted, a WAITING run whose
-- timer is due, a CANCELLING run without an owner), so a worker takes them from there:
-- one round trip claims a batch, and a run cannot lose its dispatch. A notification only
-- saves a worker the wait for its next poll. (graphile-worker is used for cron schedules
-- only.)

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

create function runledger._dispatch(p_run_id text, p_queue text, p_delay_ms int default 0) returns void
language plpgsql volatile as $$
declare
  v_due timestamptz;
begin
  if p_delay_ms > 0 then
    -- A delayed PENDING run becomes claimable at not_before; a WAITING run already has its wake_at.
    v_due := runledger.now() + make_interval(secs => p_delay_ms / 1000.0);
    update runledger.runs set not_before = v_due
     where run_id = p_run_id and status = 'PENDING' and (not_before is null or not_before < v_due);
  end if;
  -- Workers serving the queue claim at once, or arm a timer for the delay ("queue+ms"):
  -- a delay, not a time, so a worker's clock never meets the database's.
  -- Identical notifications in one transaction are delivered once.
  perform pg_notify('runledger_runnable', p_queue || case when p_delay_ms > 0 then '+' || p_delay_ms else '' end);
end;
$$;
comment on function runledger._dispatch(text, text, int) is
  'Announces that a run of queue p_queue is (or after p_delay_ms will be) runnable: sets not_before for a delayed PENDING run and notifies runledger_runnable with the queue name (and "+" the delay in ms). Workers claim from the runs table; a lost notification only delays a run until the next poll.';

create function runledger._claim_batch(
  p_worker_id text, p_queues text[], p_workflows text[], p_limit int, p_lease_ms int,
  p_reclaim_except text[] default null)
returns table (
  run_id text, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb,
  cancel_requested boolean, checkpoints jsonb, progress jsonb, next_due_in_ms bigint)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz := runledger.now();
  v_ids   text[] := '{}';
  v_queue text;
  v_seen  text[] := '{}';
  v_limited boolean;
  v_next  timestamptz;
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
             null::bigint
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
                        ceil(extract(epoch from v_next - v_now) * 1000)::bigint;
  end if;
end;
$$;
comment on function runledger._claim_batch(text, text[], text[], int, int, text[]) is
  'Worker claim of up to p_limit runnable runs of the given queues and workflow@version keys, in one statement: CANCELLING runs without an owner, then due timers, then admitted PENDING runs by priority and age (FOR UPDATE SKIP LOCKED, so workers never wait on each other). Each becomes RUNNING with fencing_token + 1 and a lease, and is returned with its checkpoints. Runs past their deadline are TERMINATED on the way; a due timer in a queue with limits is woken into admission. When fewer than p_limit were claimed, a last row with run_id null gives next_due_in_ms, the milliseconds until the next delayed start or timer on the database clock (null if none). p_reclaim_except (the runs the worker is executing) also takes back this worker''s other runs: a claim whose reply was lost.';

-- engine.start in a process whose own worker has a free slot: the start and the claim in
-- one transaction. The worker is spared a claim, and the run the wait for it (a claim
-- round trip after the start's commit). Only the run start_run just made or found is
-- claimed, and only while it is PENDING and admitted (in a queue with limits: admission
-- let it in at once, so it holds a slot already), runnable now, never claimed
-- (fencing_token 0), of the version the worker serves and within its deadline; anything
-- else is left to the queue's workers and comes back unclaimed.
create function runledger._start_claimed(
  p_workflow text, p_input jsonb, p_options jsonb, p_worker_id text, p_lease_ms int)
returns table (
  run_id text, claimed boolean, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run      runledger.runs;
  v_started  record;
  v_claimed  boolean;
  v_now      timestamptz;
begin
  if p_worker_id is null or p_lease_ms is null or p_lease_ms < 1 then
    raise exception using errcode = 'RL003', message = '_start_claimed: a worker id and a lease of at least 1 ms are required';
  end if;
  -- A new run that is runnable at once is inserted already claimed (runledger._start).
  v_started := runledger._start(p_workflow, p_input, coalesce(p_options, '{}') || '{"notify": false}', p_worker_id, p_lease_ms);
  v_run := v_started.run;
  v_claimed := v_started.inserted and v_run.status = 'RUNNING';
  if not v_claimed then
    -- A run already there (an idempotent start), or one its queue's admission just let in:
    -- claimed here only if it was never claimed and is runnable now, as _claim_batch would
    -- claim it, and only under the run id the start asked for: the worker knows a start in
    -- flight by that id, and would otherwise take back (and run again) a run leased to it
    -- before the start's answer arrives. Found by its key and checked after (sql/README.md,
    -- "Plans that cannot go stale").
    v_now := runledger.now();
    select * into v_run from runledger.runs r where r.run_id = v_run.run_id for update;
    v_claimed := v_run.run_id = coalesce(p_options->>'run_id', v_run.run_id)
       and v_run.status = 'PENDING' and v_run.admitted and v_run.fencing_token = 0
       and v_run.workflow_version = coalesce(p_options->>'version', v_run.workflow_version)
       and (v_run.not_before is null or v_run.not_before <= v_now)
       and (v_run.deadline_at is null or v_run.deadline_at > v_now);
    if v_claimed then
      update runledger.runs r
         set status = 'RUNNING', fencing_token = 1, lease_owner = p_worker_id,
             lease_expires_at = v_now + make_interval(secs => p_lease_ms / 1000.0), admitted = false,
             started_at = coalesce(r.started_at, v_now), updated_at = v_now
       where r.run_id = v_run.run_id
      returning r.* into v_run;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (v_run.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), v_run.fencing_token, v_now);
    elsif v_run.status = 'PENDING' and v_run.admitted then
      -- Not claimed here: announced as start_run announces, so a worker of the queue takes it.
      perform runledger._dispatch(null, v_run.queue_name);
    end if;
  end if;
  if v_claimed then
    return query select v_run.run_id, true, v_run.workflow_name, v_run.workflow_version, v_run.input, v_run.fencing_token,
                        v_run.recovery_attempts, v_run.max_steps, v_run.budget, v_run.budget_spent, v_run.budget_limits, v_run.budget_used;
  else
    return query select v_run.run_id, false, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb;
  end if;
end;
$$;
comment on function runledger._start_claimed(text, jsonb, jsonb, text, int) is
  'engine.start for a run its own process''s worker takes: the run is started as start_run starts it (without NOTIFY) and claimed for p_worker_id with a lease of p_lease_ms in the same transaction, as _claim_batch would claim it: a new run that is runnable at once is inserted claimed (runledger._start), an existing never-claimed runnable one (an idempotent start, or one its queue''s admission just let in) is claimed by an update. Returns one row: claimed true with the claimed run''s fields, or claimed false (a run already claimed or of another version, a delayed start, a run admission held back, a deadline already past), in which case the run is announced as start_run announces it.';

insert into runledger.migrations (version, name) values (8, '0008_dispatch');
