-- 0018_debounce: starts that collapse. A start with the option debounce {key, delay_ms} is a
-- run delayed by delay_ms that carries the key; another such start of the same workflow and
-- key, while that run has not started, gives that run the new input and delays it again by
-- delay_ms from now, and returns its id. So a burst of starts closer together than the delay
-- becomes one run, with the last input, delay_ms after the last start (a trailing debounce);
-- with max_wait_ms, no later than that after the burst's first start, so that a burst that
-- never pauses still runs.
--
-- columns: runs.debounce_key
-- indexes: runs_debounce_pending (per workflow, key and tenant)
-- redefines: start_run
-- functions: _start_debounced

alter table runledger.runs add column debounce_key text collate "C";
comment on column runledger.runs.debounce_key is
  'The debounce key of a run started with the start option debounce (start_run): while the run has not started, starts of the same workflow with this key collapse into it (its input replaced, its start delayed again).';

-- At most one run per workflow and key waits to start; it is also how a start finds it.
create unique index runs_debounce_pending on runledger.runs (workflow_name, debounce_key, tenant_id) nulls not distinct
  where debounce_key is not null and status = 'PENDING' and started_at is null;

create function runledger._start_debounced(p_workflow text, p_input jsonb, p_options jsonb)
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_debounce jsonb := p_options->'debounce';
  v_key      text;
  v_ms       numeric;
  v_run      runledger.runs;
  v_t        runledger.runs;
  v_not_before timestamptz;
  v_max_wait numeric;
begin
  if jsonb_typeof(v_debounce) is distinct from 'object' or jsonb_typeof(v_debounce->'key') is distinct from 'string'
     or jsonb_typeof(v_debounce->'delay_ms') is distinct from 'number'
     or (v_debounce ? 'max_wait_ms' and jsonb_typeof(v_debounce->'max_wait_ms') is distinct from 'number')
     or (v_debounce - 'key' - 'delay_ms' - 'max_wait_ms') <> '{}' then
    raise exception using errcode = 'RL003',
      message = format('start_run(%s): debounce must be {"key": text, "delay_ms": number, "max_wait_ms": number (optional)}, not %s', p_workflow, v_debounce);
  end if;
  v_key := v_debounce->>'key';
  v_ms := (v_debounce->>'delay_ms')::numeric;
  if length(v_key) not between 1 and 200 then
    raise exception using errcode = 'RL003', message = format('start_run(%s): the debounce key must be 1 to 200 characters', p_workflow);
  end if;
  if p_options ?| array['run_at', 'run_in_ms', 'run_id', 'idempotency_key'] then
    raise exception using errcode = 'RL003',
      message = format('start_run(%s): debounce decides the run''s id and start time: it does not go with run_at, run_in_ms, run_id or idempotency_key', p_workflow);
  end if;
  -- The run a plain start would make (its options checked, its tenant decided): a key is the
  -- tenant's own, and a start never changes another tenant's run.
  v_t := runledger._start_template(p_workflow, p_options - 'debounce');
  -- Checks the delay (0 to 2^53 - 1 ms) before anything is written.
  v_not_before := runledger._ms_after(runledger.now(), v_ms, format('start_run(%s): debounce delay_ms', p_workflow));
  if v_debounce ? 'max_wait_ms' then
    v_max_wait := (v_debounce->>'max_wait_ms')::numeric;
    perform runledger._ms_after(runledger.now(), v_max_wait, format('start_run(%s): debounce max_wait_ms', p_workflow));
    if v_max_wait < v_ms then
      raise exception using errcode = 'RL003',
        message = format('start_run(%s): debounce max_wait_ms (%s) is shorter than delay_ms (%s)', p_workflow, v_max_wait, v_ms);
    end if;
  end if;
  -- Starts of one key take turns: the second finds the first's run.
  perform pg_advisory_xact_lock(hashtextextended(format('runledger.debounce:%s:%s:%s', p_workflow, v_t.tenant_id, v_key), 0));
  select * into v_run from runledger.runs r
   where r.workflow_name = p_workflow and r.debounce_key = v_key and r.tenant_id is not distinct from v_t.tenant_id
     and r.status = 'PENDING' and r.started_at is null
   for update;
  if found then
    -- A burst that never pauses for delay_ms still starts its run: at most max_wait_ms after
    -- the burst's first start (the run's creation).
    if v_max_wait is not null then
      v_not_before := least(v_not_before, runledger._ms_after(v_run.created_at, v_max_wait, 'debounce max_wait_ms'));
    end if;
    if pg_column_size(p_input) > runledger._max_payload_bytes() then
      raise exception using errcode = 'RL004',
        message = format('start_run: input is %s bytes, over the limit of %s', pg_column_size(p_input), runledger._max_payload_bytes());
    end if;
    update runledger.runs set input = p_input, not_before = v_not_before, updated_at = runledger.now()
     where run_id = v_run.run_id;
    insert into runledger.events (run_id, kind, detail)
    values (v_run.run_id, 'debounced', jsonb_build_object('key', v_key, 'not_before', v_not_before));
    perform runledger._dispatch(v_run.run_id, v_run.queue_name,
      greatest(0, ceil(extract(epoch from v_not_before - runledger.now()) * 1000))::bigint);
    return v_run.run_id;
  end if;
  v_run := (runledger._start(p_workflow, p_input, (p_options - 'debounce') || jsonb_build_object('run_in_ms', ceil(v_ms)::bigint))).run;
  update runledger.runs set debounce_key = v_key where run_id = v_run.run_id;
  return v_run.run_id;
end;
$$;
comment on function runledger._start_debounced(text, jsonb, jsonb) is
  'start_run with the option debounce {key, delay_ms, max_wait_ms}: the run of this workflow, key and tenant that has not started yet (PENDING, never claimed) gets the new input and starts delay_ms from now instead, but no later than max_wait_ms after it was created when given (event debounced), and its id is returned; else a new run, delayed by delay_ms, carrying the key. Starts of one key are serialised by an advisory lock. RL003 for a malformed debounce (max_wait_ms below delay_ms included), or with run_at, run_in_ms, run_id or idempotency_key.';

create or replace function runledger.start_run(p_workflow text, p_input jsonb, p_options jsonb default '{}')
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_options ? 'debounce' then
    return runledger._start_debounced(p_workflow, p_input, p_options);
  end if;
  return (runledger._start(p_workflow, p_input, p_options)).run.run_id;
end;
$$;
comment on function runledger.start_run(text, jsonb, jsonb) is
  'Starts a run of a registered workflow and dispatches it (or leaves it to its queue''s admission); returns run_id. Options: run_at (delayed start at a timestamp, compared with runledger.now()) or run_in_ms (delayed start this many ms after now on the database clock), run_id, idempotency_key (same key or run_id returns the existing run), queue, priority, concurrency_key, version, max_recovery_attempts, limits overriding the workflow''s: deadline (interval or timestamp), max_steps, budget, no_progress; traceparent (a W3C traceparent the run''s executions are traced under, see runs.traceparent); notify (default true): false starts an immediately runnable run without waking the queue''s workers by NOTIFY, for a caller whose own worker claims it (engine.start does so when its process''s worker has a free slot; other workers find the run at their next poll); and debounce {key, delay_ms, max_wait_ms}: starts of the workflow with the same key collapse into one run that starts delay_ms after the last of them (no later than max_wait_ms after the first, when given), with its input (_start_debounced). An unknown option is RL003 (naming it and the known ones), as are run_at or a deadline that is not a finite time PostgreSQL holds (infinity, -infinity, unparsable text) and run_in_ms outside 0 to 2^53 - 1.';

-- The new function loses PUBLIC's execute; start_run, redefined, is SECURITY DEFINER again.
select runledger._secure_functions();

insert into runledger.migrations (version, name) values (18, '0018_debounce');
