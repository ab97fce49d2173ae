-- 0005_steps_and_commit: checkpoints, completion, failure and the group commit.
--
-- functions: _completed_evidence, _made_progress, _started_at, _checkpoint_row, _checkpoint,
--   _checkpoint_outcome, _announce_finished, _finished, _finish_run, _complete_run,
--   _complete_with_checkpoint, _fail_run, _commit_fast, _commit_items, _commit_batch, _commit_and_claim

-- STABLE, as jsonb_build_object is: an IMMUTABLE SQL function whose body calls a STABLE
-- one is not inlined, and would run through the SQL-function executor for every completed
-- run. Its result depends only on its arguments.
create function runledger._completed_evidence(p_steps bigint, p_run runledger.runs, p_verification jsonb) returns jsonb
language sql stable as $$
  select jsonb_build_object('steps', p_steps, 'budget_spent', p_run.budget_spent)
         || case when p_run.budget_used is null then '{}'::jsonb else jsonb_build_object('budget_used', p_run.budget_used) end
         || case when p_verification is null then '{}'::jsonb else jsonb_build_object('verification', p_verification) end
$$;
comment on function runledger._completed_evidence(bigint, runledger.runs, jsonb) is
  'The evidence of a COMPLETED termination record: steps, budget_spent (units), budget_used (other dimensions, when any) and verification (what the workflow''s verify accepted the output with, when it has one).';

-- Progress, for recovery attempts: the execution holding this fencing token committed
-- at least one checkpoint (the row of a durable retry backoff, WAITING, is not one).
create function runledger._made_progress(p_run_id text, p_token bigint) returns boolean
language sql stable as $$
  select exists (select 1 from runledger.steps s
                  where s.run_id = p_run_id and s.fencing_token = p_token and s.status in ('SUCCEEDED', 'FAILED'))
$$;
comment on function runledger._made_progress(text, bigint) is
  'True when the execution holding fencing token p_token committed a checkpoint (SUCCEEDED or FAILED step): the progress that resets recovery_attempts when that execution is recovered or released.';

-- The checkpoint's body returns the run row read by the fence, so a caller that goes on
-- to finish the run (_complete_with_checkpoint, group commit) need not read it again.
-- A worker says how long ago a step started (a monotonic clock of its own), never when:
-- the start is placed on the database clock, so a worker's clock running ahead or behind
-- cannot decide whether a step started before a cancel request.
create function runledger._started_at(p_now timestamptz, p_started_ms_ago bigint) returns timestamptz
language sql stable parallel safe as $$
  select p_now - make_interval(secs => greatest(coalesce(p_started_ms_ago, 0), 0) / 1000.0)
$$;
comment on function runledger._started_at(timestamptz, bigint) is
  'A step''s start on the database clock: p_now minus p_started_ms_ago milliseconds (the elapsed time the worker measured; null or negative is taken as 0).';

create function runledger._checkpoint_row(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_output jsonb, p_error jsonb, p_attempts int, p_started_ms_ago bigint, p_charge jsonb default null)
returns runledger.runs
language plpgsql volatile as $$
declare
  v_now  timestamptz := runledger.now();
  v_run  runledger.runs := runledger._fence(p_run_id, p_token, v_now);
  v_started timestamptz := runledger._started_at(v_now, p_started_ms_ago);
  v_hash text;
begin
  -- Both times are on the database clock: the start is now minus the elapsed time the worker measured.
  if v_run.status = 'CANCELLING' and v_started >= v_run.cancel_requested_at then
    -- Only a step already running when the cancel was committed may still record its result.
    raise exception using errcode = 'RL008', message = format('run %s: step %s started after the cancel request', p_run_id, p_name);
  end if;
  if v_run.no_progress is not null and p_status = 'SUCCEEDED' then
    v_hash := md5(coalesce(p_output::text, ''));
  end if;
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token, output_hash)
  -- finished_at is the time the deadline was checked against (fence), not a later one.
  values (p_run_id, p_seq, p_name, p_kind, p_status, p_output, p_error, p_attempts, v_started, v_now, p_token, v_hash)
  -- A step that waited between attempts (durable retry backoff) left a WAITING row here.
  on conflict (run_id, seq) do update
     set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
         finished_at = excluded.finished_at, fencing_token = excluded.fencing_token, output_hash = excluded.output_hash
   where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
  if not found then
    raise exception using errcode = 'RL010', message = format('run %s: step %s already has a checkpoint', p_run_id, p_seq);
  end if;
  -- Termination policies are checked atomically with the checkpoint that trips them.
  if not runledger._no_charge(p_charge) then
    v_run := runledger._charge(v_run, p_charge, p_name, p_seq);
  end if;
  if v_hash is not null and v_run.status in ('RUNNING', 'CANCELLING') then
    if runledger._check_progress(v_run, p_name, p_seq, v_hash) then
      -- TERMINATED, or CANCELLING when its compensations run first (_terminate_run).
      select * into v_run from runledger.runs where run_id = p_run_id;
    end if;
  end if;
  return v_run;
end;
$$;
comment on function runledger._checkpoint_row(text, bigint, int, text, text, text, jsonb, jsonb, int, bigint, jsonb) is
  'The body of _checkpoint: fenced checkpoint write (see _checkpoint), returning the run row as it is after the checkpoint (its status says whether a policy ended it).';

create function runledger._checkpoint(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_output jsonb, p_error jsonb, p_attempts int, p_started_ms_ago bigint, p_charge jsonb default null)
returns table (pid int, run_status text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  run_status := (runledger._checkpoint_row(p_run_id, p_token, p_seq, p_name, p_kind, p_status, p_output, p_error,
                                           p_attempts, p_started_ms_ago, p_charge)).status;
  pid := pg_backend_pid();
  return next;
end;
$$;
comment on function runledger._checkpoint(text, bigint, int, text, text, text, jsonb, jsonb, int, bigint, jsonb) is
  'Fenced checkpoint write in the caller''s transaction: checks the fencing token (row lock on the run) and the deadline, inserts the step row, charges p_charge (amounts per dimension, see _charge) to the budgets and checks the no-progress limit (either may end the run TERMINATED right here). Returns the backend pid and the run''s status (CANCELLING tells the worker to stop).';

create function runledger._checkpoint_outcome(p_run_id text, p_seq int, p_token bigint)
returns table (committed boolean, status text, output jsonb, error jsonb, still_owner boolean)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_token bigint;
begin
  -- Waits for any transaction still holding the run row (a COMMIT in flight), so the
  -- answer below is final: the checkpoint either exists now or never will.
  select r.fencing_token into v_token from runledger.runs r where r.run_id = p_run_id for update;
  return query
    select s.run_id is not null, s.status, case when s.output is null then null else jsonb_build_array(s.output) end,
           s.error, v_token = p_token
      from (select 1) one
      left join runledger.steps s on s.run_id = p_run_id and s.seq = p_seq and s.fencing_token = p_token;
end;
$$;
comment on function runledger._checkpoint_outcome(text, int, bigint) is
  'After a COMMIT whose outcome the client did not see: waits for in-flight transactions on the run, then says whether the checkpoint committed (output wrapped in a one-element array, null when absent).';

-- Callers awaiting a result (handle.result(), engine.handle) LISTEN on runledger_finished:
-- the payload is the ids of runs that just ended, comma-separated, in as few
-- notifications as fit under PostgreSQL's 8,000-byte payload limit. Delivered at commit;
-- a caller that misses it (its connection dropped) reads the run rows instead.
create function runledger._announce_finished(p_run_ids text[]) returns void
language plpgsql volatile as $$
declare
  v_chunk text := '';
  v_id    text;
begin
  foreach v_id in array p_run_ids loop
    if length(v_chunk) + length(v_id) + 1 > 7900 then
      perform pg_notify('runledger_finished', v_chunk);
      v_chunk := '';
    end if;
    v_chunk := case when v_chunk = '' then v_id else v_chunk || ',' || v_id end;
  end loop;
  if v_chunk <> '' then
    perform pg_notify('runledger_finished', v_chunk);
  end if;
end;
$$;
comment on function runledger._announce_finished(text[]) is
  'NOTIFY runledger_finished with the ids of runs that reached a terminal status, comma-separated, split to stay under the 8,000-byte payload limit; callers awaiting results listen for it.';

-- What every move to a terminal status does after the run row itself: its event, the
-- notification of callers awaiting it, its parent's wake-up, and admission of the next
-- run of a queue with limits. The callers pass what they already read from the row, so
-- it is not read again.
create function runledger._finished(
  p_run_id text, p_token bigint, p_status runledger.run_status, p_reason text, p_error jsonb, p_evidence jsonb,
  p_parent text, p_queue text, p_now timestamptz)
returns void
language plpgsql volatile as $$
begin
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, case p_status when 'DEAD_LETTER' then 'dead_lettered' else lower(p_reason) end,
          jsonb_strip_nulls(jsonb_build_object('status', p_status, 'reason', p_reason, 'error', p_error, 'evidence', p_evidence)), p_token, p_now);
  perform pg_notify('runledger_finished', p_run_id);
  -- As _wake_parent and _slot_freed, without reading the row again.
  if p_parent is not null then
    perform runledger._wake(p_parent, 'child', p_run_id);
  end if;
  if runledger._queue_limited(p_queue) then
    perform runledger._admit(p_queue);
  end if;
end;
$$;
comment on function runledger._finished(text, bigint, runledger.run_status, text, jsonb, jsonb, text, text, timestamptz) is
  'After a run''s row moved to a terminal status: writes its event, notifies runledger_finished with its id, wakes its parent (p_parent) and admits the next run of its queue if the queue has limits.';

create function runledger._finish_run(
  p_run_id text, p_token bigint, p_status runledger.run_status, p_reason text,
  p_output jsonb, p_error jsonb, p_evidence jsonb, p_policy_version text)
returns void
language plpgsql volatile as $$
declare
  v_now      timestamptz := runledger.now();
  v_parent   text;
  v_queue    text;
  v_status   runledger.run_status;
  v_reason   text;
  v_error    jsonb;
  v_evidence jsonb;
begin
  perform runledger._lock_executing(p_run_id, p_token);
  -- One statement (the SET expressions read the row as it was). A run that was stopping
  -- (a policy stop, or compensate_run) ends with the record of what stopped it, whatever
  -- its last execution ended with; the evidence then says which compensations ran.
  update runledger.runs
     set status = coalesce((stop_record->>'status')::runledger.run_status, p_status),
         output = case when stop_record is null then p_output end,
         error = case when stop_record is null then p_error else stop_record->'error' end,
         finished_at = v_now, updated_at = v_now,
         lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
         termination_reason = coalesce(stop_record->>'reason', p_reason),
         termination_evidence = case when stop_record is null then p_evidence
                                     else coalesce(stop_record->'evidence', '{}'::jsonb)
                                          || jsonb_build_object('compensations', runledger._compensation_summary(run_id)) end,
         terminated_at = v_now,
         policy_version = coalesce(policy_version, p_policy_version), stop_record = null
   where run_id = p_run_id
  returning parent_run_id, queue_name, status, termination_reason, error, termination_evidence
       into v_parent, v_queue, v_status, v_reason, v_error, v_evidence;
  perform runledger._finished(p_run_id, p_token, v_status, v_reason, v_error, v_evidence, v_parent, v_queue, v_now);
end;
$$;
comment on function runledger._finish_run(text, bigint, runledger.run_status, text, jsonb, jsonb, jsonb, text) is
  'Fenced move of an executing run to a terminal status with its termination record (reason, evidence, time, policy version). A CANCELLING run with a stop_record ends with that record instead, its evidence extended with the outcome of its compensations.';

create function runledger._complete_run(p_run_id text, p_token bigint, p_output jsonb, p_policy_version text,
  p_charge jsonb default null, p_verification jsonb default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  if not runledger._no_charge(p_charge) then
    v_run := runledger._charge(v_run, p_charge, 'complete', null);
    if v_run.status = 'TERMINATED' or v_run.stop_record is not null then
      return; -- the charge stopped the run (its compensations then run, see _terminate_run)
    end if;
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', p_output, null,
    runledger._completed_evidence((select count(*) from runledger.steps s where s.run_id = p_run_id), v_run, p_verification),
    p_policy_version);
end;
$$;
comment on function runledger._complete_run(text, bigint, jsonb, text, jsonb, jsonb) is
  'Fenced completion: output, SUCCEEDED and the COMPLETED termination record commit together (a last charge over a budget ends it TERMINATED, BUDGET instead). p_verification: the evidence the workflow''s verify accepted the output with, kept in the record.';

create function runledger._complete_with_checkpoint(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_step_output jsonb, p_error jsonb, p_attempts int, p_started_ms_ago bigint, p_charge jsonb,
  p_output jsonb, p_policy_version text, p_verification jsonb default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now      timestamptz := runledger.now();
  v_run      runledger.runs;
  v_parent   text;
  v_queue    text;
  v_evidence jsonb;
begin
  -- The run's last step and its completion in one transaction (one round trip). The
  -- common case: a RUNNING run under this token, before its deadline, completes in one
  -- update. The run is locked by its key and checked here (sql/README.md, "Plans that
  -- cannot go stale"). A run with a no-progress limit, a charge or a cancel under way, or
  -- a stale token, takes the general path below, which also says what failed.
  select * into v_run from runledger.runs r where r.run_id = p_run_id for update;
  if runledger._no_charge(p_charge) and v_run.fencing_token = p_token and v_run.status = 'RUNNING' and v_run.no_progress is null
     and (v_run.deadline_at is null or v_run.deadline_at > v_now) then
    update runledger.runs r
       set status = 'SUCCEEDED', output = p_output, error = null, finished_at = v_now, updated_at = v_now,
           lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
           termination_reason = 'COMPLETED', terminated_at = v_now,
           policy_version = coalesce(r.policy_version, p_policy_version),
           -- The step below is not written yet (or only as a retry's WAITING row): count it once.
           termination_evidence = runledger._completed_evidence(
             (select count(*) from runledger.steps s where s.run_id = p_run_id and s.seq <> p_seq) + 1, r, p_verification)
     where r.run_id = p_run_id
    returning r.parent_run_id, r.queue_name, r.termination_evidence into v_parent, v_queue, v_evidence;
    insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
    values (p_run_id, p_seq, p_name, p_kind, p_status, p_step_output, p_error, p_attempts,
            runledger._started_at(v_now, p_started_ms_ago), v_now, p_token)
    on conflict (run_id, seq) do update
       set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
           finished_at = excluded.finished_at, fencing_token = excluded.fencing_token
     where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
    if not found then
      raise exception using errcode = 'RL010', message = format('run %s: step %s already has a checkpoint', p_run_id, p_seq);
    end if;
    perform runledger._finished(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', null, v_evidence, v_parent, v_queue, v_now);
    return;
  end if;
  -- The checkpoint's fence locks the run's row; the completion's finds it locked.
  v_run := runledger._checkpoint_row(p_run_id, p_token, p_seq, p_name, p_kind, p_status, p_step_output, p_error,
                                     p_attempts, p_started_ms_ago, p_charge);
  if v_run.status in ('RUNNING', 'CANCELLING') and v_run.stop_record is null then
    perform runledger._finish_run(p_run_id, p_token, 'SUCCEEDED', 'COMPLETED', p_output, null,
      runledger._completed_evidence((select count(*) from runledger.steps s where s.run_id = p_run_id), v_run, p_verification),
      p_policy_version);
  end if;
end;
$$;
comment on function runledger._complete_with_checkpoint(text, bigint, int, text, text, text, jsonb, jsonb, int, bigint, jsonb, jsonb, text, jsonb) is
  'Fenced: writes the last step''s checkpoint and completes the run in one transaction (unless the checkpoint itself ended the run, e.g. over budget).';

create function runledger._fail_run(p_run_id text, p_token bigint, p_error jsonb, p_policy_version text,
  p_reason text default 'FAILED', p_evidence jsonb default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_reason not in ('FAILED', 'UNVERIFIED') then
    raise exception using errcode = 'RL003', message = format('_fail_run: reason %L is neither FAILED nor UNVERIFIED', p_reason);
  end if;
  perform runledger._finish_run(p_run_id, p_token, 'FAILED', p_reason, null, p_error, p_evidence, p_policy_version);
end;
$$;
comment on function runledger._fail_run(text, bigint, jsonb, text, text, jsonb) is
  'Fenced failure: FAILED with the error and the termination record: reason FAILED (the workflow threw) or UNVERIFIED (the workflow''s verify refused its output; p_evidence holds the reason it gave).';

-- The common items of a group commit (a plain checkpoint, or a completion with its last step,
-- of a RUNNING run under its token, before its deadline, with no charge or one within every
-- limit, without a no-progress limit) are written together by _commit_fast, a few statements
-- for the whole batch instead of a few per item. Every other item, and every item of a batch
-- whose fast part failed (it is undone as a whole), goes through the same functions as a
-- single write, each in its own subtransaction (_commit_batch): one item's error (a lost
-- lease, a deadline, a cancel) is reported for that item alone and undoes only its own writes.
create function runledger._commit_fast(p_items jsonb, out written int[], out freed_queues text[])
language plpgsql volatile as $$
declare
  v_now       timestamptz := runledger.now();
  v_ids       text[];
  v_fast      int[];
  v_written   int;
  v_parents   text[];
  v_children  text[];
  v_done      text[];
  i           int;
begin
  -- Every run of the batch, locked in run_id order (as the heartbeat locks them), and
  -- the items that can take the fast path. A run named twice takes the careful path.
  -- (The ids as an array: joined to the JSON instead, the planner guessed 100 items and
  -- read the whole runs table.)
  v_ids := array(select distinct e.value->>'run_id' from jsonb_array_elements(p_items) e);
  -- Each item's run id is read from its JSON once, and the items of each run counted by a
  -- window (one sort): read again per pair of items, in the join's filter and in a count per
  -- item, they cost a batch of n items n² JSON lookups.
  with items as (
    select (e.ordinality - 1)::int as idx, e.value as v, e.value->>'run_id' as run_id,
           count(*) over (partition by e.value->>'run_id') as of_run
      from jsonb_array_elements(p_items) with ordinality e
  ), locked as (
    select r.run_id, r.fencing_token, r.status, r.no_progress, r.deadline_at,
           r.budget, r.budget_spent, r.budget_limits, r.budget_used
      from runledger.runs r
     where r.run_id = any(v_ids)
     order by r.run_id
       for update
  )
  select array_agg(it.idx) into v_fast
    from items it
    join locked l on l.run_id = it.run_id
   where it.v->>'op' in ('checkpoint', 'complete') and it.v ? 'seq'
     -- A charge within every limit is written here too; one that passes a limit stops the
     -- run, which _charge does on the careful path.
     and (runledger._no_charge(it.v->'charge')
          or runledger._charge_fits(l.budget, l.budget_spent, l.budget_limits, l.budget_used, it.v->'charge'))
     and l.fencing_token = (it.v->>'token')::bigint and l.status = 'RUNNING'
     and l.no_progress is null and (l.deadline_at is null or l.deadline_at > v_now)
     and it.of_run = 1;
  if v_fast is null then
    written := '{}';
    return;
  end if;

  -- The checkpoints (and the last steps of the completions). A position that already
  -- has a checkpoint raises, and the whole fast part is undone.
  insert into runledger.steps (run_id, seq, name, kind, status, output, error, attempts, started_at, finished_at, fencing_token)
  select e.value->>'run_id', (e.value->>'seq')::int, e.value->>'name', e.value->>'kind', e.value->>'status',
         case when e.value->>'op' = 'complete' then e.value->'step_output' else e.value->'output' end,
         e.value->'error', (e.value->>'attempts')::int,
         runledger._started_at(v_now, (e.value->>'started_ms_ago')::bigint), v_now, (e.value->>'token')::bigint
    from jsonb_array_elements(p_items) with ordinality e
   where (e.ordinality - 1)::int = any(v_fast)
  -- A step that waited between attempts (durable retry backoff) left a WAITING row here.
  on conflict (run_id, seq) do update
     set status = excluded.status, output = excluded.output, error = excluded.error, attempts = excluded.attempts,
         finished_at = excluded.finished_at, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING' and runledger.steps.name = excluded.name;
  get diagnostics v_written = row_count;
  if v_written <> cardinality(v_fast) then
    raise exception using errcode = 'RL010', message = '_commit_fast: a step already has a checkpoint';
  end if;

  -- The charges of the fast items, each within every limit (checked above).
  update runledger.runs r
     set budget_spent = r.budget_spent + coalesce((c.charge->>'units')::numeric, 0),
         budget_used = case when c.charge - 'units' = '{}'::jsonb then r.budget_used
                            else runledger._add_amounts(r.budget_used, c.charge - 'units') end
    from (select e.value->>'run_id' as run_id, runledger._as_charge(e.value->'charge') as charge
            from jsonb_array_elements(p_items) with ordinality e
           where (e.ordinality - 1)::int = any(v_fast) and not runledger._no_charge(e.value->'charge')) c
   where r.run_id = c.run_id and r.run_id = any(v_ids);

  -- The completions: the run row and its termination record, then the event.
  with done as (
    update runledger.runs r
       set status = 'SUCCEEDED', output = e.value->'output', error = null, finished_at = v_now, updated_at = v_now,
           lease_owner = null, lease_expires_at = null, wait_kind = null, wait_key = null, wake_at = null,
           termination_reason = 'COMPLETED', terminated_at = v_now,
           policy_version = coalesce(r.policy_version, e.value->>'policy_version'),
           termination_evidence = runledger._completed_evidence(
             (select count(*) from runledger.steps s where s.run_id = r.run_id), r, e.value->'verification')
      from jsonb_array_elements(p_items) with ordinality e
     where (e.ordinality - 1)::int = any(v_fast) and e.value->>'op' = 'complete'
       -- By run_id alone: the completions drive the join (a function scan, estimated at one
       -- row whatever the statistics say), each finding its run by the primary key. With
       -- `and r.run_id = any(v_ids)` too, every probe sorted the whole array again (its
       -- index condition is prepared per probe).
       and r.run_id = e.value->>'run_id'
    returning r.run_id, r.fencing_token, r.parent_run_id, r.queue_name, r.termination_evidence
  ), logged as (
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    select d.run_id, 'completed',
           jsonb_strip_nulls(jsonb_build_object('status', 'SUCCEEDED', 'reason', 'COMPLETED', 'error', null, 'evidence', d.termination_evidence)),
           d.fencing_token, v_now
      from done d
  )
  select array_agg(d.parent_run_id) filter (where d.parent_run_id is not null),
         array_agg(d.run_id) filter (where d.parent_run_id is not null),
         array_agg(distinct d.queue_name),
         array_agg(d.run_id)
    into v_parents, v_children, freed_queues, v_done
    from done d;
  -- As _finished: tell the callers awaiting these runs (one notification for the batch) and
  -- wake the parents; the batch admits the next runs of their queues at its end.
  if v_done is not null then
    perform runledger._announce_finished(v_done);
  end if;
  for i in 1 .. coalesce(cardinality(v_parents), 0) loop
    perform runledger._wake(v_parents[i], 'child', v_children[i]);
  end loop;
  written := v_fast;
end;
$$;
comment on function runledger._commit_fast(jsonb) is
  'The fast part of _commit_batch: locks every run of the batch in run_id order, then writes together the items that are plain checkpoints or completions with their last step of RUNNING runs under their token, before the deadline, with no charge or one within every limit (_charge_fits; it is added to the run''s budgets), without a no-progress limit (the checks _checkpoint and _complete_with_checkpoint make). Returns the indexes it wrote and the queues of the runs it completed (the batch admits them at its end); raises (and is undone as a whole) when one of them cannot be written.';

create function runledger._commit_items(p_items jsonb)
returns table (item int, code text, message text, run_status text, admit_queues text[])
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_item jsonb;
  v_index int := 0;
  v_run runledger.runs;
  v_fast int[] := '{}';
  v_fast_queues text[];
  v_covered text[] := '{}';
  v_careful_completions boolean;
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003', message = format('_commit_batch: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  if jsonb_array_length(p_items) > 1 then
    begin
      select f.written, f.freed_queues into v_fast, v_fast_queues from runledger._commit_fast(p_items) f;
      v_fast := coalesce(v_fast, '{}');
    exception when others then
      v_fast := '{}'; -- undone: every item takes the careful path below
      v_fast_queues := null;
    end;
  end if;
  -- A completion on the careful path admits its queue's next runs itself (_finished), after
  -- the fast part, so its round also refills what the fast part freed; the caller admits the
  -- other queues of the fast completions at its end. Before several completions take queue
  -- locks one by one, the queues of every completion are locked in name order, as the end
  -- locks them (_admit_queues), so two batches cannot wait on each other in a cycle.
  if cardinality(v_fast) < jsonb_array_length(p_items) and jsonb_array_length(p_items) > 1 then
    select bool_or(e.value->>'op' = 'complete' and (e.ord - 1)::int <> all(v_fast)) into v_careful_completions
      from jsonb_array_elements(p_items) with ordinality e(value, ord);
  end if;
  if v_careful_completions then
    perform 1 from runledger.queues q
     where q.name in (select r.queue_name from runledger.runs r
                       where r.run_id in (select e.value->>'run_id' from jsonb_array_elements(p_items) e where e.value->>'op' = 'complete'))
       and runledger._queue_limited(q.name)
     order by q.name
     for update of q;
  end if;
  for v_item in select value from jsonb_array_elements(p_items) loop
    item := v_index;
    code := null;
    message := null;
    run_status := null;
    admit_queues := null;
    if v_index = any(v_fast) then
      run_status := case when v_item->>'op' = 'checkpoint' then 'RUNNING' else 'SUCCEEDED' end;
    else
      begin
        if v_item->>'op' = 'checkpoint' then
          v_run := runledger._checkpoint_row(v_item->>'run_id', (v_item->>'token')::bigint, (v_item->>'seq')::int,
            v_item->>'name', v_item->>'kind', v_item->>'status', v_item->'output', v_item->'error',
            (v_item->>'attempts')::int, (v_item->>'started_ms_ago')::bigint, v_item->'charge');
          run_status := v_run.status;
        elsif v_item->>'op' = 'complete' and v_item ? 'seq' then
          perform runledger._complete_with_checkpoint(v_item->>'run_id', (v_item->>'token')::bigint, (v_item->>'seq')::int,
            v_item->>'name', v_item->>'kind', v_item->>'status', v_item->'step_output', v_item->'error',
            (v_item->>'attempts')::int, (v_item->>'started_ms_ago')::bigint, v_item->'charge',
            v_item->'output', v_item->>'policy_version', v_item->'verification');
        elsif v_item->>'op' = 'complete' then
          perform runledger._complete_run(v_item->>'run_id', (v_item->>'token')::bigint, v_item->'output',
            v_item->>'policy_version', v_item->'charge', v_item->'verification');
        else
          raise exception using errcode = 'RL003', message = format('_commit_batch: unknown op %L', v_item->>'op');
        end if;
        if v_item->>'op' = 'complete' then
          -- SUCCEEDED, or how the completion ended the run instead (a charge past its budget).
          select r.status into run_status from runledger.runs r where r.run_id = v_item->>'run_id';
        end if;
        if run_status not in ('RUNNING', 'CANCELLING') then
          -- The run left its slot, and the write that ended it admitted its queue (_finished).
          v_covered := v_covered || (select r.queue_name from runledger.runs r where r.run_id = v_item->>'run_id');
        end if;
      exception when others then
        code := sqlstate;
        message := sqlerrm;
      end;
    end if;
    return next;
    v_index := v_index + 1;
  end loop;
  -- The closing row: the queues whose slots the fast part freed and no round covered since.
  item := null;
  code := null;
  message := null;
  run_status := null;
  admit_queues := array(select q from unnest(v_fast_queues) q where q <> all(v_covered));
  return next;
end;
$$;
comment on function runledger._commit_items(jsonb) is
  'The items of a group commit (_commit_batch, _commit_and_claim), in one transaction: the common ones together (_commit_fast), the others one by one, each in a subtransaction (a completion there ends its run through _finished, which admits its queue, after the fast part, so that round covers the fast completions of the queue too). One row per item: its index, the SQLSTATE and message of its error (null when it committed) and the run''s status after it; then a closing row with item null and admit_queues, the queues whose slots the fast part freed and no round has covered, for the caller to admit at its end.';

create function runledger._commit_batch(p_items jsonb)
returns table (item int, code text, message text, run_status text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_row    record;
  v_queues text[];
begin
  for v_row in select * from runledger._commit_items(p_items) loop
    if v_row.item is null then
      v_queues := v_row.admit_queues;
      continue;
    end if;
    item := v_row.item;
    code := v_row.code;
    message := v_row.message;
    run_status := v_row.run_status;
    return next;
  end loop;
  -- Slots freed by the fast completions are refilled once per queue, at the end.
  perform runledger._admit_queues(v_queues);
end;
$$;
comment on function runledger._commit_batch(jsonb) is
  'Group commit for a worker: a JSON array of items, each {"op": "checkpoint"} (the arguments of _checkpoint by name: run_id, token, seq, name, kind, status, output, error, attempts, started_ms_ago, charge (absent when none)) or {"op": "complete"} (those of _complete_run, or of _complete_with_checkpoint when it has "seq"; the step''s result is "step_output"; "verification" the evidence of the workflow''s verify), done in one transaction: the common ones together (_commit_fast), the others one by one, each in a subtransaction. One row per item: its index, the SQLSTATE and message of its error (null when it committed), and the run''s status after it (a completion: SUCCEEDED, or the status a charge past the budget ended it with).';

create function runledger._commit_and_claim(
  p_items jsonb, p_worker_id text, p_queues text[], p_workflows text[], p_limit int, p_lease_ms int)
returns table (
  item int, code text, message text, run_status text,
  run_id text, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb,
  cancel_requested boolean, checkpoints jsonb, progress jsonb, next_due_in_ms bigint,
  traceparent text, execution_traceparent text, lineage_id text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_row      record;
  v_queues   text[];
  v_deferred jsonb;
begin
  -- The items' rows (the claim's columns null).
  for v_row in select * from runledger._commit_items(p_items) loop
    if v_row.item is null then
      v_queues := v_row.admit_queues;
      continue;
    end if;
    item := v_row.item;
    code := v_row.code;
    message := v_row.message;
    run_status := v_row.run_status;
    return next;
  end loop;
  -- The admission rounds of the slots the commit freed choose their runs but leave them to
  -- the claim below: a run it takes is written once, from PENDING to RUNNING; the rest are
  -- admitted at the end.
  v_deferred := runledger._admit_queues(v_queues, true);
  begin
    -- Rows as _claim_batch returns them (a claimed run each, and the row with only
    -- next_due_in_ms when fewer than p_limit were claimed), with item null.
    return query select null::int, null::text, null::text, null::text,
                        c.run_id, c.workflow_name, c.workflow_version, c.input, c.fencing_token,
                        c.recovery_attempts, c.max_steps, c.budget, c.budget_spent, c.budget_limits, c.budget_used,
                        c.cancel_requested, c.checkpoints, c.progress, c.next_due_in_ms,
                        c.traceparent, c.execution_traceparent, c.lineage_id
                   from runledger._claim_batch(p_worker_id, p_queues, p_workflows, p_limit, p_lease_ms, p_deferred => v_deferred) c;
  exception when others then
    -- The items stand; only the claim is lost (its runs stay claimable).
    return query select null::int, sqlstate::text, sqlerrm, null::text,
                        null::text, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb, null::boolean, null::jsonb, null::jsonb,
                        null::bigint, null::text, null::text, null::text;
  end;
  -- After the claim or its failure (which undid only what the claim did).
  perform runledger._admit_deferred(v_deferred);
end;
$$;
comment on function runledger._commit_and_claim(jsonb, text, text[], text[], int, int) is
  'Group commit (_commit_items) and then a claim (_claim_batch) in one transaction; the admission rounds of the slots the commit freed (_admit_queues) hand their runs to the claim (p_deferred), which takes what it can from PENDING straight to RUNNING, and _admit_deferred admits the rest. Rows with item set answer the items; rows with item null carry the claim''s rows in _claim_batch''s columns, or, when the claim failed, its SQLSTATE and message in code and message (the items are committed regardless).';

insert into runledger.migrations (version, name) values (5, '0005_steps_and_commit');
