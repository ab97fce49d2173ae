-- 0009_queues: queues and admission: concurrency, rate limits, priorities, fairness.
--
-- tables: queues, admissions
-- indexes: runs_admission_key, runs_queue_active, admissions_window, runs_admission_order
-- functions: _queue_limited, _admit_round, _admit, _admit_queues, _make_runnable, _slot_freed, _admit_all,
--   _set_queue, _admit_first_turns, _admit_deferred

-- Admission picks from the runs not yet admitted, per queue, by priority then age.
create index runs_admission_key on runledger.runs (queue_name, coalesce(concurrency_key, ''), priority, created_at, run_id)
  where status = 'PENDING' and not admitted;

-- Admission counts what occupies a queue's slots.
create index runs_queue_active on runledger.runs (queue_name, concurrency_key)
  where status in ('RUNNING', 'CANCELLING');

create table runledger.queues (
  name                 text collate "C" primary key check (name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$'),
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
  queue_name  text collate "C" not null,
  admitted_at timestamptz not null
);
comment on table runledger.admissions is
  'Admission times of rate-limited queues, kept for one rate-limit period: the sliding window the limit is counted over.';

create index admissions_window on runledger.admissions (queue_name, admitted_at);

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
create function runledger._admit_round(p_queue text, p_max int default 1000)
returns table (run_id text, admitted_at timestamptz)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_q      runledger.queues;
  v_now    timestamptz := runledger.now();
  v_active int;
  v_free   int := p_max;
  v_recent int;
  v_count  int := 0;
  v_first  text[];
begin
  -- One admitter per queue at a time: the count below and the admissions after it are
  -- then consistent, whatever number of workers and starts run concurrently.
  select * into v_q from runledger.queues where name = p_queue for update;
  if not found or v_q.paused then
    return;
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
    return;
  end if;

  -- A round with few free slots is most often settled by the queue's oldest waiting runs
  -- (_admit_first_turns); past 64 slots the shortcut would read too many of them to pay.
  if v_free <= 64 then
    v_first := runledger._admit_first_turns(p_queue, v_free, v_now);
  end if;
  if v_first is null then
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
    select coalesce(array_agg(ch.run_id order by ch.ord), '{}') into v_first from chosen ch;
  end if;
  v_count := cardinality(v_first);
  if v_count > 0 then
    perform runledger._dispatch(null, p_queue); -- one announcement for the round
    if v_q.rate_limit_max is not null then
      insert into runledger.admissions (queue_name, admitted_at) select p_queue, v_now from generate_series(1, v_count);
    end if;
  end if;
  -- One microsecond apart, in the round's order: workers claim admitted runs by
  -- admitted_at, so a claim smaller than this round keeps its fairness.
  return query select f.run_id, v_now + (f.ord - 1) * interval '1 microsecond'
                 from unnest(v_first) with ordinality f(run_id, ord) order by f.ord;
end;
$$;
comment on function runledger._admit_round(text, int) is
  'An admission round for one queue, under its row lock (held to the end of the transaction): the PENDING runs that fill its free slots (concurrency, per-key concurrency, rate limit; none when paused) by priority (lower first), then fair turns across concurrency keys, then age, each with the admitted_at that keeps that order. Work-conserving. Records the round in admissions (a rate-limited queue) and dispatches it, but leaves the runs as they are: _admit writes them admitted; a group commit with a claim (_commit_and_claim) hands them to its claim first. A round of at most 64 free slots first tries _admit_first_turns (the oldest waiting runs); otherwise, or when those do not settle it, it reads the head of every key with runs waiting.';

create function runledger._admit(p_queue text, p_max int default 1000) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_count int;
begin
  -- Found by run_id, with no status in the condition: `status = 'PENDING' and not admitted`
  -- would prove the predicate of runs_admission_key and runs_admission_order, and a plan
  -- cached while the table was empty walked runs_admission_key for each run
  -- (test/plans.slow.test.ts, PostgreSQL 17).
  update runledger.runs r
     set admitted = true, admitted_at = c.admitted_at
    from runledger._admit_round(p_queue, p_max) c
   where r.run_id = c.run_id and not r.admitted;
  get diagnostics v_count = row_count;
  return v_count;
end;
$$;
comment on function runledger._admit(text, int) is
  'Admission for one queue: an _admit_round, its runs written admitted with the admitted_at the round gave each. Returns how many it admitted.';

-- A batch (a group commit, _start_many) that freed slots in or started runs in several
-- queues admits each once, at its end, in name order: two such transactions take the queues'
-- row locks in the same order and cannot wait on each other in a cycle (in the order of
-- their items, two workers completing runs of two queues with limits could deadlock).
create function runledger._admit_queues(p_queues text[], p_defer boolean default false) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_queue    text;
  v_deferred jsonb := '[]';
begin
  if coalesce(cardinality(p_queues), 0) = 0 then
    return case when p_defer then '[]'::jsonb end;
  end if;
  for v_queue in select distinct q from unnest(p_queues) q where runledger._queue_limited(q) order by q loop
    if p_defer then
      v_deferred := v_deferred || coalesce((select jsonb_agg(jsonb_build_object('q', v_queue, 'id', c.run_id, 'at', c.admitted_at))
                                              from runledger._admit_round(v_queue) c), '[]');
    else
      perform runledger._admit(v_queue);
    end if;
  end loop;
  return case when p_defer then v_deferred end;
end;
$$;
comment on function runledger._admit_queues(text[], boolean) is
  'The end of a batch: an admission round for each queue of p_queues that has limits, in name order, so that concurrent batches lock the queues in the same order. With p_defer (a group commit with a claim, _commit_and_claim) the rounds'' runs are not written: they are returned as [{q, id, at}] for the claim (_claim_batch''s p_deferred) and for _admit_deferred; otherwise null.';

create function runledger._make_runnable(p_run_id text, p_delay_ms bigint default 0) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run runledger.runs;
begin
  select * into v_run from runledger.runs where run_id = p_run_id;
  if runledger._queue_limited(v_run.queue_name) then
    update runledger.runs
       set admitted = false,
           not_before = case when p_delay_ms > 0 then runledger._ms_after(runledger.now(), p_delay_ms, '_make_runnable') else not_before end
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
comment on function runledger._make_runnable(text, bigint) is
  'Every move of a run into PENDING ends here: dispatched at once (after p_delay_ms) in a queue without limits, else left to admission.';

create function runledger._slot_freed(p_run_id text) returns void
language plpgsql volatile as $$
declare
  v_queue text;
begin
  select queue_name into v_queue from runledger.runs where run_id = p_run_id;
  if runledger._queue_limited(v_queue) then
    perform runledger._admit(v_queue);
  end if;
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

-- A queue's runs waiting for admission in the order the round's rule ranks them within a
-- turn: priority, age, id. The same predicate as runs_admission_key, so it has the same
-- entries (only runs of queues with limits ever wait for admission).
create index runs_admission_order on runledger.runs (queue_name, priority, created_at, run_id)
  where status = 'PENDING' and not admitted;

-- The rule (_admit): every due waiting run has a turn, its place among its key's due waiting
-- runs after the runs its key already has in slots; a round takes the runs ranked first by
-- (priority, turn, age, id). The smallest rank there can be is (p, 1), p the smallest
-- priority waiting: the head of a key with no run in a slot, whose head has priority p. Read
-- in (priority, age, id) order, a key's first run is its head, so the oldest waiting runs
-- name the best first turns in order. When the first 4 × free + 32 of them hold `free` such
-- heads, those are the round's answer: every other run ranks after them. Otherwise (one key
-- holding the oldest runs, keys busy, several priorities) it returns null and the caller
-- reads every key's head.
create function runledger._admit_first_turns(p_queue text, p_free int, p_now timestamptz) returns text[]
language plpgsql stable
set enable_seqscan = off set jit = off as $$
declare
  v_ids text[];
begin
  if p_free is null or p_free < 1 then
    return null;
  end if;
  with oldest as materialized (
    select r.run_id, coalesce(r.concurrency_key, '') as k, r.priority, r.created_at
      from runledger.runs r
     where r.queue_name = p_queue and r.status = 'PENDING' and not r.admitted
       and (r.not_before is null or r.not_before <= p_now)
     order by r.priority, r.created_at, r.run_id
     limit 4 * p_free + 32),
  heads as (
    select distinct on (o.k) o.run_id, o.k, o.priority, o.created_at
      from oldest o
     order by o.k, o.priority, o.created_at, o.run_id),
  busy as (
    select distinct coalesce(r.concurrency_key, '') as k from runledger.runs r
     where r.queue_name = p_queue and (r.status in ('RUNNING', 'CANCELLING') or (r.status = 'PENDING' and r.admitted)))
  select array_agg(f.run_id order by f.created_at, f.run_id) into v_ids
    from (select h.run_id, h.created_at from heads h
           where h.priority = (select min(o.priority) from oldest o)
             and not exists (select 1 from busy b where b.k = h.k)
           order by h.created_at, h.run_id
           limit p_free) f;
  if coalesce(cardinality(v_ids), 0) < p_free then
    return null;
  end if;
  return v_ids;
end;
$$;
comment on function runledger._admit_first_turns(text, int, timestamptz) is
  'Part of _admit: the p_free runs an admission round of p_queue takes, in its order, when they are all first turns of the smallest priority waiting (heads of keys with no run in a slot) found among the queue''s 4 × p_free + 32 oldest due waiting runs (index runs_admission_order); null when those do not settle the round. Reads only; the caller holds the queue''s row lock.';

-- The runs the rounds of a group commit with a claim chose (_admit_queues with p_defer) and
-- its claim did not take: admitted now, each with the admitted_at its round gave it, so the
-- order of every later claim is the round's. A run that is no longer waiting (cancelled,
-- ended by its deadline) is left as it is.
create function runledger._admit_deferred(p_deferred jsonb) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_deferred is null or jsonb_array_length(p_deferred) = 0 then
    return;
  end if;
  -- `admitted is not true` rather than `not admitted`, so that no plan walks
  -- runs_admission_key for each run (see _admit).
  update runledger.runs r
     set admitted = true, admitted_at = d.at
    from jsonb_to_recordset(p_deferred) d(id text, at timestamptz)
   where r.run_id = d.id and r.status = 'PENDING' and r.admitted is not true;
end;
$$;
comment on function runledger._admit_deferred(jsonb) is
  'The end of _commit_and_claim: admits the runs its admission rounds chose (p_deferred, [{q, id, at}], from _admit_queues) and its claim did not take, with the admitted_at each round gave them.';

insert into runledger.migrations (version, name) values (9, '0009_queues');
