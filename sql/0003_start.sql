-- 0003_start: starting runs: one, many, from the engine with a claim, from SQL.
--
-- functions: _start_template, _start, start_run, start_runs, _start_claimed, _is_traceparent, _start_many

-- What every run started with these options gets, worked out once: the start_run and
-- start_runs options checked (RL003), the workflow version resolved (RL006), limits
-- merged, and the columns a new run row takes from them, as a runs row without an id or
-- input. The caller fills in run_id, input, idempotency_key and parent_run_id.
create function runledger._start_template(p_workflow text, p_options jsonb, p_caller text default 'start_run')
returns runledger.runs
language plpgsql volatile as $$
declare
  v_now      timestamptz := runledger.now();
  v_opts     jsonb := coalesce(p_options, '{}');
  v_version  text := v_opts->>'version';
  v_run_id   text := v_opts->>'run_id';
  v_wf       runledger.workflows;
  v_queue    text;
  v_deadline timestamptz;
  v_not_before timestamptz;
  v_t        runledger.runs;
  -- Every option start_run knows (start_runs' per-input arrays are taken out before this).
  v_known    text[] := array['run_at', 'run_in_ms', 'run_id', 'idempotency_key', 'queue', 'priority', 'concurrency_key',
                             'version', 'max_recovery_attempts', 'deadline', 'max_steps', 'budget', 'no_progress',
                             'retry_budget', 'tenant_id', 'traceparent', 'notify', 'version_manifest', 'parent_run_id'];
begin
  if p_workflow is null then
    raise exception using errcode = 'RL003', message = p_caller || ': workflow name is required';
  end if;
  if jsonb_typeof(v_opts) <> 'object' then
    raise exception using errcode = 'RL003', message = p_caller || ': options must be a JSON object';
  end if;
  -- An option it does not know is refused, not ignored: a misspelt limit would be dropped.
  if v_opts - v_known <> '{}'::jsonb then
    if p_caller = 'start_runs' then
      v_known := array_remove(array_remove(v_known, 'run_id'), 'idempotency_key')
                 || array['run_ids', 'idempotency_keys', 'concurrency_keys'];
    end if;
    raise exception using errcode = 'RL003',
      message = format('%s: unknown option %s (the options are %s)', p_caller,
                       (select string_agg(quote_literal(k), ', ' order by k) from jsonb_object_keys(v_opts - v_known) k),
                       array_to_string(v_known, ', '));
  end if;

  -- A named version (engine.start names its own) is one primary-key lookup; without one,
  -- the version registered last.
  if v_version is not null then
    select * into v_wf from runledger.workflows w where w.workflow_name = p_workflow and w.workflow_version = v_version;
  else
    select * into v_wf from runledger.workflows w where w.workflow_name = p_workflow order by w.registered_at desc limit 1;
  end if;
  if not found then
    raise exception using errcode = 'RL006',
      message = format('%s: workflow %L%s is not registered (start a worker or engine that defines it)', p_caller,
                       p_workflow, coalesce(' version ' || quote_literal(v_version), ''));
  end if;

  v_queue := coalesce(v_opts->>'queue', v_wf.queue_name);
  if v_queue !~ '^[A-Za-z0-9][A-Za-z0-9_.-]*$' or length(v_queue) > 40 then
    raise exception using errcode = 'RL003', message = format('%s: invalid queue name %L', p_caller, v_queue);
  end if;
  if v_run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(v_run_id) > 200 then
    raise exception using errcode = 'RL003', message = format('%s: invalid run_id %L', p_caller, v_run_id);
  end if;
  -- Per-run limits override the workflow's (registered) defaults.
  v_opts := coalesce(v_wf.limits, '{}') || v_opts;
  if v_opts ? 'notify' and jsonb_typeof(v_opts->'notify') <> 'boolean' then
    raise exception using errcode = 'RL003', message = format('%s: notify must be true or false, not %s', p_caller, v_opts->'notify');
  end if;
  if v_opts ? 'priority' and (jsonb_typeof(v_opts->'priority') <> 'number' or (v_opts->>'priority') !~ '^-?\d{1,9}$') then
    raise exception using errcode = 'RL003', message = format('%s: priority must be a whole number, not %s', p_caller, v_opts->'priority');
  end if;
  if v_opts ? 'max_recovery_attempts'
     and (jsonb_typeof(v_opts->'max_recovery_attempts') <> 'number' or (v_opts->>'max_recovery_attempts') !~ '^\d{1,9}$') then
    raise exception using errcode = 'RL003',
      message = format('%s: max_recovery_attempts must be a whole number >= 0, not %s', p_caller, v_opts->'max_recovery_attempts');
  end if;
  -- Most starts give none of these options (engine.start gives version, queue,
  -- max_recovery_attempts, version_manifest, run_id and notify): one test skips their checks.
  if v_opts ?| array['deadline', 'max_steps', 'no_progress', 'retry_budget', 'budget', 'tenant_id', 'traceparent', 'run_at', 'run_in_ms'] then
    if v_opts ? 'deadline' and jsonb_typeof(v_opts->'deadline') <> 'null' then
      -- A date-time ('2030-01-31T12:00Z') is a point in time; anything else ('2 days', '36h') a lifetime.
      if v_opts->>'deadline' ~ '^\d{4}-\d{2}-\d{2}' then
        v_deadline := runledger._instant(v_opts->>'deadline', p_caller || ': deadline');
      else
        begin
          v_deadline := v_now + (v_opts->>'deadline')::interval;
        exception when others then
          raise exception using errcode = 'RL003',
            message = format('%s: deadline %L is neither an interval nor a timestamp (within the times PostgreSQL holds)',
                             p_caller, v_opts->>'deadline');
        end;
        -- PostgreSQL 17 reads 'infinity' as an interval.
        if not isfinite(v_deadline) then
          raise exception using errcode = 'RL003', message = format('%s: deadline %L is not finite', p_caller, v_opts->>'deadline');
        end if;
      end if;
    end if;
    perform runledger._check_whole_number(v_opts, 'max_steps', 1);
    perform runledger._check_whole_number(v_opts, 'no_progress', 2);
    perform runledger._check_whole_number(v_opts, 'retry_budget', 0);
    perform runledger._check_budget_option(v_opts->'budget', p_caller);
    if v_opts ? 'tenant_id' and (jsonb_typeof(v_opts->'tenant_id') <> 'string' or v_opts->>'tenant_id' !~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]*$'
                                 or length(v_opts->>'tenant_id') > 200) then
      raise exception using errcode = 'RL003', message = format('%s: invalid tenant_id %s', p_caller, v_opts->'tenant_id');
    end if;
    if v_opts ? 'traceparent' and jsonb_typeof(v_opts->'traceparent') <> 'null'
       and (jsonb_typeof(v_opts->'traceparent') <> 'string' or not runledger._is_traceparent(v_opts->>'traceparent')) then
      raise exception using errcode = 'RL003',
        message = format('%s: traceparent must be a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>, ids not all zeros), not %s',
                         p_caller, v_opts->'traceparent');
    end if;
    if v_opts ? 'run_at' and v_opts ? 'run_in_ms' then
      raise exception using errcode = 'RL003', message = p_caller || ': give run_at or run_in_ms, not both';
    end if;
    if v_opts ? 'run_at' then
      -- A finite timestamp: 'infinity' would never start, '-infinity' would sort first forever.
      v_not_before := runledger._instant(v_opts->>'run_at', p_caller || ': run_at');
    end if;
    if v_opts ? 'run_in_ms' then
      -- A delay, counted on the database clock from now: a caller's clock does not matter.
      -- An int8 of milliseconds, up to 2^53 - 1 (_ms_after).
      if jsonb_typeof(v_opts->'run_in_ms') <> 'number' or (v_opts->>'run_in_ms') !~ '^\d{1,16}$' then
        raise exception using errcode = 'RL003',
          message = format('%s: run_in_ms must be a whole number of milliseconds >= 0, not %s', p_caller, v_opts->'run_in_ms');
      end if;
      v_not_before := runledger._ms_after(v_now, (v_opts->>'run_in_ms')::numeric, p_caller || ': run_in_ms');
    end if;
  end if;
  v_t.workflow_name := v_wf.workflow_name;
  v_t.workflow_version := v_wf.workflow_version;
  v_t.queue_name := v_queue;
  -- The rule of _queue_limited, written out (a call per start costs more than the rule).
  v_t.admitted := not exists (select 1 from runledger.queues q
                               where q.name = v_queue
                                 and (q.concurrency is not null or q.per_key_concurrency is not null
                                      or q.rate_limit_max is not null or q.paused));
  v_t.not_before := v_not_before;
  v_t.priority := coalesce((v_opts->>'priority')::int, 0);
  v_t.concurrency_key := v_opts->>'concurrency_key';
  v_t.idempotency_key := v_opts->>'idempotency_key';
  v_t.parent_run_id := v_opts->>'parent_run_id';
  -- A child belongs to its parent's tenant; otherwise the option, else the session's tenant.
  if v_t.parent_run_id is not null then
    v_t.tenant_id := (select p.tenant_id from runledger.runs p where p.run_id = v_t.parent_run_id);
  end if;
  v_t.tenant_id := coalesce(v_t.tenant_id, v_opts->>'tenant_id', nullif(current_setting('runledger.tenant', true), ''));
  v_t.deadline_at := v_deadline;
  v_t.traceparent := v_opts->>'traceparent';
  v_t.max_recovery_attempts := coalesce((v_opts->>'max_recovery_attempts')::int, v_wf.max_recovery_attempts);
  -- A run started from SQL records the manifest its version's engines registered.
  v_t.version_manifest := coalesce(v_opts->'version_manifest', v_wf.manifest || jsonb_build_object('started_from', 'sql'),
                                   jsonb_build_object('started_from', 'sql'));
  v_t.max_steps := (v_opts->>'max_steps')::int;
  -- A number is a budget of units; an object names its dimensions (units stays in budget).
  if jsonb_typeof(v_opts->'budget') = 'object' then
    v_t.budget := (v_opts->'budget'->>'units')::numeric;
    v_t.budget_limits := nullif((v_opts->'budget') - 'units', '{}'::jsonb);
  else
    v_t.budget := (v_opts->>'budget')::numeric;
  end if;
  v_t.no_progress := (v_opts->>'no_progress')::int;
  v_t.retry_budget := (v_opts->>'retry_budget')::int;
  -- The policy a run is held to, named by what it contains: kept in its termination record.
  -- Most runs have no limit but max_recovery_attempts: their text is written out as jsonb
  -- prints it (keys by length), far cheaper than building the jsonb object and printing it.
  -- test/sql/start-run.test.ts checks that both give the same name.
  if v_deadline is null and v_opts->'max_steps' is null and v_opts->'budget' is null and v_opts->'no_progress' is null
     and (v_opts->'max_recovery_attempts' is null or jsonb_typeof(v_opts->'max_recovery_attempts') = 'number') then
    v_t.policy_version := 'limits:' || left(md5(
        '{"budget": null, "deadline": null, "max_steps": null, "no_progress": null, "max_recovery_attempts": '
        || coalesce(v_opts->>'max_recovery_attempts', v_wf.max_recovery_attempts::text) || '}'), 12);
  else
    v_t.policy_version := 'limits:' || left(md5(jsonb_build_object(
        'deadline', v_deadline, 'max_steps', v_opts->'max_steps', 'budget', v_opts->'budget',
        'no_progress', v_opts->'no_progress', 'max_recovery_attempts', coalesce(v_opts->'max_recovery_attempts', to_jsonb(v_wf.max_recovery_attempts)))::text), 12);
  end if;
  v_t.created_at := v_now;
  v_t.updated_at := v_now;
  return v_t;
end;
$$;
comment on function runledger._start_template(text, jsonb, text) is
  'The checks and the resolution start_run and start_runs share: validates the options (RL003), resolves the registered workflow version (RL006), merges its limits, and returns the runs row a new run starts from (no run_id or input), with admitted set by whether its queue has limits.';

-- The start of one run, for start_run and for _start_claimed: the new row and its created
-- event, then admission or the announcement. Given a worker (_start_claimed), a run that
-- could be claimed at once is inserted already claimed for it (RUNNING, fencing token 1,
-- leased) with its claimed event beside the created one: one row version and one events
-- statement where an insert then a claim's update took two of each. An idempotent start
-- returns the existing run with inserted false (never claimed here).
create function runledger._start(
  p_workflow text, p_input jsonb, p_options jsonb, p_worker_id text default null, p_lease_ms int default null,
  p_admit boolean default true, out run runledger.runs, out inserted boolean)
language plpgsql volatile as $$
declare
  v_t   runledger.runs;
  v_now timestamptz;
  v_claim boolean;
  v_inserted boolean;
begin
  if pg_column_size(p_input) > runledger._max_payload_bytes() then
    raise exception using errcode = 'RL004',
      message = format('start_run: input is %s bytes, over the limit of %s', pg_column_size(p_input), runledger._max_payload_bytes());
  end if;
  v_t := runledger._start_template(p_workflow, p_options);
  v_now := v_t.created_at;
  v_t.run_id := coalesce(p_options->>'run_id', runledger._new_id());
  v_t.input := p_input;
  -- What _claim_batch would take now: admitted, not delayed, within its deadline.
  v_claim := p_worker_id is not null and v_t.admitted and v_t.not_before is null
             and (v_t.deadline_at is null or v_t.deadline_at > v_now);
  if v_claim then
    -- As a claim leaves it: admitted false (admission's count takes RUNNING runs).
    v_t.status := 'RUNNING';
    v_t.fencing_token := 1;
    v_t.lease_owner := p_worker_id;
    v_t.lease_expires_at := v_now + make_interval(secs => p_lease_ms / 1000.0);
    v_t.started_at := v_now;
    v_t.admitted := false;
  else
    v_t.status := 'PENDING';
    v_t.fencing_token := 0;
  end if;
  v_t.recovery_attempts := 0;
  v_t.budget_spent := 0;
  -- The row, then its events: nothing is logged when ON CONFLICT kept the row out. Two
  -- plain statements cost less than one that joins the inserted row to a list of events
  -- and sorts them.
  insert into runledger.runs (
    run_id, workflow_name, workflow_version, queue_name, status, input, admitted, not_before, priority, concurrency_key,
    idempotency_key, tenant_id, parent_run_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget,
    budget_limits, no_progress, retry_budget, policy_version, fencing_token, lease_owner, lease_expires_at, started_at,
    traceparent, created_at, updated_at)
  values (
    v_t.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, v_t.status, p_input, v_t.admitted, v_t.not_before,
    v_t.priority, v_t.concurrency_key, v_t.idempotency_key, v_t.tenant_id, v_t.parent_run_id, v_t.deadline_at,
    v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.budget_limits, v_t.no_progress, v_t.retry_budget,
    v_t.policy_version, v_t.fencing_token, v_t.lease_owner, v_t.lease_expires_at, v_t.started_at,
    v_t.traceparent, v_t.created_at, v_t.updated_at)
  on conflict do nothing;
  v_inserted := found;
  if v_inserted and v_claim then
    -- A claimed run also gets its claimed event, after the created one (rows of VALUES
    -- are inserted in their order).
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (v_t.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name), null, v_now),
           (v_t.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), 1, v_now);
  elsif v_inserted then
    insert into runledger.events (run_id, kind, detail, at)
    values (v_t.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name), v_now);
  end if;
  if not v_inserted then
    -- Idempotent start: the same run_id or idempotency key returns the existing run.
    select * into run from runledger.runs r
     where r.run_id = v_t.run_id
        or (v_t.idempotency_key is not null and r.workflow_name = p_workflow and r.idempotency_key = v_t.idempotency_key)
     limit 1;
    if run.workflow_name is distinct from p_workflow then
      raise exception using errcode = 'RL005',
        message = format('start_run: run_id %L already belongs to workflow %L', v_t.run_id, run.workflow_name);
    end if;
    inserted := false;
    return;
  end if;
  if v_claim then
    -- Its worker runs it: nobody else is woken.
    run := v_t;
    inserted := true;
    return;
  end if;
  if not v_t.admitted then
    -- A queue with limits: admission at once, unless the caller admits at its end
    -- (p_admit false: _start_many, once per queue, as a group commit does).
    if p_admit then
      perform runledger._admit(v_t.queue_name);
    end if;
  elsif v_t.not_before is not null or coalesce((p_options->>'notify')::boolean, true) then
    -- notify false: the caller's own worker claims the run (engine.start in a process whose
    -- worker has a free slot), so no other worker is woken for it.
    perform runledger._dispatch(v_t.run_id, v_t.queue_name,
      coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::bigint, 0));
  end if;
  run := v_t;
  inserted := true;
end;
$$;
comment on function runledger._start(text, jsonb, jsonb, text, int, boolean) is
  'One run started (start_run, _start_claimed): checks, the row and its created event, then admission (unless p_admit is false: the caller admits the queue at its end) or the announcement. Given p_worker_id and p_lease_ms, a run that is runnable at once (admitted, not delayed, within its deadline) is inserted claimed for that worker, with its claimed event. Returns the row (as inserted, or the existing run of an idempotent start) and whether it was inserted.';

create function runledger.start_run(p_workflow text, p_input jsonb, p_options jsonb default '{}')
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  return (runledger._start(p_workflow, p_input, p_options)).run.run_id;
end;
$$;
comment on function runledger.start_run(text, jsonb, jsonb) is
  'Starts a run of a registered workflow and dispatches it (or leaves it to its queue''s admission); returns run_id. Options: run_at (delayed start at a timestamp, compared with runledger.now()) or run_in_ms (delayed start this many ms after now on the database clock), run_id, idempotency_key (same key or run_id returns the existing run), queue, priority, concurrency_key, version, max_recovery_attempts, limits overriding the workflow''s: deadline (interval or timestamp), max_steps, budget, no_progress; traceparent (a W3C traceparent the run''s executions are traced under, see runs.traceparent); and notify (default true): false starts an immediately runnable run without waking the queue''s workers by NOTIFY, for a caller whose own worker claims it (engine.start does so when its process''s worker has a free slot; other workers find the run at their next poll). An unknown option is RL003 (naming it and the known ones), as are run_at or a deadline that is not a finite time PostgreSQL holds (infinity, -infinity, unparsable text) and run_in_ms outside 0 to 2^53 - 1.';

-- start_runs builds its rows in one pass over the inputs (ROWS FROM: the inputs and the
-- per-input arrays side by side, no materialized copy, no sort), and inserts them without
-- ON CONFLICT when the caller gives no run ids or idempotency keys: speculative insertion
-- looks every row up in each unique index first, and ids made here are new. engine.startMany leaves the
-- ids to it unless given ids or keys. Reading `v_opts->'run_ids'->>i` per row instead copied
-- the whole run_ids array for every row (quadratic in the batch size).
create function runledger.start_runs(p_workflow text, p_inputs jsonb, p_options jsonb default '{}')
returns text[]
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_t      runledger.runs;
  v_opts   jsonb := coalesce(p_options, '{}');
  v_n      int;
  v_ids    text[];
  v_keys   text[];
  v_inserted text[];
  v_new    int;
  v_bad    record;
  v_key    text;
  v_created jsonb;
  -- Ids made here are ULIDs that sort in input order: this statement's milliseconds (10
  -- characters) and 35 random bits (7), both drawn once, then the input's position as 9
  -- decimal digits (Crockford base32 characters too; a jsonb array holds at most 2^28 - 1
  -- elements, fewer than 10^9). Per row that is one lpad, not 80 bits encoded. Two statements in the same
  -- millisecond collide only if their 35 random bits do, and then the second fails on the
  -- primary key (23505) rather than taking the first one's runs for its own.
  v_id_prefix text := runledger._base32_10((extract(epoch from clock_timestamp()) * 1000)::bigint)
                      || right(runledger._base32_10(runledger._random_40()), 7);
begin
  if p_inputs is null or jsonb_typeof(p_inputs) <> 'array' then
    raise exception using errcode = 'RL003', message = 'start_runs: inputs must be a JSON array (one input per run)';
  end if;
  v_n := jsonb_array_length(p_inputs);
  if v_opts ? 'run_id' or v_opts ? 'idempotency_key' then
    raise exception using errcode = 'RL003',
      message = 'start_runs: give run_ids and idempotency_keys as arrays, one per input (run_id and idempotency_key are start_run''s)';
  end if;
  foreach v_key in array array['run_ids', 'idempotency_keys', 'concurrency_keys'] loop
    if v_opts ? v_key and (jsonb_typeof(v_opts->v_key) <> 'array' or jsonb_array_length(v_opts->v_key) <> v_n) then
      raise exception using errcode = 'RL003', message = format('start_runs: %s must be an array of %s entries (one per input, null for none)', v_key, v_n);
    end if;
  end loop;
  select e.ordinality - 1 as i, e.value as id into v_bad
    from jsonb_array_elements(coalesce(v_opts->'run_ids', '[]')) with ordinality e
   where jsonb_typeof(e.value) <> 'null'
     and (jsonb_typeof(e.value) <> 'string' or e.value #>> '{}' !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$'
          or length(e.value #>> '{}') > 200)
   limit 1;
  if found then
    raise exception using errcode = 'RL003', message = format('start_runs: invalid run id %s (input %s)', v_bad.id, v_bad.i);
  end if;
  select e.ordinality - 1 as i, pg_column_size(e.value) as bytes into v_bad
    from jsonb_array_elements(p_inputs) with ordinality e
   where pg_column_size(e.value) > runledger._max_payload_bytes()
   limit 1;
  if found then
    raise exception using errcode = 'RL004',
      message = format('start_runs: input %s is %s bytes, over the limit of %s', v_bad.i, v_bad.bytes, runledger._max_payload_bytes());
  end if;
  v_t := runledger._start_template(p_workflow, v_opts - 'run_ids' - 'idempotency_keys' - 'concurrency_keys', 'start_runs');
  if v_n = 0 then
    return '{}';
  end if;
  -- Every created event says the same: built once, not per row.
  v_created := jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name);

  -- Each input's run id (given, else made here) and key, in input order. ROWS FROM reads
  -- the arrays side by side in one pass (an absent one gives nulls); a function scan
  -- returns its rows in order, so the arrays are in input order without a sort.
  select array_agg(coalesce(e.run_id, v_id_prefix || lpad((e.i - 1)::text, 9, '0'))), array_agg(e.idempotency_key)
    into v_ids, v_keys
    from rows from (generate_series(1, v_n), jsonb_array_elements_text(v_opts->'run_ids'),
                    jsonb_array_elements_text(v_opts->'idempotency_keys')) e(i, run_id, idempotency_key);

  if not (v_opts ? 'run_ids' or v_opts ? 'idempotency_keys') then
    -- New runs only: no input names an existing run, so a plain INSERT (ON CONFLICT would
    -- look each row up in every unique index first). The rows and their created events.
    with inserted as (
      insert into runledger.runs (
        run_id, workflow_name, workflow_version, queue_name, input, admitted, not_before, priority, concurrency_key,
        tenant_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress,
        retry_budget, policy_version, traceparent, created_at, updated_at)
      select e.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, e.input, v_t.admitted, v_t.not_before,
             v_t.priority, coalesce(e.concurrency_key, v_t.concurrency_key), v_t.tenant_id, v_t.deadline_at,
             v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.no_progress, v_t.retry_budget,
             v_t.policy_version, v_t.traceparent, v_t.created_at, v_t.updated_at
        from rows from (unnest(v_ids), jsonb_array_elements(p_inputs),
                        jsonb_array_elements_text(v_opts->'concurrency_keys')) e(run_id, input, concurrency_key)
      returning run_id
    )
    insert into runledger.events (run_id, kind, detail, at)
    select n.run_id, 'created', v_created, v_t.created_at
      from inserted n;
    v_new := v_n;
  else
    -- One statement: the rows, and the created events of those that are new. A given id or
    -- idempotency key that already has a run (also one given twice in this call) is kept
    -- out by ON CONFLICT and resolved below.
    with inserted as (
      insert into runledger.runs (
        run_id, workflow_name, workflow_version, queue_name, input, admitted, not_before, priority, concurrency_key,
        idempotency_key, tenant_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress,
        retry_budget, policy_version, traceparent, created_at, updated_at)
      select e.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, e.input, v_t.admitted, v_t.not_before,
             v_t.priority, coalesce(e.concurrency_key, v_t.concurrency_key), e.idempotency_key, v_t.tenant_id,
             v_t.deadline_at, v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.no_progress,
             v_t.retry_budget, v_t.policy_version, v_t.traceparent, v_t.created_at, v_t.updated_at
        from rows from (unnest(v_ids), jsonb_array_elements(p_inputs), unnest(v_keys),
                        jsonb_array_elements_text(v_opts->'concurrency_keys')) e(run_id, input, idempotency_key, concurrency_key)
      on conflict do nothing
      returning run_id
    ), logged as (
      insert into runledger.events (run_id, kind, detail, at)
      select n.run_id, 'created', v_created, v_t.created_at
        from inserted n
    )
    select array_agg(n.run_id) into v_inserted from inserted n;
    v_new := coalesce(cardinality(v_inserted), 0);
  end if;

  if v_new < v_n then
    -- Idempotent start, per input: the same run_id or idempotency key gives the existing
    -- run (read in a statement of its own, so a run another transaction just committed is seen).
    select u.i - 1 as i, r.run_id, r.workflow_name into v_bad
      from unnest(v_ids) with ordinality u(run_id, i)
      join runledger.runs r on r.run_id = u.run_id
     where not (u.run_id = any(coalesce(v_inserted, '{}'))) and r.workflow_name <> p_workflow
     limit 1;
    if found then
      raise exception using errcode = 'RL005',
        message = format('start_runs: run_id %L (input %s) already belongs to workflow %L', v_bad.run_id, v_bad.i, v_bad.workflow_name);
    end if;
    select array_agg(coalesce(
             (select r.run_id from runledger.runs r where r.run_id = u.run_id and r.workflow_name = p_workflow),
             (select r.run_id from runledger.runs r
               where u.key is not null and r.workflow_name = p_workflow and r.idempotency_key = u.key)) order by u.i)
      into v_ids
      from unnest(v_ids, v_keys) with ordinality u(run_id, key, i);
  end if;

  if v_new > 0 then
    if not v_t.admitted then
      perform runledger._admit(v_t.queue_name);
    elsif v_t.not_before is not null or coalesce((v_opts->>'notify')::boolean, true) then
      -- One announcement for all of them (_dispatch's NOTIFY names the queue, not the run).
      perform runledger._dispatch(null, v_t.queue_name,
        coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::bigint, 0));
    end if;
  end if;
  return v_ids;
end;
$$;
comment on function runledger.start_runs(text, jsonb, jsonb) is
  'Starts one run of a registered workflow per element of the JSON array p_inputs, in one statement, and announces its queue once; returns the run ids in input order. Options as start_run''s (an unknown one is RL003), for every run, except run_ids, idempotency_keys and concurrency_keys: arrays with one entry per input (null for none). An input whose run_id or idempotency key already has a run gives that run''s id (idempotent, per input); a run_id of another workflow is RL005. Without run_ids and idempotency_keys every run is new and gets an id made here (a ULID, in input order).';

-- engine.start in a process whose own worker has a free slot: the start and the claim in
-- one transaction. The worker is spared a claim, and the run the wait for it (a claim
-- round trip after the start's commit). Only the run start_run just made or found is
-- claimed, and only while it is PENDING and admitted (in a queue with limits: admission
-- let it in at once, so it holds a slot already), runnable now, never claimed
-- (fencing_token 0), of the version the worker serves and within its deadline; anything
-- else is left to the queue's workers and comes back unclaimed.
create function runledger._start_claimed(
  p_workflow text, p_input jsonb, p_options jsonb, p_worker_id text, p_lease_ms int, p_admit boolean default true)
returns table (
  run_id text, claimed boolean, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb,
  traceparent text)
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
  v_started := runledger._start(p_workflow, p_input, coalesce(p_options, '{}') || '{"notify": false}', p_worker_id, p_lease_ms, p_admit);
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
       -- A fork (its lineage_id set) is left to the claims, which hand the worker its lineage.
       and v_run.lineage_id is null
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
                        v_run.recovery_attempts, v_run.max_steps, v_run.budget, v_run.budget_spent, v_run.budget_limits, v_run.budget_used,
                        v_run.traceparent;
  else
    return query select v_run.run_id, false, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
                        null::numeric, null::numeric, null::jsonb, null::jsonb, null::text;
  end if;
end;
$$;
comment on function runledger._start_claimed(text, jsonb, jsonb, text, int, boolean) is
  'engine.start for a run its own process''s worker takes: the run is started as start_run starts it (without NOTIFY) and claimed for p_worker_id with a lease of p_lease_ms in the same transaction, as _claim_batch would claim it: a new run that is runnable at once is inserted claimed (runledger._start), an existing never-claimed runnable one (an idempotent start, or one its queue''s admission just let in) is claimed by an update. Returns one row: claimed true with the claimed run''s fields, or claimed false (a run already claimed or of another version, a delayed start, a run admission held back, a deadline already past), in which case the run is announced as start_run announces it. p_admit false leaves the admission of a queue with limits to the caller (_start_many).';

-- W3C Trace Context, version 00: 00-<trace id: 32 hex>-<parent span id: 16 hex>-<flags: 2 hex>,
-- lower case, neither id all zeros.
create function runledger._is_traceparent(p text) returns boolean
language sql immutable parallel safe as $$
  select p ~ '^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
     and substr(p, 4, 32) <> repeat('0', 32) and substr(p, 37, 16) <> repeat('0', 16)
$$;
comment on function runledger._is_traceparent(text) is
  'True when p is a W3C traceparent of version 00 (00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, lower case, neither id all zeros): the form runs.traceparent and runs.execution_traceparent hold.';

create function runledger._start_many(p_items jsonb)
returns table (
  item int, run_id text, claimed boolean, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb,
  traceparent text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_item    jsonb;
  v_index   int := 0;
  v_claim   record;
  v_started record;
  v_unclaimed text[] := '{}';
  v_queues    text[] := '{}';
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003',
      message = format('_start_many: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  -- No subtransaction per item: an error undoes the whole statement, and the caller sends
  -- each of its items again alone, so every start gets its own answer. Errors are rare
  -- (the engine checks the inputs first); a subtransaction per item would cost every batch.
  -- Queues with limits admit once each at the end, in name order (_admit_queues), as a
  -- group commit does: a batch that took one queue's row lock per item, in its items'
  -- order, could wait on a group commit that holds another's.
  for v_item in select value from jsonb_array_elements(p_items) loop
    if jsonb_typeof(v_item) <> 'object'
       or (v_item ? 'worker_id' and (jsonb_typeof(v_item->'lease_ms') is distinct from 'number' or v_item->>'lease_ms' !~ '^\d{1,9}$')) then
      raise exception using errcode = 'RL003',
        message = format('_start_many: item %s must be an object {workflow, input, options[, worker_id, lease_ms (a whole number)]}, not %s',
                         v_index, left(v_item::text, 200));
    end if;
    if v_item ? 'worker_id' then
      select * into v_claim
        from runledger._start_claimed(v_item->>'workflow', v_item->'input', v_item->'options', v_item->>'worker_id',
                                      (v_item->>'lease_ms')::int, p_admit => false);
      if not v_claim.claimed then
        v_unclaimed := v_unclaimed || v_claim.run_id;
      end if;
      -- The row by assignments (PL/pgSQL's simple expressions), not a query per item.
      item := v_index;
      run_id := v_claim.run_id;
      claimed := v_claim.claimed;
      workflow_name := v_claim.workflow_name;
      workflow_version := v_claim.workflow_version;
      input := v_claim.input;
      fencing_token := v_claim.fencing_token;
      recovery_attempts := v_claim.recovery_attempts;
      max_steps := v_claim.max_steps;
      budget := v_claim.budget;
      budget_spent := v_claim.budget_spent;
      budget_limits := v_claim.budget_limits;
      budget_used := v_claim.budget_used;
      traceparent := v_claim.traceparent;
      return next;
    else
      -- As start_run (its announcement included: identical notifications of one transaction are sent once).
      select * into v_started from runledger._start(v_item->>'workflow', v_item->'input', v_item->'options', p_admit => false);
      if v_started.inserted and not (v_started.run).admitted then
        v_queues := v_queues || (v_started.run).queue_name;
      end if;
      item := v_index;
      run_id := (v_started.run).run_id;
      claimed := false;
      workflow_name := null;
      workflow_version := null;
      input := null;
      fencing_token := null;
      recovery_attempts := null;
      max_steps := null;
      budget := null;
      budget_spent := null;
      budget_limits := null;
      budget_used := null;
      traceparent := null;
      return next;
    end if;
    v_index := v_index + 1;
  end loop;
  -- The queues of the runs started here that wait for admission: a new run not admitted, and
  -- the queue of a run its worker could not claim (those with limits admit). Found by run_id
  -- alone: a status in the condition would prove the predicate of runs_admission_key, and a
  -- plan cached while the table was empty walks it whole (test/plans.slow.test.ts).
  if cardinality(v_unclaimed) > 0 then
    v_queues := v_queues || array(select r.queue_name from runledger.runs r where r.run_id = any(v_unclaimed));
  end if;
  perform runledger._admit_queues(v_queues);
end;
$$;
comment on function runledger._start_many(jsonb) is
  'Several engine.start calls of one process in one transaction, one per element of p_items ({workflow, input, options, worker_id, lease_ms}), in order: with worker_id, runledger._start_claimed (the run claimed for that worker of the calling process when it can be); without, the start start_run makes. Queues with limits admit once each at the end, in name order (so a run of such a queue is not claimed at its start here; admission announces it). One row per item, numbered from 0, with _start_claimed''s columns (claimed false and nulls for a start without a worker). An error in any item undoes them all (the engine then starts each alone).';

insert into runledger.migrations (version, name) values (3, '0003_start');
