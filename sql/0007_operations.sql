-- 0007_operations: the operation ledger, step retries and heartbeats, compensations.
--
-- tables: operations, step_progress
-- indexes: operations_idempotency_key, operations_unknown
-- functions: _operation_begin, _operation_finish, _operation_park, _resolve_operation, _record_retry,
--   _retry_wait, _heartbeat_step, _compensation_fence, _compensations_due, _compensation_summary,
--   _compensation_begin, _compensation_finish, _compensate_run, _operation_checkpoint, _undone_operations,
--   _undone_refusal

create table runledger.operations (
  operation_id         text collate "C" primary key,
  run_id               text collate "C" not null references runledger.runs (run_id) on delete cascade,
  seq                  int not null,
  name                 text collate "C" not null,
  idempotency_key      text collate "C" not null,
  status               text collate "C" not null check (status in ('PLANNED', 'STARTED', 'SUCCEEDED', 'FAILED', 'UNKNOWN')),
  external_resource_id text collate "C",
  result               jsonb,
  error                jsonb,
  attempts             int not null default 1,
  compensable          boolean not null default false,
  compensation_status  text collate "C" check (compensation_status in ('STARTED', 'DONE', 'FAILED')),
  compensation_error   jsonb,
  started_at           timestamptz not null default runledger.now(),
  updated_at           timestamptz not null default runledger.now(),
  finished_at          timestamptz,
  resolved_by          text collate "C",
  -- A fork's row under a key an ancestor run (fork_run) already used: the ancestor's
  -- operation it reused (SUCCEEDED) or attempts again. Not a foreign key: prune may
  -- delete the ancestor, and the fork's row keeps its history.
  prior_operation_id   text collate "C",
  unique (run_id, seq)
);
comment on table runledger.operations is
  'Operation ledger: one row per external side effect (ctx.operation). STARTED (with its idempotency key) commits before the call; SUCCEEDED or FAILED commits with the step checkpoint; a STARTED row found on replay is UNKNOWN until reconcile, an idempotent retry or an operator (resolve_operation) settles it. An idempotency key is unique, except in the forks of the run that used it (prior_operation_id); retry_run puts a FAILED one back to PLANNED (attempts 0), to be called again with the same key.';
comment on column runledger.operations.prior_operation_id is
  'In a fork (fork_run): the operation of an ancestor run with the same idempotency key. The fork reused its result (status SUCCEEDED, attempts 0, event operation_reused) or, when it had not succeeded, made a new attempt under the same key (event operation_attempted_by_fork on the ancestor).';

-- An idempotency key is used by one operation, except by the forks of the run that used
-- it: their rows name that operation (prior_operation_id).
create unique index operations_idempotency_key on runledger.operations (idempotency_key) where prior_operation_id is null;

create index operations_unknown on runledger.operations (updated_at) where status = 'UNKNOWN';

create table runledger.step_progress (
  run_id     text collate "C" not null references runledger.runs (run_id) on delete cascade,
  seq        int not null,
  progress   jsonb,
  updated_at timestamptz not null default runledger.now(),
  primary key (run_id, seq)
);
comment on table runledger.step_progress is
  'Last progress a long step reported with ctx.heartbeat (e.g. a cursor); the attempt that takes over the step reads it to continue instead of starting over.';

create function runledger._operation_begin(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_key text, p_compensable boolean, p_again boolean)
returns table (operation_id text, status text, attempts int, idempotency_key text, result jsonb, error jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run   runledger.runs := runledger._fence(p_run_id, p_token);
  v_op    runledger.operations;
  v_prior runledger.operations;
  v_now   timestamptz := runledger.now();
begin
  select * into v_op from runledger.operations o where o.run_id = p_run_id and o.seq = p_seq for update;
  if not found then
    if v_run.version_manifest ? 'forked_from' then
      -- A fork: has a run it descends from used this key? A succeeded (and not compensated)
      -- operation is reused; otherwise the newest one, nearest ancestor first, is attempted again.
      with recursive lineage (run_id, depth) as (
        select v_run.version_manifest->>'forked_from', 1
        union all
        select r.version_manifest->>'forked_from', l.depth + 1
          from lineage l join runledger.runs r on r.run_id = l.run_id
         where r.version_manifest ? 'forked_from' and l.depth < 1000)
      select o.* into v_prior
        from lineage l join runledger.operations o on o.run_id = l.run_id
       where o.idempotency_key = p_key
       order by (o.status = 'SUCCEEDED' and o.compensation_status is null) desc, l.depth, o.started_at desc
       limit 1;
    end if;
    if v_prior.operation_id is not null and v_prior.status = 'SUCCEEDED' and v_prior.compensation_status is null then
      -- The key says the effect happened once: the fork gets its result without a call. The
      -- effect stays the ancestor's, so the fork does not compensate it (compensable false).
      insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, external_resource_id, result,
                                        attempts, compensable, finished_at, prior_operation_id)
      values (runledger._new_id(), p_run_id, p_seq, p_name, p_key, 'SUCCEEDED', v_prior.external_resource_id, v_prior.result,
              0, false, v_now, v_prior.operation_id)
      returning * into v_op;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (p_run_id, 'operation_reused', jsonb_build_object('operation_id', v_op.operation_id, 'name', p_name, 'key', p_key,
              'from_operation_id', v_prior.operation_id, 'from_run_id', v_prior.run_id), p_token, v_now);
    else
      insert into runledger.operations (operation_id, run_id, seq, name, idempotency_key, status, compensable, prior_operation_id)
      values (runledger._new_id(), p_run_id, p_seq, p_name, p_key, 'STARTED', p_compensable, v_prior.operation_id)
      returning * into v_op;
      insert into runledger.events (run_id, kind, detail, fencing_token, at)
      values (p_run_id, 'operation_started', jsonb_strip_nulls(jsonb_build_object('operation_id', v_op.operation_id, 'name', p_name,
              'key', p_key, 'prior_operation_id', v_prior.operation_id)), p_token, v_now);
      if v_prior.operation_id is not null then
        -- The ancestor's ledger shows that its key was used again, and by whom.
        insert into runledger.events (run_id, kind, detail, at)
        values (v_prior.run_id, 'operation_attempted_by_fork', jsonb_build_object('operation_id', v_prior.operation_id,
                'status', v_prior.status, 'fork', p_run_id, 'fork_operation_id', v_op.operation_id), v_now);
      end if;
    end if;
  elsif (p_again and v_op.status in ('STARTED', 'UNKNOWN', 'FAILED')) or v_op.status = 'PLANNED' then
    -- Called again on purpose (declared idempotent, a retry, or PLANNED again by retry_run): same key, next attempt.
    update runledger.operations o set status = 'STARTED', attempts = o.attempts + 1, updated_at = v_now, error = null
     where o.operation_id = v_op.operation_id returning * into v_op;
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (p_run_id, 'operation_retried', jsonb_build_object('operation_id', v_op.operation_id, 'attempt', v_op.attempts), p_token, v_now);
  elsif v_op.status = 'STARTED' then
    -- Started by an execution that never recorded the outcome: it may or may not have happened.
    update runledger.operations o set status = 'UNKNOWN', updated_at = v_now where o.operation_id = v_op.operation_id returning * into v_op;
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (p_run_id, 'operation_unknown', jsonb_build_object('operation_id', v_op.operation_id, 'name', p_name, 'key', v_op.idempotency_key), p_token, v_now);
    return query select v_op.operation_id, 'UNKNOWN_NOW'::text, v_op.attempts, v_op.idempotency_key, v_op.result, v_op.error;
    return;
  end if;
  return query select v_op.operation_id, v_op.status, v_op.attempts, v_op.idempotency_key, v_op.result, v_op.error;
end;
$$;
comment on function runledger._operation_begin(text, bigint, int, text, text, boolean, boolean) is
  'Fenced. First call: records the intent (STARTED, key, attempt 1) and commits before the external call; in a fork whose ancestor used the key, reuses its SUCCEEDED result (no call) or links the new attempt to it (prior_operation_id). A key another run used raises 23505. On replay a STARTED row becomes UNKNOWN (status UNKNOWN_NOW, with an event). p_again, or a PLANNED row (put back by retry_run): the caller will call again with the same key (STARTED, attempt + 1). Otherwise returns the row as it stands.';

create function runledger._operation_finish(
  p_run_id text, p_token bigint, p_operation_id text, p_status text, p_result jsonb, p_error jsonb,
  p_external_resource_id text, p_resolved_by text)
returns void
language plpgsql volatile as $$
begin
  perform runledger._fence(p_run_id, p_token);
  update runledger.operations
     set status = p_status, result = p_result, error = p_error, updated_at = runledger.now(), finished_at = runledger.now(),
         external_resource_id = coalesce(p_external_resource_id, external_resource_id),
         resolved_by = coalesce(p_resolved_by, resolved_by)
   where operation_id = p_operation_id and run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'operation_' || lower(p_status),
          jsonb_strip_nulls(jsonb_build_object('operation_id', p_operation_id, 'resolved_by', p_resolved_by, 'error', p_error)), p_token);
end;
$$;
comment on function runledger._operation_finish(text, bigint, text, text, jsonb, jsonb, text, text) is
  'Fenced: records an operation''s outcome; called in the same transaction as the step checkpoint that follows it.';

create function runledger._operation_park(p_run_id text, p_token bigint, p_seq int, p_operation_id text, p_retry_in_ms bigint)
returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_retry_in_ms, '_operation_park: p_retry_in_ms');
begin
  -- Never a silent retry of a call that may have happened: the run waits (holding nothing)
  -- for resolve_operation, or until the next reconcile attempt when a reconciler said "unknown".
  update runledger.runs
     set status = 'WAITING', wait_kind = 'reconcile', wait_key = p_operation_id, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'waiting_for_reconcile', jsonb_build_object('operation_id', p_operation_id, 'seq', p_seq, 'retry_in_ms', p_retry_in_ms), p_token);
  if least(v_wake, v_run.deadline_at) is not null then
    perform runledger._dispatch(p_run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
  end if;
end;
$$;
comment on function runledger._operation_park(text, bigint, int, text, bigint) is
  'Fenced: an UNKNOWN operation that cannot be settled automatically parks the run WAITING (wait_kind reconcile) until resolve_operation, or until p_retry_in_ms for the next reconcile.';

create function runledger._resolve_operation(p_operation_id text, p_status text, p_result jsonb default null, p_resolved_by text default null)
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

create function runledger._record_retry(p_run_id text, p_token bigint, p_seq int, p_name text, p_attempt int, p_error jsonb, p_delay_ms bigint)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs := runledger._fence(p_run_id, p_token);
begin
  if v_run.retry_budget is not null and v_run.retries_used + 1 > v_run.retry_budget then
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'retry_budget_exhausted', jsonb_build_object('seq', p_seq, 'name', p_name, 'attempt', p_attempt,
            'retries_used', v_run.retries_used, 'retry_budget', v_run.retry_budget, 'error', p_error), p_token);
    return false;
  end if;
  update runledger.runs set retries_used = retries_used + 1 where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'attempt_failed', jsonb_build_object('seq', p_seq, 'name', p_name, 'attempt', p_attempt, 'error', p_error,
          'retry_in_ms', p_delay_ms), p_token);
  return true;
end;
$$;
comment on function runledger._record_retry(text, bigint, int, text, int, jsonb, bigint) is
  'Fenced: records a failed attempt of a step (its error and the backoff before the next) and spends one retry of the run''s retry budget; false when the budget is used up (the step then fails).';

create function runledger._retry_wait(p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_attempt int, p_delay_ms bigint)
returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run  runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_delay_ms, '_retry_wait: p_delay_ms');
begin
  -- The step position keeps a WAITING row with the attempt reached; the next attempt after
  -- the backoff reads it. The worker is freed meanwhile.
  insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
  values (p_run_id, p_seq, p_name, p_kind, 'WAITING', jsonb_build_object('attempt', p_attempt, 'wake_at', v_wake), p_attempt,
          runledger.now(), runledger.now(), p_token)
  on conflict (run_id, seq) do update set output = excluded.output, attempts = excluded.attempts, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING';
  update runledger.runs
     set status = 'WAITING', wait_kind = 'retry', wait_key = p_name, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  perform runledger._slot_freed(p_run_id);
  perform runledger._dispatch(p_run_id, v_run.queue_name,
    greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
end;
$$;
comment on function runledger._retry_wait(text, bigint, int, text, text, int, bigint) is
  'Fenced: a backoff too long to sleep in memory becomes a durable wait (wait_kind retry): the step keeps a WAITING row with the attempt reached and the run waits, holding no worker, until the next attempt is due.';

create function runledger._heartbeat_step(p_run_id text, p_token bigint, p_seq int, p_progress jsonb, p_lease_ms int)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  perform runledger._lock_executing(p_run_id, p_token);
  update runledger.runs set lease_expires_at = runledger.now() + make_interval(secs => p_lease_ms / 1000.0)
   where run_id = p_run_id
  returning * into v_run;
  if p_progress is not null then
    insert into runledger.step_progress (run_id, seq, progress) values (p_run_id, p_seq, p_progress)
    on conflict (run_id, seq) do update set progress = excluded.progress, updated_at = runledger.now();
  end if;
  return v_run.status;
end;
$$;
comment on function runledger._heartbeat_step(text, bigint, int, jsonb, int) is
  'Fenced: a long step proves it is alive: renews its run''s lease and stores its progress. Returns the run status (CANCELLING tells the step to stop).';

-- Compensations are fenced by the token and the lease, not the deadline: the undo of a
-- run's effects may still be recorded once its deadline has passed.
create function runledger._compensation_fence(p_run_id text, p_token bigint) returns void
language plpgsql volatile as $$
begin
  if (runledger._lock_executing(p_run_id, p_token)).lease_owner is null then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing)', p_run_id, p_token);
  end if;
end;
$$;
comment on function runledger._compensation_fence(text, bigint) is
  'The fence of compensation writes: the run (locked until commit) still carries fencing token p_token, is RUNNING or CANCELLING and is owned (a stopping run handed to the next claim is not); no deadline check. Else RL001.';

create function runledger._compensations_due(p_run_id text) returns boolean
language sql stable as $$
  select exists (select 1 from runledger.operations o
                  where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED'
                    and (o.compensation_status is null or o.compensation_status = 'STARTED'))
$$;
comment on function runledger._compensations_due(text) is
  'True when the run has a succeeded compensable operation whose compensation has not run (or was cut short by a crash: STARTED).';

create function runledger._compensation_summary(p_run_id text) returns jsonb
language sql stable as $$
  select jsonb_build_object(
           'done', count(*) filter (where o.compensation_status = 'DONE'),
           'failed', coalesce(jsonb_agg(o.name order by o.seq) filter (where o.compensation_status = 'FAILED'), '[]'),
           'not_run', coalesce(jsonb_agg(o.name order by o.seq)
                                 filter (where o.compensation_status is null or o.compensation_status = 'STARTED'), '[]'))
    from runledger.operations o
   where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED'
$$;
comment on function runledger._compensation_summary(text) is
  'The compensations of a run''s succeeded operations: how many are DONE, and the names of those FAILED and of those not run (a replay that stopped before reaching them, or recovery that gave up).';

create function runledger._compensation_begin(p_run_id text, p_token bigint, p_operation_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_status text;
  v_reused boolean;
begin
  perform runledger._compensation_fence(p_run_id, p_token);
  select compensation_status, prior_operation_id is not null and attempts = 0 into v_status, v_reused
    from runledger.operations where operation_id = p_operation_id and run_id = p_run_id for update;
  if not found then
    -- A checkpoint copied by fork_run: the operation belongs to the source run, not to this one.
    return 'NOT_THIS_RUN';
  end if;
  if v_reused then
    -- A fork reused an ancestor's result: the effect is the ancestor's, not undone by the fork.
    return 'REUSED';
  end if;
  if v_status is null or v_status = 'STARTED' then
    update runledger.operations set compensation_status = 'STARTED', updated_at = runledger.now() where operation_id = p_operation_id;
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'compensation_started', jsonb_build_object('operation_id', p_operation_id, 'again', v_status is not null), p_token);
    return 'STARTED';
  end if;
  return v_status; -- DONE or FAILED: never run again
end;
$$;
comment on function runledger._compensation_begin(text, bigint, text) is
  'Fenced by _compensation_fence: records that an operation''s compensation starts (a STARTED one left by a crash is run again with the same key); returns DONE or FAILED when it already ran, NOT_THIS_RUN or REUSED for an operation that belongs to an ancestor run (fork_run).';

create function runledger._compensation_finish(p_run_id text, p_token bigint, p_operation_id text, p_ok boolean, p_error jsonb) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  perform runledger._compensation_fence(p_run_id, p_token);
  update runledger.operations set compensation_status = case when p_ok then 'DONE' else 'FAILED' end, compensation_error = p_error,
         updated_at = runledger.now()
   where operation_id = p_operation_id and run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, case when p_ok then 'compensated' else 'compensation_failed' end,
          jsonb_strip_nulls(jsonb_build_object('operation_id', p_operation_id, 'error', p_error)), p_token);
end;
$$;
comment on function runledger._compensation_finish(text, bigint, text, boolean, jsonb) is
  'Fenced by _compensation_fence: records a compensation''s outcome, DONE, or FAILED once the worker''s bounded retries are spent (p_error then has the last error and the attempts).';

-- An operator's way to undo a finished run's effects, or to try a failed compensation
-- again: the run is stopping again (CANCELLING, with its own terminal record set aside),
-- a worker serving its workflow version claims it, replays its history without running a
-- new step, runs the compensations not DONE, and the run ends with the record it had.
create function runledger._compensate_run(p_run_id text, p_reason text default null) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run   runledger.runs;
  v_reset jsonb;
begin
  select * into v_run from runledger.runs where run_id = p_run_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('compensate_run: run %L not found', p_run_id);
  end if;
  if v_run.status = 'CANCELLING' then
    return 'CANCELLING'; -- its compensations are already being run
  end if;
  if v_run.status not in ('FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER') then
    raise exception using errcode = 'RL005',
      message = format('compensate_run: run %s is %s; only FAILED, CANCELLED, TERMINATED and DEAD_LETTER runs are compensated this way%s',
                       p_run_id, v_run.status,
                       case when v_run.status = 'SUCCEEDED' then ' (a run that succeeded did its work: its effects are not undone)'
                            else ' (cancel_run stops a run that has not finished and runs its compensations)' end);
  end if;
  -- A compensation recorded FAILED is tried again (with the same key, <key>:compensate);
  -- the failure it held is kept in the event.
  select jsonb_agg(jsonb_build_object('operation_id', o.operation_id, 'name', o.name, 'error', o.compensation_error) order by o.seq)
    into v_reset
    from runledger.operations o
   where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED' and o.compensation_status = 'FAILED';
  update runledger.operations o
     set compensation_status = null, compensation_error = null, updated_at = runledger.now()
   where o.run_id = p_run_id and o.compensable and o.status = 'SUCCEEDED' and o.compensation_status = 'FAILED';
  if not runledger._compensations_due(p_run_id) then
    return v_run.status; -- nothing to undo: every compensation is DONE, or the run has none
  end if;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'compensation_requested',
          jsonb_strip_nulls(jsonb_build_object('reason', p_reason, 'status', v_run.status, 'retried', v_reset)), v_run.fencing_token);
  perform runledger._stop_for_compensations(v_run, v_run.status, v_run.termination_reason, v_run.termination_evidence,
                                            v_run.error, false);
  return 'CANCELLING';
end;
$$;
comment on function runledger._compensate_run(text, text) is
  'The action behind runledger.compensate_run (which records it in audit_log): Operator action: runs the compensations of a FAILED, CANCELLED, TERMINATED or DEAD_LETTER run that are not DONE (a FAILED one is tried again). The run becomes CANCELLING without an owner; a worker serving its workflow version claims it, replays its checkpoints (no new step runs), runs them newest first, and the run ends with the status and termination record it had (evidence.compensations says which ran). Returns CANCELLING, or the run''s status when nothing is left to compensate. RL005 for a run that is SUCCEEDED or not finished (use cancel_run).';

create function runledger._operation_checkpoint(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_operation_id text, p_status text,
  p_output jsonb, p_error jsonb, p_external_resource_id text, p_attempts int, p_started_ms_ago bigint, p_charge jsonb)
returns table (pid int, run_status text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  -- The outcome in the ledger and the step checkpoint commit together. UNKNOWN: the step fails
  -- (reconcile gave an invalid answer) while the ledger row stays UNKNOWN; the error goes into events.
  if p_status = 'UNKNOWN' then
    insert into runledger.events (run_id, kind, detail, fencing_token)
    values (p_run_id, 'operation_reconcile_invalid', jsonb_build_object('operation_id', p_operation_id, 'name', p_name, 'error', p_error), p_token);
  else
    perform runledger._operation_finish(p_run_id, p_token, p_operation_id, p_status, p_output->'value', p_error, p_external_resource_id, null);
  end if;
  return query select * from runledger._checkpoint(p_run_id, p_token, p_seq, p_name, 'operation',
    case when p_status = 'SUCCEEDED' then 'SUCCEEDED' else 'FAILED' end, p_output, p_error, p_attempts, p_started_ms_ago, p_charge);
end;
$$;
comment on function runledger._operation_checkpoint(text, bigint, int, text, text, text, jsonb, jsonb, text, int, bigint, jsonb) is
  'Fenced: records an operation''s outcome in the ledger and its step checkpoint in one transaction. p_status UNKNOWN (an invalid reconcile answer): the step checkpoint is FAILED with p_error, the ledger row stays UNKNOWN and an operation_reconcile_invalid event holds the error.';

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

insert into runledger.migrations (version, name) values (7, '0007_operations');
