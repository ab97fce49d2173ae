-- 0013_sessions: agent sessions. A session is a conversation history that spans runs
-- (run 1 locates the bug, run 2 fixes it, run 3 verifies); one run holds it at a time,
-- the others queue for it in arrival order and wait durably (WAITING on the signal
-- topic 'session:<id>', holding no worker). Entries are appended by the holder, each
-- append in the same transaction as its step's checkpoint and keyed by (run, step
-- position, index), so a replay never appends twice (src/agents/session.ts).
--
--   runledger.sessions              one row per session: its holder, how it was last released, its entry count
--   runledger.session_entries       the history, in order (seq), with the run and step position that appended each entry
--   runledger.session_waiters       runs queued for a held session, in arrival order (ticket)
--   runledger._session_check_id()   a session id is a name: [A-Za-z0-9][A-Za-z0-9_.:/-]*, at most 92 characters
--   runledger._session_handoff()    a free session goes to its first live waiter, which is signalled
--   runledger._session_free()       the holder lets go (released, ended, operator), then the hand-off
--   runledger._session_acquire()    hold a session or queue for it (inside the caller's transaction step)
--   runledger._session_leave()      a queued run gives up (its wait timed out), unless the session is already its
--   runledger._session_release()    the holder lets go explicitly
--   runledger._session_append()     the holder appends entries at one step position
--   runledger._session_on_terminal() trigger function: a run that ends lets go of its sessions and its places in queues
--   runledger.session_history()     public: a session's entries, in order
--   runledger.release_session()     public (operator): frees a session whose holder is stuck, hands it on
--   runledger.delete_session()      public (operator): deletes a free session and its history
--   runledger.session_list          view: every session with its holder, waiters and entry count
--
-- Lock order, everywhere: the session row first, then run rows (the hand-off's
-- send_signal locks the next holder's run; a transaction step's checkpoint locks its own
-- run last). The one exception is the trigger, which runs while the ending run's row is
-- already locked; a deadlock that can result (a sweeper ending a run while that run's
-- worker appends) is detected by PostgreSQL and its victim retried (a transaction step
-- re-runs on 40P01).
--
-- Retention: entries belong to the session, not to a run. runledger.prune() deletes old
-- runs but not the entries they appended (run_id here is not a foreign key); they stay
-- until the session is deleted with runledger.delete_session().

create function runledger._session_check_id(p_session_id text) returns void
language plpgsql immutable as $$
begin
  -- Unbounded class plus length(): see the note on runs_run_id_insert in 0001_schema.sql.
  -- At most 92 characters, so that the wake-up topic 'session:<id>' fits a topic's 100.
  if p_session_id is null or p_session_id !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_session_id) > 92 then
    raise exception using errcode = 'RL003',
      message = format('invalid session id %L: a name of letters, digits and _ . : / - (starting with a letter or digit), at most 92 characters', p_session_id);
  end if;
end;
$$;
comment on function runledger._session_check_id(text) is
  'Refuses (RL003) a session id that is not a name: [A-Za-z0-9][A-Za-z0-9_.:/-]*, at most 92 characters (the wake-up topic session:<id> must fit 100).';

create table runledger.sessions (
  session_id         text primary key,
  -- The run that holds the session now; null when it is free.
  holder_run_id      text,
  held_at            timestamptz,
  -- Who held it last and why they let go: 'released' (session.release()), 'ended' (the
  -- holder reached a terminal status), 'operator' (release_session).
  last_holder_run_id text,
  released_at        timestamptz,
  release_reason     text,
  -- The seq of the last entry (entries are numbered 1, 2, ... without gaps).
  entry_count        int not null default 0,
  created_at         timestamptz not null default runledger.now(),
  updated_at         timestamptz not null default runledger.now(),
  constraint sessions_id_valid check (session_id ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' and length(session_id) <= 92),
  constraint sessions_holder_complete check ((holder_run_id is null) = (held_at is null)),
  constraint sessions_release_reason check (release_reason in ('released', 'ended', 'operator'))
);
-- A run that ends lets go of what it holds: the trigger finds it by this index.
create index sessions_holder on runledger.sessions (holder_run_id) where holder_run_id is not null;
comment on table runledger.sessions is
  'Agent sessions: a history that spans runs, held by at most one run at a time (holder_run_id; null = free). Others queue in session_waiters. last_holder_run_id, released_at and release_reason (released, ended, operator) say how it was last let go; entry_count is the seq of its last entry.';

create table runledger.session_entries (
  session_id    text not null references runledger.sessions (session_id) on delete cascade,
  seq           int  not null,
  role          text not null,
  content       jsonb not null,
  -- Who appended it: the run and the step position of its append (not a foreign key:
  -- the entry outlives a pruned run, see Retention above).
  run_id        text not null,
  step_position int  not null,
  -- Its index within that append (0, 1, ...).
  entry_index   int  not null,
  created_at    timestamptz not null default runledger.now(),
  primary key (session_id, seq),
  constraint session_entries_role check (role in ('system', 'user', 'assistant', 'tool')),
  -- One append per (run, step position): a second one (a replay that ran the append
  -- again) breaks this instead of doubling the history.
  constraint session_entries_once unique (run_id, step_position, entry_index)
);
comment on table runledger.session_entries is
  'The history of each session in order (seq 1, 2, ...): role (system, user, assistant, tool), content (JSON), and the run and step position whose append wrote it, with its index in that append; unique by (run_id, step_position, entry_index), written with that step''s checkpoint.';

create table runledger.session_waiters (
  session_id text not null references runledger.sessions (session_id) on delete cascade,
  run_id     text not null,
  ticket     bigint generated always as identity,
  queued_at  timestamptz not null default runledger.now(),
  primary key (session_id, run_id)
);
create index session_waiters_order on runledger.session_waiters (session_id, ticket);
create index session_waiters_run on runledger.session_waiters (run_id);
comment on table runledger.session_waiters is
  'Runs queued for a held session, served in arrival order (ticket). The first live one becomes the holder when the session is let go, and is woken by a signal on topic session:<id>.';

create function runledger._session_handoff(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_next   text;
  v_status runledger.run_status;
begin
  -- The caller holds the session row, free. The first waiter whose run has not ended
  -- takes it; waiters whose run ended or vanished are dropped on the way.
  loop
    select w.run_id into v_next from runledger.session_waiters w
     where w.session_id = p_session_id order by w.ticket limit 1;
    if not found then
      return null;
    end if;
    -- The waiter's run is locked before its place is taken: a cancel or end of that run
    -- committing right now has removed its place (the trigger below) by the time the lock
    -- is granted, and the delete then finds nothing.
    select r.status into v_status from runledger.runs r where r.run_id = v_next for update;
    delete from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = v_next;
    if found and v_status is not null and not runledger.is_terminal(v_status) then
      update runledger.sessions
         set holder_run_id = v_next, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id;
      perform runledger._send_signal(v_next, 'session:' || p_session_id, jsonb_build_object('session_id', p_session_id));
      return v_next;
    end if;
  end loop;
end;
$$;
comment on function runledger._session_handoff(text) is
  'The session (locked by the caller, free) goes to its first waiter whose run has not ended, which is signalled on topic session:<id> (send_signal wakes it if it waits). Returns the new holder, or null when nobody waits.';

create function runledger._session_free(p_session_id text, p_reason text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  update runledger.sessions
     set last_holder_run_id = holder_run_id, holder_run_id = null, held_at = null,
         released_at = runledger.now(), release_reason = p_reason, updated_at = runledger.now()
   where session_id = p_session_id and holder_run_id is not null;
  return runledger._session_handoff(p_session_id);
end;
$$;
comment on function runledger._session_free(text, text) is
  'The holder of the session (locked by the caller) lets go, for p_reason (released, ended, operator); the session goes to the next waiter. Returns the new holder or null.';

create function runledger._session_acquire(p_session_id text, p_run_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
  v_status  runledger.run_status;
  v_ticket  bigint;
begin
  perform runledger._session_check_id(p_session_id);
  insert into runledger.sessions (session_id) values (p_session_id) on conflict (session_id) do nothing;
  select * into v_session from runledger.sessions where session_id = p_session_id for update;
  if v_session.holder_run_id is not null and v_session.holder_run_id <> p_run_id then
    -- A holder that ended lets go by the trigger below; one found ended or gone anyway
    -- (a run row deleted by hand) is treated as gone.
    select r.status into v_status from runledger.runs r where r.run_id = v_session.holder_run_id;
    if v_status is null or runledger.is_terminal(v_status) then
      delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
      perform runledger._session_free(p_session_id, 'ended');
      select * into v_session from runledger.sessions where session_id = p_session_id;
    end if;
  end if;
  if v_session.holder_run_id is null then
    -- Free: a free session has nobody queued (a hand-off gives it to the first waiter),
    -- but should someone be, they come first.
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    if exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id) then
      perform runledger._session_handoff(p_session_id);
      select * into v_session from runledger.sessions where session_id = p_session_id;
    end if;
  end if;
  if v_session.holder_run_id is null then
    update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
     where session_id = p_session_id
    returning * into v_session;
  end if;
  if v_session.holder_run_id = p_run_id then
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  insert into runledger.session_waiters (session_id, run_id) values (p_session_id, p_run_id)
  on conflict (session_id, run_id) do nothing;
  select w.ticket into v_ticket from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = p_run_id;
  return jsonb_build_object(
    'held', false, 'holder', v_session.holder_run_id,
    'position', (select count(*) from runledger.session_waiters w where w.session_id = p_session_id and w.ticket <= v_ticket));
end;
$$;
comment on function runledger._session_acquire(text, text) is
  'Inside a run''s transaction step: holds the session for p_run_id if it is free (or already its own, or its holder ended) and answers {held: true, entry_count}; otherwise queues the run (once) and answers {held: false, holder, position}. Creates the session on first use. Invalid id: RL003.';

create function runledger._session_leave(p_session_id text, p_run_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id for update;
  if found and v_session.holder_run_id = p_run_id then
    -- The hand-off came just as the wait timed out: the session is the run's.
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
  return jsonb_build_object('held', false, 'holder', v_session.holder_run_id);
end;
$$;
comment on function runledger._session_leave(text, text) is
  'A queued run gives up (its wait timed out): it leaves the queue, unless the session was handed to it meanwhile ({held: true, entry_count}).';

create function runledger._session_release(p_session_id text, p_run_id text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  perform 1 from runledger.sessions where session_id = p_session_id and holder_run_id = p_run_id for update;
  if not found then
    return false;
  end if;
  perform runledger._session_free(p_session_id, 'released');
  return true;
end;
$$;
comment on function runledger._session_release(text, text) is
  'The holder lets go of the session (session.release()); the next waiter gets it and is woken. False when p_run_id does not hold it.';

create function runledger._session_append(p_session_id text, p_run_id text, p_position int, p_entries jsonb) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
  v_count   int;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id for update;
  if not found then
    raise exception using errcode = 'RL005', message = format('session %s is not held by run %s: it does not exist', p_session_id, p_run_id);
  end if;
  if v_session.holder_run_id is distinct from p_run_id then
    if v_session.holder_run_id is null and v_session.last_holder_run_id = p_run_id and v_session.release_reason = 'ended'
       and not exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id) then
      -- The run held it when it ended and has been brought back (retry_run); nobody has held
      -- it since, so its history is still the one the run read: it takes it back.
      update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id;
    else
      raise exception using errcode = 'RL005',
        message = format('session %s is not held by run %s (%s)', p_session_id, p_run_id,
                         coalesce('held by ' || v_session.holder_run_id, 'it is free'));
    end if;
  end if;
  if jsonb_typeof(p_entries) is distinct from 'array' or exists (
       select 1 from jsonb_array_elements(p_entries) e
        where jsonb_typeof(e) <> 'object' or not (e ? 'content')
           or coalesce(e->>'role', '') not in ('system', 'user', 'assistant', 'tool')) then
    raise exception using errcode = 'RL003',
      message = format('session %s: entries must be an array of {role: system|user|assistant|tool, content}', p_session_id);
  end if;
  insert into runledger.session_entries (session_id, seq, role, content, run_id, step_position, entry_index)
  select p_session_id, v_session.entry_count + e.ordinality::int, e.value->>'role', e.value->'content', p_run_id, p_position, e.ordinality::int - 1
    from jsonb_array_elements(p_entries) with ordinality e;
  get diagnostics v_count = row_count;
  update runledger.sessions set entry_count = entry_count + v_count, updated_at = runledger.now() where session_id = p_session_id;
  return jsonb_build_object('first_seq', v_session.entry_count + 1, 'last_seq', v_session.entry_count + v_count);
end;
$$;
comment on function runledger._session_append(text, text, int, jsonb) is
  'Inside the holder''s transaction step at p_position: appends the entries ([{role, content}], numbered after the last) and answers {first_seq, last_seq}. A run that does not hold the session: RL005 (a run that held it when it ended and was retried takes it back if nobody held it since and nobody waits). Bad entries: RL003.';

create function runledger._session_on_terminal() returns trigger
language plpgsql as $$
declare
  v_session text;
begin
  -- Most runs that end held no session and queued for none: two index probes, and
  -- nothing is written: about 5 us per run that ends (20,000 runs ended in one UPDATE,
  -- PostgreSQL 15). No SET clause: it runs inside the engine's functions and inherits
  -- their settings; the SET made it 7.5 us.
  if exists (select 1 from runledger.session_waiters w where w.run_id = new.run_id) then
    delete from runledger.session_waiters where run_id = new.run_id;
  end if;
  if exists (select 1 from runledger.sessions s where s.holder_run_id = new.run_id) then
    for v_session in
      select s.session_id from runledger.sessions s where s.holder_run_id = new.run_id order by s.session_id for update
    loop
      perform runledger._session_free(v_session, 'ended');
    end loop;
  end if;
  return null;
end;
$$;
comment on function runledger._session_on_terminal() is
  'Trigger function of runs_session_release: a run that reached a terminal status leaves the session queues it was in and lets go of the sessions it held, each going to its next waiter.';
-- Only a change to a terminal status fires it (the WHEN clause is evaluated without
-- calling any function): every other update of runs costs nothing more.
create trigger runs_session_release after update of status on runledger.runs
  for each row when (old.status is distinct from new.status and new.status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'))
  execute function runledger._session_on_terminal();

create function runledger.session_history(p_session_id text)
returns table (seq int, role text, content jsonb, run_id text, step_position int, created_at timestamptz)
language plpgsql stable
set enable_seqscan = off set jit = off as $$
begin
  perform runledger._session_check_id(p_session_id);
  if not exists (select 1 from runledger.sessions s where s.session_id = p_session_id) then
    raise exception using errcode = 'RL002', message = format('session_history: session %L not found', p_session_id);
  end if;
  return query
    select e.seq, e.role, e.content, e.run_id, e.step_position, e.created_at
      from runledger.session_entries e
     where e.session_id = p_session_id
     order by e.seq;
end;
$$;
comment on function runledger.session_history(text) is
  'A session''s history in order: seq, role, content, and the run and step position that appended each entry. Unknown session: RL002; invalid id: RL003.';

create function runledger._release_session(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('release_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is null then
    return null;
  end if;
  insert into runledger.events (run_id, kind, detail)
  select r.run_id, 'session_released', jsonb_build_object('session_id', p_session_id, 'by', 'operator')
    from runledger.runs r where r.run_id = v_session.holder_run_id;
  return runledger._session_free(p_session_id, 'operator');
end;
$$;
comment on function runledger._release_session(text) is
  'The action behind runledger.release_session (which records it in audit_log): Operator repair: takes a session from its holder (a run stuck while holding it) and hands it to the next waiter, which is woken. Returns the new holder (null: nobody waited, or it was free). The former holder''s next append fails with RL005 (SESSION_NOT_HELD); its history records a session_released event. Unknown session: RL002.';

create function runledger._delete_session(p_session_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('delete_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is not null or exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id) then
    raise exception using errcode = 'RL005',
      message = format('delete_session: session %s is held by run %s or has runs queued; release it first (release_session)', p_session_id,
                       coalesce(v_session.holder_run_id, '-'));
  end if;
  delete from runledger.sessions where session_id = p_session_id;
  return v_session.entry_count;
end;
$$;
comment on function runledger._delete_session(text) is
  'The action behind runledger.delete_session (which records it in audit_log): Operator action: deletes a session nobody holds or waits for, with its history (entries are kept until then, whatever prune() removes). Returns how many entries went. Held or queued for: RL005; unknown: RL002.';

create view runledger.session_list as
select s.session_id,
       s.holder_run_id,
       r.status as holder_status,
       r.workflow_name as holder_workflow,
       s.held_at,
       coalesce(w.run_ids, '{}') as waiting_run_ids,
       coalesce(cardinality(w.run_ids), 0) as waiters,
       s.entry_count as entries,
       s.last_holder_run_id,
       s.release_reason,
       s.released_at,
       s.created_at,
       s.updated_at
  from runledger.sessions s
  left join runledger.runs r on r.run_id = s.holder_run_id
  left join lateral (
    select array_agg(q.run_id order by q.ticket) as run_ids from runledger.session_waiters q where q.session_id = s.session_id
  ) w on true;
comment on view runledger.session_list is
  'Every session: its holder (run, status, workflow, since when), the runs queued for it in order, its entry count, and how it was last let go. select * from runledger.session_history(id) lists one session''s entries.';

insert into runledger.migrations (version, name) values (13, '0013_sessions');
