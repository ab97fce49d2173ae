-- 0015_completion: one fast path for a completion. A group commit of one item takes the
-- set-based fast part (_commit_fast) as larger batches do, and _complete_with_checkpoint
-- keeps only the general path, so a run's SUCCEEDED row is written in two places: the fast
-- part, and _finish_run (every terminal write).
--
-- redefines: _complete_with_checkpoint, _commit_fast, _commit_items

-- The completion with its last step, on the general path: the checkpoint (fenced, charged,
-- the no-progress limit checked), then the run's terminal write (_finish_run). The common
-- case (a RUNNING run under its token, before its deadline, no charge past a limit, no
-- no-progress limit) is written by the group commit's fast part (_commit_fast), for a batch
-- of one too; this function writes the others, and says what failed.
create or replace function runledger._complete_with_checkpoint(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_status text,
  p_step_output jsonb, p_error jsonb, p_attempts int, p_started_ms_ago bigint, p_charge jsonb,
  p_output jsonb, p_policy_version text, p_verification jsonb default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
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
  'Fenced, the general path of a completion with its last step: writes the step''s checkpoint (_checkpoint_row: charge, no-progress limit) and completes the run (_finish_run) in one transaction, unless the checkpoint itself ended the run (e.g. over budget). The common case is written by _commit_fast.';

-- The common items of a group commit (a plain checkpoint, or a completion with its last step,
-- of a RUNNING run under its token, before its deadline, with no charge or one within every
-- limit, without a no-progress limit) are written together by _commit_fast, a few statements
-- for the whole batch instead of a few per item. Every other item, and every item of a batch
-- whose fast part failed (it is undone as a whole), goes through the same functions as a
-- single write, each in its own subtransaction (_commit_batch): one item's error (a lost
-- lease, a deadline, a cancel) is reported for that item alone and undoes only its own writes.
create or replace function runledger._commit_fast(p_items jsonb, out written int[], out freed_queues text[])
language plpgsql volatile
-- Every batch comes here, a batch of one too. The statements read the items from the jsonb
-- argument, so PL/pgSQL's plan cache never finds a generic plan cheaper than a custom one and
-- would plan each statement again on every call; the plans are the same for any batch (a
-- function scan of the items, the runs by their key), so the generic ones are kept.
set plan_cache_mode = force_generic_plan as $$
declare
  v_now       timestamptz := runledger.now();
  v_ids       text[];
  v_fast      int[];
  v_written   int;
  v_parents   text[];
  v_children  text[];
  v_done      text[];
  v_charged   boolean;
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
  select array_agg(it.idx), bool_or(not runledger._no_charge(it.v->'charge')) into v_fast, v_charged
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
  if v_charged then
    update runledger.runs r
       set budget_spent = r.budget_spent + coalesce((c.charge->>'units')::numeric, 0),
           budget_used = case when c.charge - 'units' = '{}'::jsonb then r.budget_used
                              else runledger._add_amounts(r.budget_used, c.charge - 'units') end
      from (select e.value->>'run_id' as run_id, runledger._as_charge(e.value->'charge') as charge
              from jsonb_array_elements(p_items) with ordinality e
             where (e.ordinality - 1)::int = any(v_fast) and not runledger._no_charge(e.value->'charge')) c
     where r.run_id = c.run_id and r.run_id = any(v_ids);
  end if;

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
  'The fast part of every group commit (_commit_items), a batch of one included: locks every run of the batch in run_id order, then writes together the items that are plain checkpoints or completions with their last step of RUNNING runs under their token, before the deadline, with no charge or one within every limit (_charge_fits; it is added to the run''s budgets), without a no-progress limit (the checks _checkpoint and _complete_with_checkpoint make). Returns the indexes it wrote and the queues of the runs it completed (the batch admits them at its end); raises (and is undone as a whole) when one of them cannot be written.';

create or replace function runledger._commit_items(p_items jsonb)
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
  -- Every batch, one item included, tries the fast part first: it is the one place a
  -- plain checkpoint or a completion with its last step is written; the items it leaves
  -- (a charge past a limit, a no-progress limit, a stale token, a cancel under way...) take
  -- the general path below.
  if jsonb_array_length(p_items) > 0 then
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
  'The items of a group commit (_commit_batch, _commit_and_claim), in one transaction: the common ones together (_commit_fast, for a batch of one too), the others one by one, each in a subtransaction (a completion there ends its run through _finished, which admits its queue, after the fast part, so that round covers the fast completions of the queue too). One row per item: its index, the SQLSTATE and message of its error (null when it committed) and the run''s status after it; then a closing row with item null and admit_queues, the queues whose slots the fast part freed and no round has covered, for the caller to admit at its end.';

-- CREATE OR REPLACE gave the redefined functions the attributes written above: the granted
-- ones (_complete_with_checkpoint) are made SECURITY DEFINER with their fixed search_path again.
select runledger._secure_functions();

insert into runledger.migrations (version, name) values (15, '0015_completion');
