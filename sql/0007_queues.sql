-- 0007_queues: queues as rows, and admission.
--
--   runledger.queues              per queue: concurrency, per-key concurrency, rate limit, paused
--   runledger.admissions          recent admissions of rate-limited queues (a sliding window)
--   runledger._queue_limited(q)   whether a queue's runs go through admission
--   runledger._admit(queue)       fills a queue's free slots: priority, then fair turns across
--                                 concurrency keys, then age; under the queue row's lock
--   runledger._admit_later(queue) admission after a slot was freed: now, or once per queue at
--                                 the end of a group commit (_admit_collected)
--   runledger._make_runnable(...) every move into PENDING ends here: dispatch now, or admission
--   runledger._slot_freed(run)    a run left its slot (finished, waiting): admit the next one
--   runledger._admit_all(...)     sweeper: admission for every queue with runs waiting for it
--   runledger.set_queue(...)      public: create or change a queue
--
-- Its view runledger.queue_stats (depth, running, oldest pending, per key) is in 0010_views.sql.
--
-- A queue without a row (or with no limit set) costs nothing: its runs are claimable at
-- once. With limits, a run is claimable only when admitted, and admission counts RUNNING
-- runs plus admitted-but-not-yet-claimed ones, so the limit holds across any number of
-- workers. A waiting run holds no slot.

create table runledger.queues (
  name                 text primary key check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'),
  concurrency          int check (concurrency > 0),
  per_key_concurrency  int check (per_key_concurrency > 0),
  rate_limit_max       int check (rate_limit_max > 0),
  rate_limit_period_ms int check (rate_limit_period_ms > 0),
  paused               boolean not null default false,
  updated_at           timestamptz not null default runledger.now(),
  constraint queues_rate_limit_complete check ((rate_limit_max is null) = (rate_limit_period_ms is null))
);
comment on table runledger.queues is
  'Queue limits, enforced by admission in SQL across all workers: concurrency (runs RUNNING at once), per_key_concurrency (per concurrency_key, e.g. a tenant), rate limit (admissions per period), paused. Change with runledger.set_queue.';

create table runledger.admissions (
  queue_name  text not null,
  admitted_at timestamptz not null
);
create index admissions_window on runledger.admissions (queue_name, admitted_at);
comment on table runledger.admissions is
  'Admission times of rate-limited queues, kept for one rate-limit period: the sliding window the limit is counted over.';

create function runledger._queue_limited(p_queue text) returns boolean
language plpgsql stable parallel safe as $$
begin
  return exists (select 1 from runledger.queues q
                  where q.name = p_queue
                    and (q.concurrency is not null or q.per_key_concurrency is not null
                         or q.rate_limit_max is not null or q.paused));
end;
$$;
comment on function runledger._queue_limited(text) is 'True when the queue has a limit or is paused: its runs go through admission.';

-- Each run admitted in a round gets its own admitted_at, in the round's order (priority,
-- fair turns, age), and _claim_batch takes a limited queue's admitted runs in that order.
-- With one timestamp for the round, a claim with fewer free slots than the round took
-- the oldest first, and a tenant with a long backlog got ahead of the others again.
create function runledger._admit(p_queue text, p_max int default 1000) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_q      runledger.queues;
  v_now    timestamptz := runledger.now();
  v_active int;
  v_free   int := p_max;
  v_recent int;
  v_count  int := 0;
begin
  -- One admitter per queue at a time: the count below and the admissions after it are
  -- then consistent, whatever number of workers and starts run concurrently.
  select * into v_q from runledger.queues where name = p_queue for update;
  if not found or v_q.paused then
    return 0;
  end if;
  if v_q.concurrency is not null then
    select count(*) into v_active from runledger.runs r
     where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted));
    v_free := least(v_free, v_q.concurrency - v_active);
  end if;
  if v_q.rate_limit_max is not null then
    delete from runledger.admissions a
     where a.queue_name = p_queue and a.admitted_at <= v_now - make_interval(secs => v_q.rate_limit_period_ms / 1000.0);
    select count(*) into v_recent from runledger.admissions a where a.queue_name = p_queue;
    v_free := least(v_free, v_q.rate_limit_max - v_recent);
  end if;
  if v_free <= 0 then
    return 0;
  end if;

  -- One statement for the whole round, in the order (priority, turn, age), where a run's
  -- turn is its place among its key's waiting runs after the ones that key already has
  -- running: ordering by turn interleaves keys, so a tenant with a burst of 50,000 runs
  -- cannot starve one with 10. Each key's first due run (its head) is found by a skip
  -- scan over runs_admission_key, one index probe per key, whatever the backlog. A key's
  -- later runs come after its head in (priority, turn), so they are read only for the
  -- keys whose next turn could still place among the round's v_free best heads; with
  -- many keys and few free slots that is none of them. (Null key counts as ''.)
  with recursive heads(k, run_id, priority, created_at) as (
    (select coalesce(r.concurrency_key, ''), r.run_id, r.priority, r.created_at from runledger.runs r
      where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
        and (r.not_before is null or r.not_before <= v_now)
      order by coalesce(r.concurrency_key, ''), r.priority, r.created_at, r.run_id
      limit 1)
    union all
    select n.* from heads h cross join lateral (
      select coalesce(r.concurrency_key, ''), r.run_id, r.priority, r.created_at from runledger.runs r
       where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
         and (r.not_before is null or r.not_before <= v_now)
         and coalesce(r.concurrency_key, '') > h.k
       order by coalesce(r.concurrency_key, ''), r.priority, r.created_at, r.run_id
       limit 1) n),
  active as (
    select coalesce(r.concurrency_key, '') as k, count(*) as n from runledger.runs r
     where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted))
     group by 1),
  ranked as (
    -- Each head's turn, and how many of its key's runs this round may take at most.
    select h.*, coalesce(a.n, 0) + 1 as turn,
           least(v_free, greatest(coalesce(v_q.per_key_concurrency - coalesce(a.n, 0), v_free), 0)) as room
      from heads h left join active a on a.k = h.k),
  bar as (
    -- The v_free-th best head: a later run of a key places in the round only if its
    -- (priority, turn) is at most this one's. None when there are fewer heads than slots.
    select b.priority, b.turn from ranked b where b.room > 0
     order by b.priority, b.turn, b.created_at, b.run_id offset v_free - 1 limit 1),
  candidates as (
    select k.run_id, k.priority, k.turn, k.created_at from ranked k where k.room > 0
    union all
    select c.run_id, c.priority, k.turn + c.behind as turn, c.created_at
      from ranked k
      cross join lateral (
        select r.run_id, r.priority, r.created_at,
               row_number() over (order by r.priority, r.created_at, r.run_id) as behind
          from runledger.runs r
         where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
           and coalesce(r.concurrency_key, '') = k.k and (r.not_before is null or r.not_before <= v_now)
           and (r.priority, r.created_at, r.run_id) > (k.priority, k.created_at, k.run_id)
         order by r.priority, r.created_at, r.run_id
         limit k.room - 1) c
     where k.room > 1
       and not exists (select 1 from bar where (k.priority, k.turn + 1) > (bar.priority, bar.turn))),
  chosen as (
    select c.run_id, row_number() over (order by c.priority, c.turn, c.created_at, c.run_id) as ord
      from candidates c
     where v_q.per_key_concurrency is null or c.turn <= v_q.per_key_concurrency
     order by c.priority, c.turn, c.created_at, c.run_id
     limit v_free)
  -- One microsecond apart, in the order chosen here: workers claim admitted runs by
  -- admitted_at, so a claim smaller than this round keeps its fairness.
  update runledger.runs r
     set admitted = true, admitted_at = v_now + (ch.ord - 1) * interval '1 microsecond'
    from chosen ch
   where r.run_id = ch.run_id;
  get diagnostics v_count = row_count;
  if v_count > 0 then
    perform runledger._dispatch(null, p_queue); -- one announcement for the round
    if v_q.rate_limit_max is not null then
      insert into runledger.admissions (queue_name, admitted_at) select p_queue, v_now from generate_series(1, v_count);
    end if;
  end if;
  return v_count;
end;
$$;
comment on function runledger._admit(text, int) is
  'Admission for one queue, under its row lock: fills free slots (concurrency, per-key concurrency, rate limit; none when paused) with PENDING runs by priority (lower first), then fair turns across concurrency keys, then age, and dispatches them. Work-conserving. Returns how many it admitted.';

-- A group commit (_commit_batch) frees many slots in one transaction. Each completion in
-- it asks for admission here; the batch admits once per queue at its end (_admit_collected)
-- instead of once per completion, since every round reads each waiting key of the queue.
-- The queues asked for are kept in a transaction-local setting, so a completion undone
-- by its subtransaction takes its request with it. Outside a batch this admits at once.
create function runledger._admit_later(p_queue text) returns void
language plpgsql volatile as $$
declare
  v_pending text := current_setting('runledger.admit_pending', true);
begin
  if not runledger._queue_limited(p_queue) then
    return;
  end if;
  if coalesce(v_pending, '') = '' then
    perform runledger._admit(p_queue);
  elsif position(',' || p_queue || ',' in v_pending) = 0 then
    -- Queue names hold no comma (queues_name_check).
    perform set_config('runledger.admit_pending', v_pending || p_queue || ',', true);
  end if;
end;
$$;
comment on function runledger._admit_later(text) is
  'A slot of p_queue was freed: admits now (a queue with limits), or, inside _commit_batch, once per queue at the end of the batch.';

create function runledger._admit_collected() returns void
language plpgsql volatile as $$
declare
  v_pending text := current_setting('runledger.admit_pending', true);
  v_queue   text;
begin
  perform set_config('runledger.admit_pending', '', true);
  foreach v_queue in array coalesce(string_to_array(trim(both ',' from coalesce(v_pending, '')), ','), '{}') loop
    perform runledger._admit(v_queue);
  end loop;
end;
$$;
comment on function runledger._admit_collected() is
  'The end of a group commit: one admission round for each queue whose slots its completions freed (see _admit_later).';

create function runledger._make_runnable(p_run_id text, p_delay_ms int default 0) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  select * into v_run from runledger.runs where run_id = p_run_id;
  if runledger._queue_limited(v_run.queue_name) then
    update runledger.runs
       set admitted = false,
           not_before = case when p_delay_ms > 0 then runledger.now() + make_interval(secs => p_delay_ms / 1000.0) else not_before end
     where run_id = p_run_id;
    perform runledger._admit(v_run.queue_name);
  else
    if not v_run.admitted then
      update runledger.runs set admitted = true where run_id = p_run_id;
    end if;
    perform runledger._dispatch(p_run_id, v_run.queue_name, p_delay_ms);
  end if;
end;
$$;
comment on function runledger._make_runnable(text, int) is
  'Every move of a run into PENDING ends here: dispatched at once (after p_delay_ms) in a queue without limits, else left to admission.';

create function runledger._slot_freed(p_run_id text) returns void
language plpgsql volatile as $$
declare
  v_queue text;
begin
  select queue_name into v_queue from runledger.runs where run_id = p_run_id;
  perform runledger._admit_later(v_queue);
end;
$$;
comment on function runledger._slot_freed(text) is
  'Called when a run leaves its slot (finished, waiting, cancelled): admits the next run of a queue with limits.';

create function runledger._admit_all(p_limit int default 1000) returns int
language sql volatile
set enable_seqscan = off set jit = off as $$
  -- Sweeper: rate-limit windows that opened, and queues whose limits were raised.
  select coalesce(sum(runledger._admit(q.name, p_limit)), 0)::int
    from runledger.queues q
   where not q.paused
     and exists (select 1 from runledger.runs r where r.queue_name = q.name and r.status = 'PENDING' and not r.admitted)
$$;
comment on function runledger._admit_all(int) is
  'Sweeper: runs admission for every queue with runs waiting for it (a rate-limit window that opened, a raised limit). Returns how many runs it admitted.';

create function runledger._set_queue(p_name text, p_options jsonb) returns runledger.queues
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_opts jsonb := coalesce(p_options, '{}');
  v_key  text;
  v_q    runledger.queues;
begin
  if p_name is null or p_name !~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$' then
    raise exception using errcode = 'RL003', message = format('set_queue: invalid queue name %L', p_name);
  end if;
  if jsonb_typeof(v_opts) <> 'object' then
    raise exception using errcode = 'RL003', message = 'set_queue: options must be a JSON object';
  end if;
  for v_key in select jsonb_object_keys(v_opts) loop
    if v_key not in ('concurrency', 'per_key_concurrency', 'rate_limit_max', 'rate_limit_period_ms', 'paused') then
      raise exception using errcode = 'RL003', message = format('set_queue: unknown option %L', v_key);
    end if;
  end loop;
  perform runledger._check_whole_number(v_opts, 'concurrency', 1);
  perform runledger._check_whole_number(v_opts, 'per_key_concurrency', 1);
  perform runledger._check_whole_number(v_opts, 'rate_limit_max', 1);
  perform runledger._check_whole_number(v_opts, 'rate_limit_period_ms', 1);
  if v_opts ? 'paused' and jsonb_typeof(v_opts->'paused') <> 'boolean' then
    raise exception using errcode = 'RL003', message = 'set_queue: paused must be true or false';
  end if;
  insert into runledger.queues (name) values (p_name) on conflict (name) do nothing;
  -- Keys given replace the current values (null clears a limit); keys not given are kept.
  begin
    update runledger.queues q
       set concurrency = case when v_opts ? 'concurrency' then (v_opts->>'concurrency')::int else q.concurrency end,
           per_key_concurrency = case when v_opts ? 'per_key_concurrency' then (v_opts->>'per_key_concurrency')::int else q.per_key_concurrency end,
           rate_limit_max = case when v_opts ? 'rate_limit_max' then (v_opts->>'rate_limit_max')::int else q.rate_limit_max end,
           rate_limit_period_ms = case when v_opts ? 'rate_limit_period_ms' then (v_opts->>'rate_limit_period_ms')::int else q.rate_limit_period_ms end,
           paused = case when v_opts ? 'paused' then (v_opts->>'paused')::boolean else q.paused end,
           updated_at = runledger.now()
     where q.name = p_name
    returning * into v_q;
  exception when check_violation then
    raise exception using errcode = 'RL003', message = 'set_queue: rate_limit_max and rate_limit_period_ms go together';
  end;
  if runledger._queue_limited(p_name) then
    -- Runs that were dispatched freely before the queue got limits count against them now.
    perform runledger._admit(p_name);
  else
    -- Limits lifted: everything pending goes now.
    perform runledger._make_runnable(r.run_id, 0)
       from runledger.runs r where r.queue_name = p_name and r.status = 'PENDING' and not r.admitted;
  end if;
  return v_q;
end;
$$;
comment on function runledger._set_queue(text, jsonb) is
  'The action behind runledger.set_queue (which records it in audit_log): Creates or changes a queue. Options: concurrency, per_key_concurrency, rate_limit_max with rate_limit_period_ms, paused; a key set to null clears that limit, keys left out are kept. Admits what the new limits allow at once.';

insert into runledger.migrations (version, name) values (7, '0007_queues');
