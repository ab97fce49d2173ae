-- 0002_runs: starting, checkpointing and finishing runs.
--
--   runledger.start_run(workflow, input, options)  public: create a run and make it runnable
--   runledger.start_runs(workflow, inputs, options) public: many runs of one workflow in one statement
--   runledger._start(...)                          one run's row, its events, admission or announcement (optionally claimed)
--   runledger._start_template(...)                 the option checks and the new row's columns both share
--   runledger._max_payload_bytes()                 the largest input/output accepted
--   runledger._check_whole_number(...)             option validation shared by start_run and set_queue
--   runledger._check_budget_option(...)            a budget option: a number (units) or an object of dimensions
--   runledger._completed_evidence(...)             the evidence of a COMPLETED termination record
--   runledger._new_id(), _base32_10, _random_40     ULIDs made in SQL
--   runledger._lock_executing(...)                 the run an execution holds, locked, or RL001
--   runledger._fence(...)                          the lease check every write of an executing run makes
--   runledger._made_progress(...)                  did an execution commit a checkpoint (resets recovery attempts)
--   runledger._started_at(...)                     a step's start on the database clock, from how long ago it started
--   runledger._checkpoint_row / _checkpoint        fenced checkpoint write
--   runledger._checkpoint_outcome(...)             resolves a COMMIT whose outcome the client did not see
--   runledger._finish_run / _finished              a fenced move to a terminal status, and what follows it
--   runledger._complete_run / _complete_with_checkpoint / _fail_run / _dead_letter_run
--   runledger._release_run(...)                    a worker gives a run back
--
-- Error codes (SQLSTATE) are the ones of the SQLSTATES table in src/engine/core/errors.ts:
--   RL001 LEASE_LOST, RL002 NOT_FOUND, RL003 INVALID_INPUT, RL004 PAYLOAD_TOO_LARGE,
--   RL005 INVALID_STATE, RL006 UNKNOWN_WORKFLOW.
-- Every function that changes a run writes its event in the same transaction.

create function runledger._max_payload_bytes() returns int
language sql stable parallel safe as $$
  select coalesce(nullif(current_setting('runledger.max_payload_bytes', true), '')::int, 4194304)
$$;
comment on function runledger._max_payload_bytes() is
  'Largest input/output accepted, in bytes: setting runledger.max_payload_bytes, default 4 MiB.';

create function runledger._check_whole_number(p_opts jsonb, p_key text, p_min int) returns void
language plpgsql immutable as $$
begin
  if p_opts ? p_key and jsonb_typeof(p_opts->p_key) <> 'null'
     and (jsonb_typeof(p_opts->p_key) <> 'number' or (p_opts->>p_key) !~ '^\d{1,9}$' or (p_opts->>p_key)::int < p_min) then
    raise exception using errcode = 'RL003',
      message = format('option %s must be a whole number >= %s, not %s', p_key, p_min, p_opts->p_key);
  end if;
end;
$$;
comment on function runledger._check_whole_number(jsonb, text, int) is 'Raises RL003 unless p_opts->p_key is absent or a whole number >= p_min.';

create function runledger._check_budget_option(p_budget jsonb, p_caller text) returns void
language plpgsql immutable as $$
declare
  v_key text;
  v_amount jsonb;
begin
  if p_budget is null or jsonb_typeof(p_budget) = 'null' then
    return;
  end if;
  if jsonb_typeof(p_budget) = 'number' then
    if (p_budget #>> '{}')::numeric < 0 then
      raise exception using errcode = 'RL003', message = format('%s: budget must be a number >= 0, not %s', p_caller, p_budget);
    end if;
    return;
  end if;
  if jsonb_typeof(p_budget) <> 'object' then
    raise exception using errcode = 'RL003',
      message = format('%s: budget must be a number or an object of dimensions (units, tokens, cost_usd, tool_calls, turns), not %s', p_caller, p_budget);
  end if;
  for v_key, v_amount in select key, value from jsonb_each(p_budget) loop
    if v_key <> all (array['units', 'tokens', 'cost_usd', 'tool_calls', 'turns']) then
      raise exception using errcode = 'RL003',
        message = format('%s: budget has an unknown dimension %L (known: units, tokens, cost_usd, tool_calls, turns)', p_caller, v_key);
    end if;
    if jsonb_typeof(v_amount) <> 'number' or (v_amount #>> '{}')::numeric < 0 then
      raise exception using errcode = 'RL003', message = format('%s: budget %s must be a number >= 0, not %s', p_caller, v_key, v_amount);
    end if;
  end loop;
end;
$$;
comment on function runledger._check_budget_option(jsonb, text) is
  'Raises RL003 unless a budget option is absent, a number >= 0 (units) or an object of dimensions units, tokens, cost_usd, tool_calls, turns, each a number >= 0.';

create function runledger._completed_evidence(p_steps bigint, p_run runledger.runs, p_verification jsonb) returns jsonb
language sql immutable as $$
  select jsonb_build_object('steps', p_steps, 'budget_spent', p_run.budget_spent)
         || case when p_run.budget_used is null then '{}'::jsonb else jsonb_build_object('budget_used', p_run.budget_used) end
         || case when p_verification is null then '{}'::jsonb else jsonb_build_object('verification', p_verification) end
$$;
comment on function runledger._completed_evidence(bigint, runledger.runs, jsonb) is
  'The evidence of a COMPLETED termination record: steps, budget_spent (units), budget_used (other dimensions, when any) and verification (what the workflow''s verify accepted the output with, when it has one).';

-- ULIDs generated in SQL so that psql-started runs look like TypeScript-started ones:
-- 48-bit millisecond time + 80 random bits (two halves of 40, from a v4 UUID's random
-- bytes: no pgcrypto needed), Crockford base32. Written as expressions, not a loop over
-- 26 characters: the loop cost 12 us or more per id, most of a bulk start's time.
create function runledger._base32_10(p bigint) returns text
language sql immutable as $$
  select substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 45) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 40) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 35) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 30) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 25) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 20) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 15) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 10) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 5) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', (p & 31)::int + 1, 1)
$$;
comment on function runledger._base32_10(bigint) is
  'The low 50 bits of p as 10 Crockford base32 characters (inlined into its caller: a ULID''s time part, or with right(..., 8) 40 of its random bits).';

-- 40 random bits: five random bytes of a v4 UUID (bytes 1-5, or 11-15 with p_second).
create function runledger._random_40(p_second boolean default false) returns bigint
language sql volatile as $$
  select ('x' || encode(substring(uuid_send(gen_random_uuid()) from case when p_second then 11 else 1 end for 5), 'hex'))::bit(40)::bigint
$$;
comment on function runledger._random_40(boolean) is 'A random whole number below 2^40 (from gen_random_uuid).';

create function runledger._new_id() returns text
language plpgsql volatile as $$
declare
  v_ms bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
  v_hi bigint := runledger._random_40();
  v_lo bigint := runledger._random_40(true);
begin
  return runledger._base32_10(v_ms) || right(runledger._base32_10(v_hi), 8) || right(runledger._base32_10(v_lo), 8);
end;
$$;
comment on function runledger._new_id() is 'A new ULID (26 characters, Crockford base32) for ids created in SQL.';

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
begin
  if p_workflow is null then
    raise exception using errcode = 'RL003', message = p_caller || ': workflow name is required';
  end if;
  if jsonb_typeof(v_opts) <> 'object' then
    raise exception using errcode = 'RL003', message = p_caller || ': options must be a JSON object';
  end if;

  select * into v_wf from runledger.workflows w
   where w.workflow_name = p_workflow and (v_version is null or w.workflow_version = v_version)
   order by w.registered_at desc limit 1;
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
  if v_opts ? 'deadline' and jsonb_typeof(v_opts->'deadline') <> 'null' then
    begin
      -- A date-time ('2030-01-31T12:00Z') is a point in time; anything else ('2 days', '36h') a lifetime.
      if v_opts->>'deadline' ~ '^\d{4}-\d{2}-\d{2}' then
        v_deadline := (v_opts->>'deadline')::timestamptz;
      else
        v_deadline := v_now + (v_opts->>'deadline')::interval;
      end if;
    exception when others then
      raise exception using errcode = 'RL003',
        message = format('%s: deadline %L is neither an interval nor a timestamp', p_caller, v_opts->>'deadline');
    end;
  end if;
  perform runledger._check_whole_number(v_opts, 'max_steps', 1);
  perform runledger._check_whole_number(v_opts, 'no_progress', 2);
  perform runledger._check_whole_number(v_opts, 'retry_budget', 0);
  perform runledger._check_budget_option(v_opts->'budget', p_caller);
  if v_opts ? 'priority' and (jsonb_typeof(v_opts->'priority') <> 'number' or (v_opts->>'priority') !~ '^-?\d{1,9}$') then
    raise exception using errcode = 'RL003', message = format('%s: priority must be a whole number, not %s', p_caller, v_opts->'priority');
  end if;
  if v_opts ? 'max_recovery_attempts'
     and (jsonb_typeof(v_opts->'max_recovery_attempts') <> 'number' or (v_opts->>'max_recovery_attempts') !~ '^\d{1,9}$') then
    raise exception using errcode = 'RL003',
      message = format('%s: max_recovery_attempts must be a whole number >= 0, not %s', p_caller, v_opts->'max_recovery_attempts');
  end if;

  if v_opts ? 'tenant_id' and (jsonb_typeof(v_opts->'tenant_id') <> 'string' or v_opts->>'tenant_id' !~ '^[A-Za-z0-9][A-Za-z0-9_.:@-]*$'
                               or length(v_opts->>'tenant_id') > 200) then
    raise exception using errcode = 'RL003', message = format('%s: invalid tenant_id %s', p_caller, v_opts->'tenant_id');
  end if;
  if v_opts ? 'notify' and jsonb_typeof(v_opts->'notify') <> 'boolean' then
    raise exception using errcode = 'RL003', message = format('%s: notify must be true or false, not %s', p_caller, v_opts->'notify');
  end if;
  if v_opts ? 'run_at' and v_opts ? 'run_in_ms' then
    raise exception using errcode = 'RL003', message = p_caller || ': give run_at or run_in_ms, not both';
  end if;
  if v_opts ? 'run_at' then
    begin
      v_not_before := (v_opts->>'run_at')::timestamptz;
    exception when others then
      raise exception using errcode = 'RL003', message = format('%s: run_at %L is not a timestamp', p_caller, v_opts->>'run_at');
    end;
  end if;
  if v_opts ? 'run_in_ms' then
    -- A delay, counted on the database clock from now: a caller's clock does not matter.
    if jsonb_typeof(v_opts->'run_in_ms') <> 'number' or (v_opts->>'run_in_ms') !~ '^\d{1,15}$' then
      raise exception using errcode = 'RL003',
        message = format('%s: run_in_ms must be a whole number of milliseconds >= 0, not %s', p_caller, v_opts->'run_in_ms');
    end if;
    v_not_before := v_now + make_interval(secs => (v_opts->>'run_in_ms')::bigint / 1000.0);
  end if;
  v_t.workflow_name := v_wf.workflow_name;
  v_t.workflow_version := v_wf.workflow_version;
  v_t.queue_name := v_queue;
  v_t.admitted := not runledger._queue_limited(v_queue);
  v_t.not_before := v_not_before;
  v_t.priority := coalesce((v_opts->>'priority')::int, 0);
  v_t.concurrency_key := v_opts->>'concurrency_key';
  v_t.idempotency_key := v_opts->>'idempotency_key';
  v_t.parent_run_id := v_opts->>'parent_run_id';
  -- A child belongs to its parent's tenant; otherwise the option, else the session's tenant.
  v_t.tenant_id := coalesce((select p.tenant_id from runledger.runs p where p.run_id = v_t.parent_run_id),
                            v_opts->>'tenant_id', nullif(current_setting('runledger.tenant', true), ''));
  v_t.deadline_at := v_deadline;
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
  v_t.policy_version := 'limits:' || left(md5(jsonb_build_object(
      'deadline', v_deadline, 'max_steps', v_opts->'max_steps', 'budget', v_opts->'budget',
      'no_progress', v_opts->'no_progress', 'max_recovery_attempts', coalesce(v_opts->'max_recovery_attempts', to_jsonb(v_wf.max_recovery_attempts)))::text), 12);
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
  out run runledger.runs, out inserted boolean)
language plpgsql volatile as $$
declare
  v_t   runledger.runs;
  v_now timestamptz;
  v_claim boolean;
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
  insert into runledger.runs (
    run_id, workflow_name, workflow_version, queue_name, status, input, admitted, not_before, priority, concurrency_key,
    idempotency_key, tenant_id, parent_run_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget,
    budget_limits, no_progress, retry_budget, policy_version, fencing_token, lease_owner, lease_expires_at, started_at,
    created_at, updated_at)
  values (
    v_t.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, v_t.status, p_input, v_t.admitted, v_t.not_before,
    v_t.priority, v_t.concurrency_key, v_t.idempotency_key, v_t.tenant_id, v_t.parent_run_id, v_t.deadline_at,
    v_t.max_recovery_attempts, v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.budget_limits, v_t.no_progress, v_t.retry_budget,
    v_t.policy_version, v_t.fencing_token, v_t.lease_owner, v_t.lease_expires_at, v_t.started_at,
    v_t.created_at, v_t.updated_at)
  on conflict do nothing;
  if not found then
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
    insert into runledger.events (run_id, kind, detail, fencing_token, at)
    values (v_t.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name), null, v_now),
           (v_t.run_id, 'claimed', jsonb_build_object('worker', p_worker_id), 1, v_now);
    run := v_t;
    inserted := true;
    return;
  end if;
  insert into runledger.events (run_id, kind, detail, at)
  values (v_t.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name), v_now);
  if not v_t.admitted then
    perform runledger._admit(v_t.queue_name);
  elsif v_t.not_before is not null or coalesce((p_options->>'notify')::boolean, true) then
    -- notify false: the caller's own worker claims the run (engine.start in a process whose
    -- worker has a free slot), so no other worker is woken for it.
    perform runledger._dispatch(v_t.run_id, v_t.queue_name,
      coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::int, 0));
  end if;
  run := v_t;
  inserted := true;
end;
$$;
comment on function runledger._start(text, jsonb, jsonb, text, int) is
  'One run started (start_run, _start_claimed): checks, the row and its created event, then admission or the announcement. Given p_worker_id and p_lease_ms, a run that is runnable at once (admitted, not delayed, within its deadline) is inserted claimed for that worker, with its claimed event. Returns the row (as inserted, or the existing run of an idempotent start) and whether it was inserted.';

create function runledger.start_run(p_workflow text, p_input jsonb, p_options jsonb default '{}')
returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  return (runledger._start(p_workflow, p_input, p_options)).run.run_id;
end;
$$;
comment on function runledger.start_run(text, jsonb, jsonb) is
  'Starts a run of a registered workflow and dispatches it (or leaves it to its queue''s admission); returns run_id. Options: run_at (delayed start at a timestamp, compared with runledger.now()) or run_in_ms (delayed start this many ms after now on the database clock), run_id, idempotency_key (same key or run_id returns the existing run), queue, priority, concurrency_key, version, max_recovery_attempts, limits overriding the workflow''s: deadline (interval or timestamp), max_steps, budget, no_progress; and notify (default true): false starts an immediately runnable run without waking the queue''s workers by NOTIFY, for a caller whose own worker claims it (engine.start does so when its process''s worker has a free slot; other workers find the run at their next poll).';

-- Many runs of one workflow in one statement: the options are checked once, the rows
-- are inserted together, and the queue is announced once.
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
  -- Ids made here are those of a monotonic ULID factory: this statement's time, then one
  -- random 80-bit number counted up by the input's position (as two 40-bit halves), so
  -- they sort in input order and cost a few expressions each.
  v_id_time text := runledger._base32_10((extract(epoch from clock_timestamp()) * 1000)::bigint);
  v_id_hi   bigint := runledger._random_40();
  v_id_lo   bigint := runledger._random_40(true);
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

  -- One statement: the rows, and the created events of those that are new. Ids made here
  -- (none given) are ULIDs; a given id or idempotency key that already has a run is kept
  -- out by ON CONFLICT and resolved below.
  with wanted as materialized (
    select (e.ordinality - 1)::int as i, e.value as input,
           coalesce(v_opts->'run_ids'->>((e.ordinality - 1)::int),
                    v_id_time || right(runledger._base32_10((v_id_hi + ((v_id_lo + e.ordinality) >> 40)) & 1099511627775), 8)
                              || right(runledger._base32_10((v_id_lo + e.ordinality) & 1099511627775), 8)) as run_id,
           v_opts->'idempotency_keys'->>((e.ordinality - 1)::int) as idempotency_key,
           coalesce(v_opts->'concurrency_keys'->>((e.ordinality - 1)::int), v_t.concurrency_key) as concurrency_key
      from jsonb_array_elements(p_inputs) with ordinality e
  ), inserted as (
    insert into runledger.runs (
      run_id, workflow_name, workflow_version, queue_name, input, admitted, not_before, priority, concurrency_key,
      idempotency_key, tenant_id, deadline_at, max_recovery_attempts, version_manifest, max_steps, budget, no_progress,
      retry_budget, policy_version, created_at, updated_at)
    select w.run_id, v_t.workflow_name, v_t.workflow_version, v_t.queue_name, w.input, v_t.admitted, v_t.not_before,
           v_t.priority, w.concurrency_key, w.idempotency_key, v_t.tenant_id, v_t.deadline_at, v_t.max_recovery_attempts,
           v_t.version_manifest, v_t.max_steps, v_t.budget, v_t.no_progress, v_t.retry_budget, v_t.policy_version,
           v_t.created_at, v_t.updated_at
      from wanted w
     order by w.i
    on conflict do nothing
    returning run_id
  ), logged as (
    insert into runledger.events (run_id, kind, detail, at)
    select n.run_id, 'created', jsonb_build_object('workflow', p_workflow, 'version', v_t.workflow_version, 'queue', v_t.queue_name),
           v_t.created_at
      from inserted n
  )
  select array_agg(w.run_id order by w.i), array_agg(w.idempotency_key order by w.i), (select array_agg(n.run_id) from inserted n)
    into v_ids, v_keys, v_inserted
    from wanted w;
  v_new := coalesce(cardinality(v_inserted), 0);

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
        coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::int, 0));
    end if;
  end if;
  return v_ids;
end;
$$;
comment on function runledger.start_runs(text, jsonb, jsonb) is
  'Starts one run of a registered workflow per element of the JSON array p_inputs, in one statement, and announces its queue once; returns the run ids in input order. Options as start_run''s, for every run, except run_ids, idempotency_keys and concurrency_keys: arrays with one entry per input (null for none). An input whose run_id or idempotency key already has a run gives that run''s id (idempotent, per input); a run_id of another workflow is RL005.';

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
  perform runledger._admit_later(p_queue);
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

create function runledger._dead_letter_run(p_run_id text, p_token bigint, p_reason text, p_evidence jsonb, p_policy_version text)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', p_reason, null, null, p_evidence, p_policy_version);
end;
$$;
comment on function runledger._dead_letter_run(text, bigint, text, jsonb, text) is
  'Fenced move to DEAD_LETTER (e.g. NON_DETERMINISM) with evidence; the run leaves the automatic path until retry_run.';

create function runledger._release_run(p_run_id text, p_token bigint, p_delay_ms int, p_reason text, p_counts_attempt boolean default false)
returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
  v_now timestamptz := runledger.now();
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
    -- An execution that keeps failing for infrastructure reasons must not loop forever.
    perform runledger._finish_run(p_run_id, p_token, 'DEAD_LETTER', 'MAX_RECOVERY_ATTEMPTS', null, null,
      jsonb_build_object('recovery_attempts', v_run.recovery_attempts, 'max_recovery_attempts', v_run.max_recovery_attempts,
                         'last_release', p_reason),
      'runledger/1');
    return true;
  end if;
  update runledger.runs
     set status = 'PENDING', lease_owner = null, lease_expires_at = null, updated_at = v_now,
         recovery_attempts = v_run.recovery_attempts + case when p_counts_attempt then 1 else 0 end
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token, at)
  values (p_run_id, 'released', jsonb_build_object('reason', p_reason, 'delay_ms', p_delay_ms, 'counts_attempt', p_counts_attempt), p_token, v_now);
  perform runledger._make_runnable(p_run_id, p_delay_ms);
  return true;
end;
$$;
comment on function runledger._release_run(text, bigint, int, text, boolean) is
  'A worker gives a run back: RUNNING -> PENDING, re-dispatched after p_delay_ms. A graceful stop does not count a recovery attempt; an infrastructure failure does (p_counts_attempt; counting again from 1 when this execution committed a checkpoint, _made_progress), and past max_recovery_attempts the run is dead-lettered instead.';

insert into runledger.migrations (version, name) values (2, '0002_runs');
