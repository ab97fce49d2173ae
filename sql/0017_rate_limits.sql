-- 0017_rate_limits: limits shared by every run and worker on calls to an outside provider. A
-- key (a provider, an account, an endpoint) allows at most max_calls calls in any window of
-- length per (a sliding log of the calls let through), and can be paused until a time (a
-- provider said Retry-After: the circuit is open for everyone until then). A step, an
-- operation, a tool or a model call that names the key asks for a permit before each attempt;
-- one refused waits, in memory when the wait is short, else as a durable wait (wait_kind
-- rate_limit) that holds no worker.
--
-- tables: rate_limit_keys, rate_limit_calls, rate_limit_waiters
-- views: rate_limits
-- redefines: wait_kinds
-- functions: set_rate_limit, pause_rate_limit, resume_rate_limit,
--   delete_rate_limit, _rate_limit_acquire, _rate_limit_pause, _rate_limit_wait, _wake_rate_limited

-- What a WAITING run waits for: rate_limit is new (a permit of a shared rate limit).
create or replace function runledger.wait_kinds() returns text[]
language sql immutable as $$
  select array['timer', 'signal', 'approval', 'child', 'retry', 'reconcile', 'rate_limit']
$$;
comment on function runledger.wait_kinds() is
  'What a WAITING run waits for (runs.wait_kind); see docs/state-machine.md.';

create table runledger.rate_limit_keys (
  key          text collate "C" primary key check (key ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$'),
  -- null: no limit on calls (the key only carries pauses).
  max_calls    int check (max_calls between 1 and 1000000),
  per          interval check (per > interval '0' and per <= interval '1 day'),
  paused_until timestamptz,
  -- Why: the error that paused it (its code, message, status) or the operator's note.
  pause_reason jsonb,
  updated_at   timestamptz not null default runledger.now(),
  check ((max_calls is null) = (per is null))
);
comment on table runledger.rate_limit_keys is
  'Shared rate limits (set_rate_limit): at most max_calls calls in any window of length per for every step, operation, tool or model call that names the key, across every run and worker; paused_until (pause_rate_limit, or a call that failed with Retry-After) lets no call through before it. max_calls null: the key only carries pauses.';

create table runledger.rate_limit_calls (
  key    text collate "C" not null references runledger.rate_limit_keys on delete cascade,
  at     timestamptz not null,
  run_id text collate "C" not null,
  seq    int not null
);
create index rate_limit_calls_key_at on runledger.rate_limit_calls (key, at);
comment on table runledger.rate_limit_calls is
  'The calls let through on each limited key within its last window (older ones are deleted as new ones come): when, and by which run and step position.';

create table runledger.rate_limit_waiters (
  run_id text collate "C" not null,
  seq    int not null,
  key    text collate "C" not null,
  since  timestamptz not null default runledger.now(),
  -- When the permit is expected: the next free place in the window, or the end of a pause.
  until  timestamptz not null,
  primary key (run_id, seq)
);
create index rate_limit_waiters_key on runledger.rate_limit_waiters (key);
comment on table runledger.rate_limit_waiters is
  'Step positions refused a permit and waiting for one (in a worker''s memory, or as a WAITING run with wait_kind rate_limit): which key, since when, until when. The row goes when the permit is given, or when a caller of the key finds its run ended or gone; until then the view rate_limits does not count it.';

-- One permit for (run, seq) on a key, or how long to wait for it. The key's row is locked, so
-- the callers of one key take their places one at a time, and places go first come, first
-- served: a caller is let through only when the free places outnumber the callers that have
-- waited longer, and a caller that must wait is told when its own place is due, counting
-- those ahead of it, so a long line parks durably instead of asking again every window.
create function runledger._rate_limit_acquire(p_run_id text, p_token bigint, p_seq int, p_key text)
returns table (granted boolean, wait_ms bigint)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_now   timestamptz;
  v_limit runledger.rate_limit_keys;
  v_since timestamptz;
  v_ahead int;
  v_used  int := 0;
  v_place int;
  v_at    timestamptz;
  v_until timestamptz;
  v_hold  interval;
begin
  perform runledger._fence(p_run_id, p_token);
  select * into v_limit from runledger.rate_limit_keys k where k.key = p_key for update;
  -- Read after the lock (runledger.now() is the clock, not the transaction's start): a caller
  -- that waited for the lock counts the calls let through meanwhile.
  v_now := runledger.now();
  if v_limit.key is null then
    delete from runledger.rate_limit_waiters w where w.run_id = p_run_id and w.seq = p_seq;
    return query select true, 0::bigint;
    return;
  end if;
  -- A call holds its place for per and a tenth more (at most a second): it reaches the
  -- provider a little after its permit, later when the worker's event loop is busy, and
  -- without the margin two calls a window apart by their permits could land closer at the
  -- provider. (The view rate_limits counts the same way.)
  v_hold := v_limit.per + least(v_limit.per * 0.1, interval '1 second');
  -- A waiter whose run ended without its permit (cancelled while parked, past its deadline)
  -- or is gone (pruned) waits for nothing: its row goes as it is met.
  delete from runledger.rate_limit_waiters w
   where w.key = p_key
     and not exists (select 1 from runledger.runs r where r.run_id = w.run_id and not runledger.is_terminal(r.status));
  -- Those ahead: callers of the key waiting since before this one (all of them, for a new
  -- caller), whose runs go on and who came back when their place was due (one gone for
  -- longer than a window, its worker stopped or its queue paused, holds up nobody).
  select w.since into v_since from runledger.rate_limit_waiters w where w.run_id = p_run_id and w.seq = p_seq;
  select count(*) into v_ahead from runledger.rate_limit_waiters w join runledger.runs r on r.run_id = w.run_id
   where w.key = p_key and (w.run_id, w.seq) <> (p_run_id, p_seq) and (v_since is null or w.since < v_since)
     and w.until > v_now - coalesce(v_hold, interval '1 second') and not runledger.is_terminal(r.status);
  if v_limit.paused_until > v_now then
    v_until := v_limit.paused_until + case when v_limit.max_calls is null then interval '0' else v_hold * (v_ahead / v_limit.max_calls) end;
  elsif v_limit.max_calls is not null then
    delete from runledger.rate_limit_calls c where c.key = p_key and c.at <= v_now - v_hold;
    select count(*) into v_used from runledger.rate_limit_calls c where c.key = p_key;
    if v_used + v_ahead >= v_limit.max_calls then
      -- This caller's place is the (v_place + 1)-th to free. The max_calls places free once a
      -- window, round after round: those of the calls in the window a window after each
      -- call, oldest first, and the free ones (taken now by those ahead) a window from now.
      v_place := v_used + v_ahead - v_limit.max_calls;
      if v_place % v_limit.max_calls < v_used then
        select c.at into v_at from runledger.rate_limit_calls c where c.key = p_key order by c.at offset v_place % v_limit.max_calls limit 1;
      else
        v_at := v_now;
      end if;
      v_until := v_at + v_hold * (1 + v_place / v_limit.max_calls);
    end if;
  end if;
  if v_until is null then
    if v_limit.max_calls is not null then
      insert into runledger.rate_limit_calls (key, at, run_id, seq) values (p_key, v_now, p_run_id, p_seq);
    end if;
    delete from runledger.rate_limit_waiters w where w.run_id = p_run_id and w.seq = p_seq;
    return query select true, 0::bigint;
    return;
  end if;
  insert into runledger.rate_limit_waiters (run_id, seq, key, since, until) values (p_run_id, p_seq, p_key, v_now, v_until)
  on conflict on constraint rate_limit_waiters_pkey do update set key = excluded.key, until = excluded.until;
  return query select false, greatest(1, ceil(extract(epoch from v_until - v_now) * 1000))::bigint;
end;
$$;
comment on function runledger._rate_limit_acquire(text, bigint, int, text) is
  'Fenced: a permit for one attempt of the call at (run, seq) on a shared rate limit key, first come first served: granted (the call logged in rate_limit_calls) when the key is not paused and the places left in the window (max_calls, each held for per and a tenth more, at most a second) outnumber the callers waiting since before this one; else not granted, with the milliseconds until this caller''s place is due (counting those ahead) or the pause ends, and the caller kept in rate_limit_waiters (its first since kept, which holds its place in line). A waiter whose run ended, or who has not come back for a window after its place was due, is not counted ahead; the rows of waiters whose run ended or is gone are deleted as the key''s callers meet them. A key with no row is not limited.';

-- A call on the key failed with Retry-After (or a 429/503 carrying it): nobody calls before then.
create function runledger._rate_limit_pause(p_run_id text, p_token bigint, p_key text, p_ms bigint, p_reason jsonb)
returns timestamptz
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_until timestamptz;
begin
  perform runledger._fence(p_run_id, p_token);
  v_until := runledger._ms_after(runledger.now(), p_ms, '_rate_limit_pause: p_ms');
  insert into runledger.rate_limit_keys as k (key, paused_until, pause_reason)
  values (p_key, v_until, p_reason || jsonb_build_object('run_id', p_run_id))
  on conflict (key) do update
     set paused_until = greatest(k.paused_until, excluded.paused_until),
         pause_reason = case when k.paused_until >= excluded.paused_until then k.pause_reason else excluded.pause_reason end,
         updated_at = runledger.now();
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'rate_limit_paused', jsonb_build_object('key', p_key, 'until', v_until, 'reason', p_reason), p_token);
  return (select paused_until from runledger.rate_limit_keys where key = p_key);
end;
$$;
comment on function runledger._rate_limit_pause(text, bigint, text, bigint, jsonb) is
  'Fenced: a call on a shared rate limit key failed with a Retry-After (RetryAfterError, or HTTP 429/503 carrying one): the key is paused for every run for p_ms from now (a longer pause already set stays), with the reason; recorded as the run''s event rate_limit_paused. Returns the key''s paused_until.';

-- A permit too far off to wait for in memory: the step position keeps a WAITING row with the
-- attempt it is at, and the run waits, holding no worker, until the permit is expected.
create function runledger._rate_limit_wait(
  p_run_id text, p_token bigint, p_seq int, p_name text, p_kind text, p_attempt int, p_key text, p_wait_ms bigint)
returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_run  runledger.runs := runledger._fence(p_run_id, p_token);
  v_wake timestamptz := runledger._ms_after(runledger.now(), p_wait_ms, '_rate_limit_wait: p_wait_ms');
begin
  -- attempt is the attempt already made: the one waiting for its permit is the next.
  insert into runledger.steps (run_id, seq, name, kind, status, output, attempts, started_at, finished_at, fencing_token)
  values (p_run_id, p_seq, p_name, p_kind, 'WAITING',
          jsonb_build_object('attempt', p_attempt - 1, 'wake_at', v_wake, 'rate_limit', p_key), p_attempt - 1,
          runledger.now(), runledger.now(), p_token)
  on conflict (run_id, seq) do update set output = excluded.output, attempts = excluded.attempts, fencing_token = excluded.fencing_token
   where runledger.steps.status = 'WAITING';
  if p_kind = 'operation' then
    -- The operation's intent (STARTED) was recorded but the call was not made: it waits for the
    -- permit, so the ledger says PLANNED (called when the run resumes), never UNKNOWN.
    update runledger.operations o set status = 'PLANNED', attempts = greatest(o.attempts - 1, 0), updated_at = runledger.now()
     where o.run_id = p_run_id and o.seq = p_seq and o.status = 'STARTED';
  end if;
  update runledger.runs
     set status = 'WAITING', wait_kind = 'rate_limit', wait_key = p_key, wake_at = least(v_wake, v_run.deadline_at),
         lease_owner = null, lease_expires_at = null, updated_at = runledger.now()
   where run_id = p_run_id;
  insert into runledger.events (run_id, kind, detail, fencing_token)
  values (p_run_id, 'rate_limit_wait', jsonb_build_object('seq', p_seq, 'name', p_name, 'key', p_key, 'wake_at', v_wake), p_token);
  perform runledger._slot_freed(p_run_id);
  perform runledger._dispatch(p_run_id, v_run.queue_name,
    greatest(0, ceil(extract(epoch from least(v_wake, v_run.deadline_at) - runledger.now()) * 1000))::bigint);
end;
$$;
comment on function runledger._rate_limit_wait(text, bigint, int, text, text, int, text, bigint) is
  'Fenced: a step position refused a permit for longer than it waits in memory becomes a durable wait (wait_kind rate_limit, wait_key the key): the step keeps a WAITING row with the attempt reached, and the run waits, holding no worker, until the permit is expected; it then asks again. An operation''s STARTED ledger row (its call not made) goes back to PLANNED.';

-- Runs parked on a key are woken early when the key changes (a higher limit, a pause lifted).
create function runledger._wake_rate_limited(p_key text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_woken int := 0;
  v_run_id text;
begin
  for v_run_id in
    select r.run_id from runledger.runs r
     where r.status = 'WAITING' and r.wait_kind = 'rate_limit' and r.wait_key = p_key
       and r.run_id in (select w.run_id from runledger.rate_limit_waiters w where w.key = p_key)
  loop
    if runledger._wake(v_run_id, 'rate_limit', p_key) then
      v_woken := v_woken + 1;
    end if;
  end loop;
  return v_woken;
end;
$$;
comment on function runledger._wake_rate_limited(text) is
  'Wakes the runs parked on a rate limit key (wait_kind rate_limit) so they ask for a permit again; run when the key''s limit or pause changes. Returns how many it woke.';

create function runledger.set_rate_limit(p_key text, p_max int, p_per interval) returns runledger.rate_limit_keys
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_limit runledger.rate_limit_keys;
begin
  -- Keys are shared by every tenant, as queues are (0014_security.sql).
  perform runledger._check_not_tenant_bound('set_rate_limit');
  if p_key is null or p_key !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$' then
    raise exception using errcode = 'RL003',
      message = format('set_rate_limit: key %s is not 1 to 100 characters of [A-Za-z0-9_.:/-] starting with a letter or digit', coalesce(quote_literal(p_key), 'null'));
  end if;
  if (p_max is null) <> (p_per is null) or p_max not between 1 and 1000000 or p_per <= interval '0' or p_per > interval '1 day' then
    raise exception using errcode = 'RL003',
      message = format('set_rate_limit(%s): max must be 1 to 1000000 calls and per an interval above 0 up to 1 day (both null: no limit on calls), not %s per %s',
                       p_key, coalesce(p_max::text, 'null'), coalesce(p_per::text, 'null'));
  end if;
  insert into runledger.rate_limit_keys as k (key, max_calls, per) values (p_key, p_max, p_per)
  on conflict (key) do update set max_calls = excluded.max_calls, per = excluded.per, updated_at = runledger.now()
  returning * into v_limit;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('set_rate_limit', null, p_key, jsonb_build_object('max', p_max, 'per', p_per::text), to_jsonb(v_limit));
  return v_limit;
end;
$$;
comment on function runledger.set_rate_limit(text, int, interval) is
  'Operator action: at most p_max calls in any window of length p_per for every step, operation, tool and model call that names the key (rateLimit), across every run and worker; both null: no limit on calls (pauses still apply). Creates or changes the key and wakes the runs waiting on it to ask again. Returns the key''s row. Refused (42501) to an operator bound to a tenant: keys are shared. Recorded in audit_log.';

create function runledger.pause_rate_limit(p_key text, p_until timestamptz, p_note text default null) returns runledger.rate_limit_keys
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_limit runledger.rate_limit_keys;
begin
  perform runledger._check_not_tenant_bound('pause_rate_limit');
  if p_key is null or p_key !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]{0,99}$' then
    raise exception using errcode = 'RL003', message = format('pause_rate_limit: key %s is not a valid key', coalesce(quote_literal(p_key), 'null'));
  end if;
  if p_until is null or not isfinite(p_until) then
    raise exception using errcode = 'RL003', message = format('pause_rate_limit(%s): until must be a finite time', p_key);
  end if;
  insert into runledger.rate_limit_keys as k (key, paused_until, pause_reason)
  values (p_key, p_until, jsonb_build_object('by', runledger._caller(), 'note', p_note))
  on conflict (key) do update set paused_until = excluded.paused_until, pause_reason = excluded.pause_reason, updated_at = runledger.now()
  returning * into v_limit;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('pause_rate_limit', null, p_key, jsonb_build_object('until', p_until, 'note', p_note), to_jsonb(v_limit));
  return v_limit;
end;
$$;
comment on function runledger.pause_rate_limit(text, timestamptz, text) is
  'Operator action: no call on the key before p_until, for every run (the circuit opened by hand; a time in the past lifts a pause). Replaces the key''s pause and wakes the runs waiting on it to ask again. Returns the key''s row. Recorded in audit_log.';

create function runledger.resume_rate_limit(p_key text) returns runledger.rate_limit_keys
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_limit runledger.rate_limit_keys;
begin
  perform runledger._check_not_tenant_bound('resume_rate_limit');
  update runledger.rate_limit_keys set paused_until = null, pause_reason = null, updated_at = runledger.now()
   where key = p_key returning * into v_limit;
  if not found then
    raise exception using errcode = 'RL002', message = format('resume_rate_limit: no rate limit key %s', coalesce(quote_literal(p_key), 'null'));
  end if;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('resume_rate_limit', null, p_key, null, to_jsonb(v_limit));
  return v_limit;
end;
$$;
comment on function runledger.resume_rate_limit(text) is
  'Operator action: lifts the key''s pause now (calls go through again within its limit) and wakes the runs waiting on it. RL002 for an unknown key. Recorded in audit_log.';

create function runledger.delete_rate_limit(p_key text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_found boolean;
begin
  perform runledger._check_not_tenant_bound('delete_rate_limit');
  delete from runledger.rate_limit_keys where key = p_key;
  v_found := found;
  perform runledger._wake_rate_limited(p_key);
  perform runledger._audit('delete_rate_limit', null, p_key, null, to_jsonb(v_found));
  return v_found;
end;
$$;
comment on function runledger.delete_rate_limit(text) is
  'Operator action: removes the key (its limit, its pause, its log of calls): calls naming it are no longer limited, and the runs waiting on it are woken. False when there was no such key. Recorded in audit_log.';

create view runledger.rate_limits as
select k.key, k.max_calls, k.per,
       (select count(*) from runledger.rate_limit_calls c
         where c.key = k.key and c.at > runledger.now() - (k.per + least(k.per * 0.1, interval '1 second')))::int as calls_in_window,
       (select min(c.at) + (k.per + least(k.per * 0.1, interval '1 second')) from runledger.rate_limit_calls c
         where c.key = k.key and c.at > runledger.now() - (k.per + least(k.per * 0.1, interval '1 second'))) as next_place_at,
       case when k.paused_until > runledger.now() then k.paused_until end as paused_until,
       case when k.paused_until > runledger.now() then k.pause_reason end as pause_reason,
       (select count(*) from runledger.rate_limit_waiters w join runledger.runs r on r.run_id = w.run_id
         where w.key = k.key and not runledger.is_terminal(r.status))::int as waiters,
       (select min(w.since) from runledger.rate_limit_waiters w join runledger.runs r on r.run_id = w.run_id
         where w.key = k.key and not runledger.is_terminal(r.status)) as oldest_waiter_since,
       k.updated_at
  from runledger.rate_limit_keys k;
comment on view runledger.rate_limits is
  'Each shared rate limit key: its limit (max_calls per per; null: pauses only), the calls let through in the current window and when the window next frees a place, its pause (paused_until and why, while it lasts), and the step positions waiting for a permit (in memory or as WAITING runs) with the oldest one''s wait start.';

insert into runledger.role_functions (role_name, function_name)
select 'runledger_worker', f from unnest(array['_rate_limit_acquire', '_rate_limit_pause', '_rate_limit_wait']) f
union all
select 'runledger_operator', f from unnest(array['set_rate_limit', 'pause_rate_limit', 'resume_rate_limit', 'delete_rate_limit']) f;

-- The new functions lose PUBLIC's execute, and the granted ones become SECURITY DEFINER with a fixed search_path.
select runledger._secure_functions();

-- The roles read the new tables (worker, operator) and view (all three) once grant_roles() runs
-- again: here, where the migrating role may; elsewhere a DBA runs it, as after 0014.
do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: the rate limit tables are not granted yet (% may not grant roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (17, '0017_rate_limits');
