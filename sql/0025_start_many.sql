-- 0025_start_many: engine.start calls that arrive together share one statement and one commit.
--
-- Defines:
--   runledger._start_many(items)   for each item, in order, in one transaction: _start_claimed (a run this
--                                  process's worker takes) or start_run's start
--
-- Why: a closed loop of callers that each start a run and await its result (a web handler's
-- pattern) committed every start on its own: one round trip, one transaction and one WAL
-- flush per run, most of the server's statements. A process sends the starts that arrive
-- while one is in flight together, as its worker's group commit sends checkpoints
-- (src/engine/client/start-batch.ts).

create function runledger._start_many(p_items jsonb)
returns table (
  item int, run_id text, claimed boolean, workflow_name text, workflow_version text, input jsonb, fencing_token bigint,
  recovery_attempts int, max_steps int, budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb,
  traceparent text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_item  jsonb;
  v_index int := 0;
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003',
      message = format('_start_many: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  -- No subtransaction per item: an error undoes the whole statement, and the caller sends
  -- each of its items again alone, so every start gets its own answer. Errors are rare
  -- (the engine checks the inputs first); a subtransaction per item would cost every batch.
  -- Queues with limits admit once each at the end, in name order (_admit_later,
  -- _admit_collected), as a group commit does: a batch that took one queue's row lock per
  -- item, in its items' order, could wait on a group commit that holds another's.
  perform set_config('runledger.admit_pending', ',', true);
  for v_item in select value from jsonb_array_elements(p_items) loop
    if jsonb_typeof(v_item) <> 'object'
       or (v_item ? 'worker_id' and (jsonb_typeof(v_item->'lease_ms') is distinct from 'number' or v_item->>'lease_ms' !~ '^\d{1,9}$')) then
      raise exception using errcode = 'RL003',
        message = format('_start_many: item %s must be an object {workflow, input, options[, worker_id, lease_ms (a whole number)]}, not %s',
                         v_index, left(v_item::text, 200));
    end if;
    if v_item ? 'worker_id' then
      return query
        select v_index, s.run_id, s.claimed, s.workflow_name, s.workflow_version, s.input, s.fencing_token, s.recovery_attempts,
               s.max_steps, s.budget, s.budget_spent, s.budget_limits, s.budget_used, s.traceparent
          from runledger._start_claimed(v_item->>'workflow', v_item->'input', v_item->'options', v_item->>'worker_id',
                                        (v_item->>'lease_ms')::int) s;
    else
      -- As start_run (its announcement included: identical notifications of one transaction are sent once).
      return query
        select v_index, (s.run).run_id, false, null::text, null::text, null::jsonb, null::bigint, null::int, null::int,
               null::numeric, null::numeric, null::jsonb, null::jsonb, null::text
          from runledger._start(v_item->>'workflow', v_item->'input', v_item->'options') s;
    end if;
    v_index := v_index + 1;
  end loop;
  perform runledger._admit_collected();
end;
$$;
comment on function runledger._start_many(jsonb) is
  'Several engine.start calls of one process in one transaction, one per element of p_items ({workflow, input, options, worker_id, lease_ms}), in order: with worker_id, runledger._start_claimed (the run claimed for that worker of the calling process when it can be); without, the start start_run makes. Queues with limits admit once each at the end, in name order (so a run of such a queue is not claimed at its start here; admission announces it). One row per item, numbered from 0, with _start_claimed''s columns (claimed false and nulls for a start without a worker). An error in any item undoes them all (the engine then starts each alone).';

insert into runledger.role_functions (role_name, function_name) values ('runledger_worker', '_start_many');
select runledger._secure_functions();
-- A new function: the worker role gets it here when it exists (grant_roles() does the same
-- for every role, when the migrating role may run it).
do $$
begin
  if exists (select from pg_roles where rolname = 'runledger_worker') then
    grant execute on function runledger._start_many(jsonb) to runledger_worker;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (25, '0025_start_many');
