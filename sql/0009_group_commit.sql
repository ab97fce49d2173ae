-- 0009_group_commit: a worker sends the checkpoints and completions of its concurrent
-- runs that are ready at the same moment in one call, so they share one round trip and
-- one commit.
--
--   runledger._commit_batch(items)       the group commit: one row per item, its error if any
--   runledger._commit_fast(items)        the common items of a batch, written together
--   runledger._commit_and_claim(...)     a group commit and a claim in one transaction
--
-- The common items (a plain checkpoint, or a completion with its last step, of a
-- RUNNING run under its token, before its deadline, with no charge or one within every
-- limit, without a no-progress limit) are written together by _commit_fast, a few statements for the whole batch
-- instead of a few per item. Every other item, and every item of a batch whose fast
-- part failed (it is undone as a whole), goes through the same functions as a single
-- write, each in its own subtransaction: one item's error (a lost lease, a deadline, a
-- cancel) is reported for that item alone and undoes only its own writes.

create function runledger._commit_fast(p_items jsonb) returns int[]
language plpgsql volatile as $$
declare
  v_now       timestamptz := runledger.now();
  v_ids       text[];
  v_fast      int[];
  v_written   int;
  v_parents   text[];
  v_children  text[];
  v_queues    text[];
  v_queue     text;
  v_done      text[];
  i           int;
begin
  -- Every run of the batch, locked in run_id order (as the heartbeat locks them), and
  -- the items that can take the fast path. A run named twice takes the careful path.
  -- (The ids as an array: joined to the JSON instead, the planner guessed 100 items and
  -- read the whole runs table.)
  v_ids := array(select distinct e.value->>'run_id' from jsonb_array_elements(p_items) e);
  with items as (
    select (e.ordinality - 1)::int as idx, e.value as v
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
    join locked l on l.run_id = it.v->>'run_id'
   where it.v->>'op' in ('checkpoint', 'complete') and it.v ? 'seq'
     -- A charge within every limit is written here too; one that passes a limit stops the
     -- run, which _charge does on the careful path.
     and (runledger._no_charge(it.v->'charge')
          or runledger._charge_fits(l.budget, l.budget_spent, l.budget_limits, l.budget_used, it.v->'charge'))
     and l.fencing_token = (it.v->>'token')::bigint and l.status = 'RUNNING'
     and l.no_progress is null and (l.deadline_at is null or l.deadline_at > v_now)
     and (select count(*) from items other where other.v->>'run_id' = it.v->>'run_id') = 1;
  if v_fast is null then
    return '{}';
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
       and r.run_id = e.value->>'run_id' and r.run_id = any(v_ids)
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
    into v_parents, v_children, v_queues, v_done
    from done d;
  -- As _finished: tell the callers awaiting these runs (one notification for the batch),
  -- wake the parents, and admit the next runs of queues with limits.
  if v_done is not null then
    perform runledger._announce_finished(v_done);
  end if;
  for i in 1 .. coalesce(cardinality(v_parents), 0) loop
    perform runledger._wake(v_parents[i], 'child', v_children[i]);
  end loop;
  foreach v_queue in array coalesce(v_queues, '{}') loop
    perform runledger._admit_later(v_queue);
  end loop;
  return v_fast;
end;
$$;
comment on function runledger._commit_fast(jsonb) is
  'The fast part of _commit_batch: locks every run of the batch in run_id order, then writes together the items that are plain checkpoints or completions with their last step of RUNNING runs under their token, before the deadline, with no charge or one within every limit (_charge_fits; it is added to the run''s budgets), without a no-progress limit (the checks _checkpoint and _complete_with_checkpoint make). Returns the indexes it wrote; raises (and is undone as a whole) when one of them cannot be written.';

create function runledger._commit_batch(p_items jsonb)
returns table (item int, code text, message text, run_status text)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_item jsonb;
  v_index int := 0;
  v_run runledger.runs;
  v_fast int[] := '{}';
begin
  if jsonb_typeof(p_items) is distinct from 'array' then
    raise exception using errcode = 'RL003', message = format('_commit_batch: items must be a JSON array, not %s', coalesce(jsonb_typeof(p_items), 'null'));
  end if;
  -- Slots freed by the batch's completions are refilled once per queue, at the end.
  perform set_config('runledger.admit_pending', ',', true);
  if jsonb_array_length(p_items) > 1 then
    begin
      v_fast := runledger._commit_fast(p_items);
    exception when others then
      v_fast := '{}'; -- undone: every item takes the careful path below
    end;
  end if;
  for v_item in select value from jsonb_array_elements(p_items) loop
    item := v_index;
    code := null;
    message := null;
    run_status := null;
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
      exception when others then
        code := sqlstate;
        message := sqlerrm;
      end;
    end if;
    return next;
    v_index := v_index + 1;
  end loop;
  perform runledger._admit_collected();
end;
$$;
comment on function runledger._commit_batch(jsonb) is
  'Group commit for a worker: a JSON array of items, each {"op": "checkpoint"} (the arguments of _checkpoint by name: run_id, token, seq, name, kind, status, output, error, attempts, started_ms_ago, charge (absent when none)) or {"op": "complete"} (those of _complete_run, or of _complete_with_checkpoint when it has "seq"; the step''s result is "step_output"; "verification" the evidence of the workflow''s verify), done in one transaction: the common ones together (_commit_fast), the others one by one, each in a subtransaction. One row per item: its index, the SQLSTATE and message of its error (null when it committed), and the run''s status after it (a completion: SUCCEEDED, or the status a charge past the budget ended it with).';

-- A worker whose batch completes runs refills the slots they free in the same
-- transaction: one round trip and one commit for both.
create function runledger._commit_and_claim(
  p_items jsonb, p_worker_id text, p_queues text[], p_workflows text[], p_limit int, p_lease_ms int)
returns table (item int, code text, message text, run_status text, claimed jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  return query select b.item, b.code, b.message, b.run_status, null::jsonb from runledger._commit_batch(p_items) b;
  begin
    -- Rows as _claim_batch returns them (a claimed run each, and the row with only
    -- next_due_in_ms when fewer than p_limit were claimed), one JSON object per row.
    return query select null::int, null::text, null::text, null::text, to_jsonb(c)
      from runledger._claim_batch(p_worker_id, p_queues, p_workflows, p_limit, p_lease_ms) c;
  exception when others then
    -- The items stand; only the claim is lost (its runs stay claimable).
    return query select null::int, sqlstate::text, sqlerrm, null::text, null::jsonb;
  end;
end;
$$;
comment on function runledger._commit_and_claim(jsonb, text, text[], text[], int, int) is
  'Group commit (_commit_batch) and then a claim (_claim_batch) in one transaction. Rows with item set answer the items; rows with item null carry the claim''s rows as JSON in claimed, or, when the claim failed, its SQLSTATE and message (the items are committed regardless).';

insert into runledger.migrations (version, name) values (9, '0009_group_commit');
