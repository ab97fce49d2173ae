-- 0029_lean_bulk_starts: what a row of start_runs costs, and the row check every write of a run pays.
--
-- Redefines:
--   runledger._check_run    the same rules, found by one CASE expression instead of a chain of IFs
--   runledger.start_runs    runs without given ids or keys go in by a plain INSERT; the per-input
--                           arrays are read once, not once per row
--
-- Why (callgrind, PostgreSQL 15): a row of a start_runs batch of 1,000 cost 171,000
-- instructions against 76,000 for a job of graphile-worker's add_jobs, and 186,000 with
-- run_ids given, as engine.startMany sent them:
--   * ON CONFLICT DO NOTHING looks every row up in each unique index before inserting it
--     (speculative insertion): about 14,000 instructions a row. It is needed only when the
--     caller gives run ids or idempotency keys; ids made here are new (see v_id_prefix),
--     and engine.startMany now leaves them to the database unless it is given ids or keys.
--   * `v_opts->'run_ids'->>i` per row extracted the whole run_ids array from the options
--     for every row: quadratic in the batch size.
--   * runs_invariants calls _check_run for every row written, on every insert and every
--     update (a claim, a status change, a completion).

-- One CASE expression names the first broken rule (null when none is): PL/pgSQL evaluates
-- it once, where the chain of IF ... ELSIF it replaces evaluated up to eleven conditions,
-- each an expression evaluation of its own, for every row written. The rules, their order,
-- their names and their messages are unchanged. (The rules written into the constraint as
-- an expression instead of a call cost less per row, but PostgreSQL reads a CHECK
-- constraint's stored expression again for every statement that writes the table:
-- 380,000 instructions a statement for that expression, against 40,000 for the call.)
create or replace function runledger._check_run(
  p_run_id text, p_status runledger.run_status, p_finished_at timestamptz, p_termination_reason text,
  p_lease_owner text, p_lease_expires_at timestamptz, p_wait_kind text,
  p_budget numeric, p_max_steps int, p_no_progress int, p_retry_budget int, p_max_recovery_attempts int)
returns boolean
language plpgsql immutable as $$
declare
  v_rule text;
begin
  -- An unbounded class plus length(), not {0,199}: a bounded repetition expands into a
  -- large automaton (about 19 us per row against 0.4 us).
  v_rule := case
    when p_run_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:-]*$' or length(p_run_id) > 200 then 'runs_run_id_check'
    when (p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
         <> (p_finished_at is not null and p_termination_reason is not null) then 'runs_terminal_has_record'
    when p_termination_reason <> all (runledger.termination_reasons()) then 'runs_termination_reason_check'
    when (p_lease_owner is not null) <> (p_lease_expires_at is not null)
         or (p_status not in ('RUNNING', 'CANCELLING') and p_lease_owner is not null)
         or (p_status = 'RUNNING' and p_lease_owner is null) then 'runs_lease_only_when_executing'
    when p_wait_kind <> all (runledger.wait_kinds()) then 'runs_wait_kind_check'
    when (p_status = 'WAITING') <> (p_wait_kind is not null) then 'runs_wait_kind_only_when_waiting'
    when p_budget < 0 then 'runs_budget_check'
    when p_max_steps <= 0 then 'runs_max_steps_check'
    when p_no_progress < 2 then 'runs_no_progress_check'
    when p_retry_budget < 0 then 'runs_retry_budget_check'
    when p_max_recovery_attempts < 0 then 'runs_max_recovery_attempts_check'
  end;
  if v_rule is null then
    return true;
  elsif v_rule = 'runs_run_id_check' then
    raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
      message = format('run_id %L is invalid: 1 to 200 letters, digits and _.:- starting with a letter or digit', p_run_id);
  end if;
  raise exception using errcode = '23514', constraint = v_rule, table = 'runs', schema = 'runledger',
    message = format('new row for relation "runs" violates check constraint "%s" (status %s)', v_rule, p_status);
end;
$$;

create or replace function runledger.start_runs(p_workflow text, p_inputs jsonb, p_options jsonb default '{}')
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
  -- elements, fewer than 10^9). Per row that is one lpad: encoding 80 bits per row cost
  -- 8 % of a row's instructions (callgrind, PostgreSQL 15). Two statements in the same
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
        coalesce(greatest(0, ceil(extract(epoch from v_t.not_before - v_t.created_at) * 1000))::int, 0));
    end if;
  end if;
  return v_ids;
end;
$$;
comment on function runledger.start_runs(text, jsonb, jsonb) is
  'Starts one run of a registered workflow per element of the JSON array p_inputs, in one statement, and announces its queue once; returns the run ids in input order. Options as start_run''s, for every run, except run_ids, idempotency_keys and concurrency_keys: arrays with one entry per input (null for none). An input whose run_id or idempotency key already has a run gives that run''s id (idempotent, per input); a run_id of another workflow is RL005. Without run_ids and idempotency_keys every run is new and gets an id made here (a ULID, in input order).';

-- start_runs runs as its owner with a fixed search_path again (CREATE OR REPLACE reset
-- them), as every function of role_functions (0017); its grants are kept.
select runledger._secure_functions();

insert into runledger.migrations (version, name) values (29, '0029_lean_bulk_starts');
