-- 0012_agents: what durable agents keep: streams, sessions, artifacts.
--
-- tables: stream_chunks, stream_ends, sessions, session_entries, session_waiters, artifact_blobs, artifacts
-- indexes: sessions_holder, session_waiters_order, session_waiters_run, artifacts_step, artifacts_value,
--   artifacts_blob
-- triggers: runs_session_release, sessions_mark_holder, session_waiters_mark_run
-- views: streams, session_list, artifact_list
-- functions: _stream_write, _stream_poll, read_stream, _session_check_id, _session_handoff, _session_free,
--   _session_acquire, _session_leave, _session_release, _session_append, _session_on_terminal,
--   session_history, _release_session, _delete_session, _artifact_blob_held, _record_artifact,
--   _prune_artifact_blobs, release_session, delete_session, prune_artifact_blobs, _session_mark_run,
--   _run_tenant, _session_scope

create table runledger.stream_chunks (
  run_id        text collate "C"   not null references runledger.runs (run_id) on delete cascade,
  topic         text collate "C"   not null check (topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' and length(topic) <= 100),
  "offset"      bigint not null check ("offset" >= 0),
  chunk         jsonb  not null,
  seq           int    not null,
  attempt       int    not null,
  fencing_token bigint not null,
  created_at    timestamptz not null default runledger.now(),
  primary key (run_id, topic, "offset")
);
comment on table runledger.stream_chunks is
  'Durable streams (ctx.stream(topic).write): one row per chunk at its offset (0, 1, 2 ... per run and topic, no gaps). The first write of an offset wins: a re-execution after a crash writes the same offsets again and stores nothing new. Read with runledger.read_stream or engine.readStream.';
comment on column runledger.stream_chunks."offset" is
  'Position of the chunk in its stream, from 0. Chunks written at step position seq continue after the last chunk written at positions before seq, so a replay gives the same offsets (docs/streams.md).';
comment on column runledger.stream_chunks.chunk is
  'The chunk as the workflow wrote it (any JSON value; a JSON null is the jsonb value null).';
comment on column runledger.stream_chunks.seq is
  'The step position the chunk was written at: the ctx call in flight (a step writing it), else the next position (the workflow body between steps).';
comment on column runledger.stream_chunks.attempt is
  'ctx.attempt of the execution that wrote the chunk (1, then +1 per recovery after a lost lease).';
comment on column runledger.stream_chunks.fencing_token is
  'Fencing token of the execution that wrote the chunk: which claim of the run it came from.';

create table runledger.stream_ends (
  run_id        text collate "C"   not null references runledger.runs (run_id) on delete cascade,
  topic         text collate "C"   not null check (topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' and length(topic) <= 100),
  end_offset    bigint not null check (end_offset >= 0),
  seq           int    not null,
  fencing_token bigint not null,
  closed_at     timestamptz not null default runledger.now(),
  primary key (run_id, topic)
);
comment on table runledger.stream_ends is
  'Closed streams (ctx.stream(topic).close): the stream holds the chunks at offsets 0 .. end_offset - 1 and no more; readers stop there. The first close wins; chunks at or past end_offset are not stored.';
comment on column runledger.stream_ends.end_offset is
  'The stream''s length when it was closed: the offset after its last chunk.';

create view runledger.streams as
select c.run_id, c.topic, c.chunks, c.next_offset, c.last_write_at,
       e.run_id is not null as closed, e.end_offset, e.closed_at
  from (select s.run_id, s.topic, count(*) as chunks, max(s."offset") + 1 as next_offset, max(s.created_at) as last_write_at
          from runledger.stream_chunks s
         group by s.run_id, s.topic) c
  left join runledger.stream_ends e on e.run_id = c.run_id and e.topic = c.topic
union all
select e.run_id, e.topic, 0, 0, null, true, e.end_offset, e.closed_at
  from runledger.stream_ends e
 where not exists (select 1 from runledger.stream_chunks s where s.run_id = e.run_id and s.topic = e.topic);
comment on view runledger.streams is
  'Each durable stream of each run: chunks stored, next_offset (the offset after the last chunk), when it was last written, and whether it is closed (end_offset, closed_at). Filter by run_id: select * from runledger.streams where run_id = ''...''.';

-- The fence is a read, not a row lock: a batch of chunks takes no lock on the run row, so
-- stream writes never queue behind (or hold up) the run's checkpoints and heartbeats. A
-- writer whose token is stale once the takeover committed gets RL001. A batch already
-- past this check when the takeover commits may still be stored: such chunks are those of
-- an execution of the same positions, at the offsets the new owner writes again, and the
-- first write of an offset wins, as after a crash (docs/streams.md, "Offsets and replay").
--
-- Offsets: p_first_offset when the worker knows where the batch starts; null when it does
-- not (the first write of this execution, or the first at a new position after a replayed
-- one): the batch then continues after the last chunk written at positions before
-- p_base_seq (and, with p_after_earlier, after the chunks an earlier execution wrote at
-- p_base_seq itself: a step retried after a durable backoff appends to its failed attempts).
create function runledger._stream_write(
  p_run_id text, p_token bigint, p_topic text, p_attempt int,
  p_first_offset bigint, p_base_seq int, p_after_earlier boolean,
  p_seqs int[], p_chunks jsonb, p_close boolean default false)
returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_token  bigint;
  v_status runledger.run_status;
  v_first  bigint := p_first_offset;
  v_count  int := coalesce(jsonb_array_length(p_chunks), 0);
  v_end    bigint;
  v_stored int := 0;
  v_closed int := 0;
begin
  select r.fencing_token, r.status into v_token, v_status from runledger.runs r where r.run_id = p_run_id;
  if not found or v_token is distinct from p_token or v_status not in ('RUNNING', 'CANCELLING') then
    raise exception using errcode = 'RL001',
      message = format('run %s: lease lost (fencing token %s is stale or the run stopped executing); stream %s not written', p_run_id, p_token, p_topic);
  end if;
  if p_topic is null or p_topic !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_topic) > 100 then
    raise exception using errcode = 'RL003', message = format('stream: invalid topic %L', p_topic);
  end if;
  if coalesce(cardinality(p_seqs), 0) <> v_count or (v_first is null and p_base_seq is null) or v_first < 0 then
    raise exception using errcode = 'RL003',
      message = format('stream %s: %s chunks with %s positions, first offset %s, base position %s', p_topic, v_count, coalesce(cardinality(p_seqs), 0), v_first, p_base_seq);
  end if;
  if v_first is null then
    -- The primary key read backwards from the stream's end, skipping the chunks of
    -- positions at or after p_base_seq (only an earlier execution that got further wrote any).
    select c."offset" + 1 into v_first
      from runledger.stream_chunks c
     where c.run_id = p_run_id and c.topic = p_topic
       and (c.seq < p_base_seq or (p_after_earlier and c.seq = p_base_seq and c.fencing_token < p_token))
     order by c."offset" desc
     limit 1;
    v_first := coalesce(v_first, 0);
  end if;
  select e.end_offset into v_end from runledger.stream_ends e where e.run_id = p_run_id and e.topic = p_topic;
  if v_count > 0 then
    insert into runledger.stream_chunks (run_id, topic, "offset", chunk, seq, attempt, fencing_token)
    select p_run_id, p_topic, v_first + c.i - 1, c.chunk, c.seq, p_attempt, p_token
      from rows from (jsonb_array_elements(p_chunks), unnest(p_seqs)) with ordinality as c(chunk, seq, i)
     where v_end is null or v_first + c.i - 1 < v_end
    on conflict do nothing;
    get diagnostics v_stored = row_count;
  end if;
  if p_close and v_end is null then
    insert into runledger.stream_ends (run_id, topic, end_offset, seq, fencing_token)
    values (p_run_id, p_topic, v_first + v_count, coalesce(p_seqs[v_count], p_base_seq, 0), p_token)
    on conflict do nothing;
    get diagnostics v_closed = row_count;
  end if;
  -- Readers are woken by the run's id only, once per batch; nothing new (a replay), no wake-up.
  if v_stored > 0 or v_closed > 0 then
    perform pg_notify('runledger_stream', p_run_id);
  end if;
  return v_first + v_count;
end;
$$;
comment on function runledger._stream_write(text, bigint, text, int, bigint, int, boolean, int[], jsonb, boolean) is
  'Fenced (a read of the run''s fencing token and status, no row lock; RL001 when stale): stores a batch of one stream''s chunks (p_chunks, a JSON array, each at the step position in p_seqs) at consecutive offsets from p_first_offset, or, when it is null, after the last chunk written at positions before p_base_seq; an offset already stored, or at or past the stream''s end, is left as it is. p_close closes the stream after the batch. One NOTIFY runledger_stream (payload: the run id) when anything was stored. Returns the offset after the batch.';

-- State first, chunks after: a run that is terminal (or a stream that is closed) in the
-- first read has every chunk committed before it (the worker flushes a run's streams before
-- its terminal write), so a reader that has read them all may stop.
create function runledger._stream_poll(p_run_id text, p_topic text, p_from_offset bigint, p_limit int)
returns table ("offset" bigint, chunk jsonb, attempt int, end_offset bigint, run_status text)
language plpgsql stable
set enable_seqscan = off set jit = off as $$
declare
  v_status text;
  v_end    bigint;
begin
  select r.status::text into v_status from runledger.runs r where r.run_id = p_run_id;
  if not found then
    raise exception using errcode = 'RL002', message = format('stream: run %s not found', p_run_id);
  end if;
  select e.end_offset into v_end from runledger.stream_ends e where e.run_id = p_run_id and e.topic = p_topic;
  return query
    select c."offset", c.chunk, c.attempt, v_end, v_status
      from runledger.stream_chunks c
     where c.run_id = p_run_id and c.topic = p_topic and c."offset" >= p_from_offset
     order by c."offset"
     limit p_limit;
  if not found then
    return query select null::bigint, null::jsonb, null::int, v_end, v_status;
  end if;
end;
$$;
comment on function runledger._stream_poll(text, text, bigint, int) is
  'A reader''s poll (engine.readStream): up to p_limit chunks of the stream from p_from_offset in offset order, each with the stream''s end offset (null while open) and the run''s status as read before the chunks; one row with a null offset when there is no chunk there yet. RL002 for an unknown run.';

create function runledger.read_stream(p_run_id text, p_topic text, p_from_offset bigint default 0, p_limit int default 1000)
returns table ("offset" bigint, chunk jsonb, seq int, attempt int, created_at timestamptz)
language plpgsql stable
set enable_seqscan = off set jit = off as $$
begin
  if p_topic is null or p_topic !~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' or length(p_topic) > 100 then
    raise exception using errcode = 'RL003', message = format('read_stream: invalid topic %L', p_topic);
  end if;
  if p_from_offset is null or p_from_offset < 0 or p_limit is null or p_limit < 1 then
    raise exception using errcode = 'RL003',
      message = format('read_stream: from_offset must be >= 0 and limit >= 1 (got %s, %s)', p_from_offset, p_limit);
  end if;
  if not exists (select 1 from runledger.runs r where r.run_id = p_run_id) then
    raise exception using errcode = 'RL002', message = format('read_stream: run %s not found', p_run_id);
  end if;
  return query
    select c."offset", c.chunk, c.seq, c.attempt, c.created_at
      from runledger.stream_chunks c
     where c.run_id = p_run_id and c.topic = p_topic and c."offset" >= p_from_offset
     order by c."offset"
     limit p_limit;
end;
$$;
comment on function runledger.read_stream(text, text, bigint, int) is
  'A run''s durable stream on a topic, for psql: up to p_limit chunks (default 1000) from offset p_from_offset (default 0), in offset order, with the step position and execution attempt that wrote each. Whether it is closed: runledger.streams. RL002 for an unknown run, RL003 for a bad topic or range.';

create function runledger._session_check_id(p_session_id text) returns void
language plpgsql immutable as $$
begin
  -- Unbounded class plus length(): as for a run_id (_check_run, 0002_runs.sql).
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
  session_id         text collate "C" not null,
  -- The run that holds the session now; null when it is free.
  holder_run_id      text collate "C",
  held_at            timestamptz,
  -- Who held it last and why they let go: 'released' (session.release()), 'ended' (the
  -- holder reached a terminal status), 'operator' (release_session).
  last_holder_run_id text collate "C",
  released_at        timestamptz,
  release_reason     text collate "C",
  -- The seq of the last entry (entries are numbered 1, 2, ... without gaps).
  entry_count        int not null default 0,
  created_at         timestamptz not null default runledger.now(),
  updated_at         timestamptz not null default runledger.now(),
  constraint sessions_id_valid check (session_id ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' and length(session_id) <= 92),
  constraint sessions_holder_complete check ((holder_run_id is null) = (held_at is null)),
  constraint sessions_release_reason check (release_reason in ('released', 'ended', 'operator')),
  -- The tenant of the runs that use it ('' for runs without one): a session is keyed by id and tenant.
  tenant_id          text collate "C" not null default '',
  primary key (session_id, tenant_id)
);
comment on table runledger.sessions is
  'Agent sessions: a history that spans runs, held by at most one run at a time (holder_run_id; null = free). Others queue in session_waiters. last_holder_run_id, released_at and release_reason (released, ended, operator) say how it was last let go; entry_count is the seq of its last entry.';
comment on column runledger.sessions.tenant_id is
  'The tenant whose runs use this session ('''' for runs without a tenant): with session_id, the session''s key. A run opens, appends to and waits for only its own tenant''s session of an id.';

-- A run that ends lets go of what it holds: the trigger finds it by this index.
create index sessions_holder on runledger.sessions (holder_run_id) where holder_run_id is not null;

create table runledger.session_entries (
  session_id    text collate "C" not null,
  seq           int  not null,
  role          text collate "C" not null,
  content       jsonb not null,
  -- Who appended it: the run and the step position of its append (not a foreign key:
  -- the entry outlives a pruned run, see Retention above).
  run_id        text collate "C" not null,
  step_position int  not null,
  -- Its index within that append (0, 1, ...).
  entry_index   int  not null,
  created_at    timestamptz not null default runledger.now(),

  constraint session_entries_role check (role in ('system', 'user', 'assistant', 'tool')),
  -- One append per (run, step position): a second one (a replay that ran the append
  -- again) breaks this instead of doubling the history.
  constraint session_entries_once unique (run_id, step_position, entry_index),
  tenant_id     text collate "C" not null default '',
  primary key (session_id, tenant_id, seq),
  constraint session_entries_session_id_fkey foreign key (session_id, tenant_id)
    references runledger.sessions (session_id, tenant_id) on delete cascade
);
comment on table runledger.session_entries is
  'The history of each session in order (seq 1, 2, ...): role (system, user, assistant, tool), content (JSON), and the run and step position whose append wrote it, with its index in that append; unique by (run_id, step_position, entry_index), written with that step''s checkpoint.';
comment on column runledger.session_entries.tenant_id is
  'The tenant of the entry''s session (with session_id, its key).';

create table runledger.session_waiters (
  session_id text collate "C" not null,
  run_id     text collate "C" not null,
  ticket     bigint generated always as identity,
  queued_at  timestamptz not null default runledger.now(),
  primary key (session_id, run_id),
  tenant_id  text collate "C" not null default '',
  constraint session_waiters_session_id_fkey foreign key (session_id, tenant_id)
    references runledger.sessions (session_id, tenant_id) on delete cascade
);
comment on table runledger.session_waiters is
  'Runs queued for a held session, served in arrival order (ticket). The first live one becomes the holder when the session is let go, and is woken by a signal on topic session:<id>.';
comment on column runledger.session_waiters.tenant_id is
  'The tenant of the session queued for (with session_id, its key): the queued run''s own.';

create index session_waiters_order on runledger.session_waiters (session_id, tenant_id, ticket);

create index session_waiters_run on runledger.session_waiters (run_id);

create function runledger._session_handoff(p_session_id text, p_tenant_id text) returns text
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
     where w.session_id = p_session_id and w.tenant_id = p_tenant_id order by w.ticket limit 1;
    if not found then
      return null;
    end if;
    -- The waiter's run is locked before its place is taken: a cancel or end of that run
    -- committing right now has removed its place (the trigger runs_session_release) by the
    -- time the lock is granted, and the delete then finds nothing.
    select r.status into v_status from runledger.runs r where r.run_id = v_next for update;
    delete from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = v_next;
    if found and v_status is not null and not runledger.is_terminal(v_status) then
      update runledger.sessions
         set holder_run_id = v_next, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id and tenant_id = p_tenant_id;
      perform runledger._send_signal(v_next, 'session:' || p_session_id, jsonb_build_object('session_id', p_session_id));
      return v_next;
    end if;
  end loop;
end;
$$;
comment on function runledger._session_handoff(text, text) is
  'The session (locked by the caller, free) goes to its first waiter whose run has not ended, which is signalled on topic session:<id> (send_signal wakes it if it waits). Returns the new holder, or null when nobody waits.';

create function runledger._session_free(p_session_id text, p_tenant_id text, p_reason text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  update runledger.sessions
     set last_holder_run_id = holder_run_id, holder_run_id = null, held_at = null,
         released_at = runledger.now(), release_reason = p_reason, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = p_tenant_id and holder_run_id is not null;
  return runledger._session_handoff(p_session_id, p_tenant_id);
end;
$$;
comment on function runledger._session_free(text, text, text) is
  'The holder of the session (locked by the caller) lets go, for p_reason (released, ended, operator); the session goes to the next waiter. Returns the new holder or null.';

create function runledger._session_acquire(p_session_id text, p_run_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
  v_status  runledger.run_status;
  v_ticket  bigint;
begin
  perform runledger._session_check_id(p_session_id);
  insert into runledger.sessions (session_id, tenant_id) values (p_session_id, v_tenant)
  on conflict (session_id, tenant_id) do nothing;
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if v_session.holder_run_id is not null and v_session.holder_run_id <> p_run_id then
    -- A holder that ended lets go by the trigger runs_session_release; one found ended or
    -- gone anyway (a run row deleted by hand) is treated as gone.
    select r.status into v_status from runledger.runs r where r.run_id = v_session.holder_run_id;
    if v_status is null or runledger.is_terminal(v_status) then
      delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
      perform runledger._session_free(p_session_id, v_tenant, 'ended');
      select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
    end if;
  end if;
  if v_session.holder_run_id is null then
    -- Free: a free session has nobody queued (a hand-off gives it to the first waiter),
    -- but should someone be, they come first.
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    if exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
      perform runledger._session_handoff(p_session_id, v_tenant);
      select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
    end if;
  end if;
  if v_session.holder_run_id is null then
    update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
     where session_id = p_session_id and tenant_id = v_tenant
    returning * into v_session;
  end if;
  if v_session.holder_run_id = p_run_id then
    delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  insert into runledger.session_waiters (session_id, tenant_id, run_id) values (p_session_id, v_tenant, p_run_id)
  on conflict (session_id, run_id) do nothing;
  select w.ticket into v_ticket from runledger.session_waiters w where w.session_id = p_session_id and w.run_id = p_run_id;
  return jsonb_build_object(
    'held', false, 'holder', v_session.holder_run_id,
    'position', (select count(*) from runledger.session_waiters w
                  where w.session_id = p_session_id and w.tenant_id = v_tenant and w.ticket <= v_ticket));
end;
$$;
comment on function runledger._session_acquire(text, text) is
  'Inside a run''s transaction step: holds the session of that id of the run''s tenant for p_run_id if it is free (or already its own, or its holder ended) and answers {held: true, entry_count}; otherwise queues the run (once) and answers {held: false, holder, position}. Creates the session on first use (per tenant: another tenant''s session of the same id is another session). Invalid id: RL003.';

create function runledger._session_leave(p_session_id text, p_run_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
begin
  select * into v_session from runledger.sessions
   where session_id = p_session_id and tenant_id = runledger._run_tenant(p_run_id) for update;
  if found and v_session.holder_run_id = p_run_id then
    -- The hand-off came just as the wait timed out: the session is the run's.
    return jsonb_build_object('held', true, 'entry_count', v_session.entry_count);
  end if;
  delete from runledger.session_waiters where session_id = p_session_id and run_id = p_run_id;
  return jsonb_build_object('held', false, 'holder', v_session.holder_run_id);
end;
$$;
comment on function runledger._session_leave(text, text) is
  'A queued run gives up (its wait timed out): it leaves the queue of its tenant''s session, unless the session was handed to it meanwhile ({held: true, entry_count}).';

create function runledger._session_release(p_session_id text, p_run_id text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant text := runledger._run_tenant(p_run_id);
begin
  perform 1 from runledger.sessions
   where session_id = p_session_id and tenant_id = v_tenant and holder_run_id = p_run_id for update;
  if not found then
    return false;
  end if;
  perform runledger._session_free(p_session_id, v_tenant, 'released');
  return true;
end;
$$;
comment on function runledger._session_release(text, text) is
  'The holder lets go of the session (session.release()); the next waiter gets it and is woken. False when p_run_id does not hold it.';

create function runledger._session_append(p_session_id text, p_run_id text, p_position int, p_entries jsonb) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
  v_count   int;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL005', message = format('session %s is not held by run %s: it does not exist', p_session_id, p_run_id);
  end if;
  if v_session.holder_run_id is distinct from p_run_id then
    if v_session.holder_run_id is null and v_session.last_holder_run_id = p_run_id and v_session.release_reason = 'ended'
       and not exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
      -- The run held it when it ended and has been brought back (retry_run); nobody has held
      -- it since, so its history is still the one the run read: it takes it back.
      update runledger.sessions set holder_run_id = p_run_id, held_at = runledger.now(), updated_at = runledger.now()
       where session_id = p_session_id and tenant_id = v_tenant;
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
  insert into runledger.session_entries (session_id, tenant_id, seq, role, content, run_id, step_position, entry_index)
  select p_session_id, v_tenant, v_session.entry_count + e.ordinality::int, e.value->>'role', e.value->'content', p_run_id, p_position,
         e.ordinality::int - 1
    from jsonb_array_elements(p_entries) with ordinality e;
  get diagnostics v_count = row_count;
  update runledger.sessions set entry_count = entry_count + v_count, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = v_tenant;
  return jsonb_build_object('first_seq', v_session.entry_count + 1, 'last_seq', v_session.entry_count + v_count);
end;
$$;
comment on function runledger._session_append(text, text, int, jsonb) is
  'Inside the holder''s transaction step at p_position: appends the entries ([{role, content}], numbered after the last) to the session of the run''s tenant and answers {first_seq, last_seq}. A run that does not hold the session: RL005 (a run that held it when it ended and was retried takes it back if nobody held it since and nobody waits). Bad entries: RL003.';

create function runledger._session_on_terminal() returns trigger
language plpgsql as $$
declare
  v_session text;
begin
  -- The trigger's WHEN clause tests only the mark (see runs_session_release below): a run
  -- marked in_sessions whose status changed to anything but an end has nothing to let go.
  if old.status is not distinct from new.status or not runledger.is_terminal(new.status) then
    return null;
  end if;
  -- Most runs that end held no session and queued for none: one query (two index probes)
  -- and nothing written. Two queries cost a second executor start per ended run.
  -- No SET clause: it runs inside the engine's functions and inherits their settings.
  if exists (select 1 from runledger.session_waiters w where w.run_id = new.run_id)
     or exists (select 1 from runledger.sessions s where s.holder_run_id = new.run_id) then
    delete from runledger.session_waiters where run_id = new.run_id;
    -- A run holds only sessions of its own tenant.
    for v_session in
      select s.session_id from runledger.sessions s where s.holder_run_id = new.run_id order by s.session_id for update
    loop
      perform runledger._session_free(v_session, coalesce(new.tenant_id, ''), 'ended');
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
  for each row when (new.in_sessions)
  execute function runledger._session_on_terminal();
comment on trigger runs_session_release on runledger.runs is
  'A run marked in_sessions that reaches a terminal status lets go of its sessions and leaves their queues (runledger._session_on_terminal).';

create function runledger.session_history(p_session_id text)
returns table (seq int, role text, content jsonb, run_id text, step_position int, created_at timestamptz)
language plpgsql stable
set enable_seqscan = off set jit = off as $$
declare
  v_tenant text := runledger._session_scope();
begin
  perform runledger._session_check_id(p_session_id);
  if not exists (select 1 from runledger.sessions s where s.session_id = p_session_id and s.tenant_id = v_tenant) then
    raise exception using errcode = 'RL002', message = format('session_history: session %L not found', p_session_id);
  end if;
  return query
    select e.seq, e.role, e.content, e.run_id, e.step_position, e.created_at
      from runledger.session_entries e
     where e.session_id = p_session_id and e.tenant_id = v_tenant
     order by e.seq;
end;
$$;
comment on function runledger.session_history(text) is
  'A session''s history in order: seq, role, content, and the run and step position that appended each entry. The session is the one of the tenant the caller''s session names (runledger.tenant; none: the runs without a tenant). Unknown session: RL002; invalid id: RL003.';

create function runledger._release_session(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('release_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is null then
    return null;
  end if;
  insert into runledger.events (run_id, kind, detail)
  select r.run_id, 'session_released', jsonb_build_object('session_id', p_session_id, 'by', 'operator')
    from runledger.runs r where r.run_id = v_session.holder_run_id;
  return runledger._session_free(p_session_id, v_tenant, 'operator');
end;
$$;
comment on function runledger._release_session(text) is
  'The action behind runledger.release_session (which records it in audit_log): Operator repair: takes a session (of the tenant the caller''s session names) from its holder (a run stuck while holding it) and hands it to the next waiter, which is woken. Returns the new holder (null: nobody waited, or it was free). The former holder''s next append fails with RL005 (SESSION_NOT_HELD); its history records a session_released event. Unknown session: RL002.';

create function runledger._delete_session(p_session_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found then
    raise exception using errcode = 'RL002', message = format('delete_session: session %L not found', p_session_id);
  end if;
  if v_session.holder_run_id is not null
     or exists (select 1 from runledger.session_waiters w where w.session_id = p_session_id and w.tenant_id = v_tenant) then
    raise exception using errcode = 'RL005',
      message = format('delete_session: session %s is held by run %s or has runs queued; release it first (release_session)', p_session_id,
                       coalesce(v_session.holder_run_id, '-'));
  end if;
  delete from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
  return v_session.entry_count;
end;
$$;
comment on function runledger._delete_session(text) is
  'The action behind runledger.delete_session (which records it in audit_log): Operator action: deletes a session (of the tenant the caller''s session names) that nobody holds or waits for, with its history (entries are kept until then, whatever prune() removes). Returns how many entries went. Held or queued for: RL005; unknown: RL002.';

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
       s.updated_at,
       nullif(s.tenant_id, '') as tenant_id
  from runledger.sessions s
  left join runledger.runs r on r.run_id = s.holder_run_id
  left join lateral (
    select array_agg(q.run_id order by q.ticket) as run_ids from runledger.session_waiters q
     where q.session_id = s.session_id and q.tenant_id = s.tenant_id
  ) w on true;
comment on view runledger.session_list is
  'Every session: its holder (run, status, workflow, since when), the runs queued for it in order, its entry count, how it was last let go, and its tenant (null: runs without a tenant; a session id is one session per tenant). select * from runledger.session_history(id) lists one session''s entries (of the tenant runledger.tenant names).';

create table runledger.artifact_blobs (
  sha256     text collate "C" primary key,
  size       bigint not null,
  content    bytea  not null,
  created_at timestamptz not null default runledger.now(),
  constraint artifact_blobs_sha256 check (sha256 ~ '^[0-9a-f]{64}$'),
  constraint artifact_blobs_size check (size = octet_length(content))
);
comment on table runledger.artifact_blobs is
  'Artifact content, stored once by its sha256 (hex) however many artifacts, runs or checkpoints refer to it. Read one with select convert_from(content, ''UTF8'') from runledger.artifact_blobs where sha256 = ...';

create table runledger.artifacts (
  artifact_id   text collate "C" primary key,
  run_id        text collate "C" not null references runledger.runs (run_id) on delete cascade,
  name          text collate "C" not null,
  kind          text collate "C" not null,
  -- The content's sha256: of the stored blob, or as the caller gave it for a reference (may be null then).
  sha256        text collate "C",
  size          bigint,
  -- The blob holding the content here (equal to sha256), or null for an external reference.
  blob          text collate "C" references runledger.artifact_blobs (sha256),
  ref           text collate "C",
  step_position int,
  created_at    timestamptz not null default runledger.now(),
  constraint artifacts_kind check (kind in ('artifact', 'value')),
  constraint artifacts_name check (length(name) between 1 and 200),
  constraint artifacts_content_or_ref check ((blob is null) = (ref is not null) and (blob is null or blob = sha256)),
  constraint artifacts_ref check (ref is null or length(ref) between 1 and 2000),
  constraint artifacts_sha256 check (sha256 is null or sha256 ~ '^[0-9a-f]{64}$'),
  constraint artifacts_size check (size is null or size >= 0)
);
comment on table runledger.artifacts is
  'What runs produced: kind artifact (ctx.artifact, recorded with its step''s checkpoint, once per run and step position) or value (a large step result stored by reference, once per run and content). Content is in artifact_blobs (blob = sha256) or elsewhere (ref).';

-- ctx.artifact: one row per (run, step position); a replay that ran the step again breaks this instead of recording twice.
create unique index artifacts_step on runledger.artifacts (run_id, step_position) where kind = 'artifact';

-- storeLarge: one row per (run, content), however often the value is stored.
create unique index artifacts_value on runledger.artifacts (run_id, blob) where kind = 'value';

-- prune_artifact_blobs asks whether any row still refers to a blob.
create index artifacts_blob on runledger.artifacts (blob) where blob is not null;

create function runledger._artifact_blob_held(p_sha256 text) returns boolean
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  -- FOR KEY SHARE keeps the blob from prune_artifact_blobs until this transaction ends,
  -- so the row recorded next can refer to it without sending the content again.
  perform 1 from runledger.artifact_blobs b where b.sha256 = p_sha256 for key share;
  return found;
end;
$$;
comment on function runledger._artifact_blob_held(text) is
  'True when content with this sha256 is stored, and then kept from deletion until the caller''s transaction ends (the caller records a row referring to it without sending the content).';

create function runledger._record_artifact(
  p_run_id text, p_position int, p_name text, p_kind text, p_sha256 text, p_size bigint, p_content bytea, p_ref text)
returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_row runledger.artifacts;
begin
  if p_content is not null then
    if encode(sha256(p_content), 'hex') <> p_sha256 then
      raise exception using errcode = 'RL003', message = format('artifact %s: the content does not have sha256 %s', p_name, p_sha256);
    end if;
    insert into runledger.artifact_blobs (sha256, size, content) values (p_sha256, octet_length(p_content), p_content)
    on conflict (sha256) do nothing;
  end if;
  if p_kind = 'value' then
    select * into v_row from runledger.artifacts a where a.run_id = p_run_id and a.blob = p_sha256 and a.kind = 'value';
    if found then
      return to_jsonb(v_row);
    end if;
  end if;
  insert into runledger.artifacts (artifact_id, run_id, name, kind, sha256, size, blob, ref, step_position)
  values (runledger._new_id(), p_run_id, p_name, p_kind, p_sha256, p_size,
          case when p_ref is null then p_sha256 end, p_ref, p_position)
  returning * into v_row;
  return to_jsonb(v_row);
end;
$$;
comment on function runledger._record_artifact(text, int, text, text, text, bigint, bytea, text) is
  'Records an artifact row of a run (kind artifact or value) and stores its content as a blob unless it is already stored (p_content null: the caller holds it, _artifact_blob_held) or it is a reference (p_ref). A value already recorded for the run and content is returned as it is. Content that does not hash to p_sha256: RL003.';

create function runledger._prune_artifact_blobs() returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_count bigint;
begin
  -- A blob being referred to right now (FOR KEY SHARE, by a transaction recording a row) is skipped.
  with gone as (
    delete from runledger.artifact_blobs b
     where b.sha256 in (
       select o.sha256 from runledger.artifact_blobs o
        where not exists (select 1 from runledger.artifacts a where a.blob = o.sha256)
        for update skip locked)
    returning 1)
  select count(*) into v_count from gone;
  return v_count;
end;
$$;
comment on function runledger._prune_artifact_blobs() is
  'The action behind runledger.prune_artifact_blobs (which records it in audit_log): Operator action: deletes the blobs no artifact row refers to any more (their runs were pruned); returns how many. A blob being recorded right now is skipped.';

create view runledger.artifact_list as
select a.artifact_id, a.run_id, r.workflow_name, a.name, a.kind, a.sha256, a.size, a.ref,
       a.blob is not null as stored, a.step_position, a.created_at
  from runledger.artifacts a
  join runledger.runs r on r.run_id = a.run_id;
comment on view runledger.artifact_list is
  'Every artifact and stored value with its run and workflow, sha256, size, and where its content is: stored (in artifact_blobs) or ref (elsewhere). engine.readArtifact(artifactId) reads the content.';

create function runledger.release_session(p_session_id text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_next text := runledger._release_session(p_session_id);
begin
  perform runledger._audit('release_session', null, p_session_id,
                           jsonb_build_object('tenant_id', nullif(runledger._session_scope(), '')), to_jsonb(v_next));
  return v_next;
end;
$$;
comment on function runledger.release_session(text) is
  'Operator repair: takes a session (of the tenant the caller''s session names in runledger.tenant; none: the runs without a tenant) from the run holding it and hands it to the next waiting run; returns that run (null: nobody waited). Recorded in audit_log, with the tenant.';

create function runledger.delete_session(p_session_id text) returns int
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_removed int := runledger._delete_session(p_session_id);
begin
  perform runledger._audit('delete_session', null, p_session_id,
                           jsonb_build_object('tenant_id', nullif(runledger._session_scope(), '')), to_jsonb(v_removed));
  return v_removed;
end;
$$;
comment on function runledger.delete_session(text) is
  'Operator action: deletes a session (of the tenant the caller''s session names in runledger.tenant; none: the runs without a tenant) that no run holds or waits for, with its entries; returns how many entries it removed. Recorded in audit_log, with the tenant.';

create function runledger.prune_artifact_blobs() returns bigint
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_removed bigint;
begin
  perform runledger._check_not_tenant_bound('prune_artifact_blobs');
  v_removed := runledger._prune_artifact_blobs();
  perform runledger._audit('prune_artifact_blobs', null, null, '{}', to_jsonb(v_removed));
  return v_removed;
end;
$$;
comment on function runledger.prune_artifact_blobs() is
  'Operator action: deletes artifact contents no artifact refers to any more; returns how many it removed. With tenant isolation on, refused (42501) to an operator bound to a tenant: a blob is stored once for every tenant. Recorded in audit_log.';

create function runledger._session_mark_run() returns trigger
language plpgsql as $$
declare
  v_run_id text;
begin
  if tg_table_name = 'sessions' then
    v_run_id := new.holder_run_id;
  else
    v_run_id := new.run_id;
  end if;
  update runledger.runs set in_sessions = true where run_id = v_run_id and in_sessions is not true;
  return null;
end;
$$;
comment on function runledger._session_mark_run() is
  'Trigger function of sessions_mark_holder and session_waiters_mark_run: marks the run that now holds a session, or queues for one, in_sessions (so runs_session_release fires when it ends).';

create trigger sessions_mark_holder after insert or update of holder_run_id on runledger.sessions
  for each row when (new.holder_run_id is not null) execute function runledger._session_mark_run();
comment on trigger sessions_mark_holder on runledger.sessions is
  'A run that takes a session is marked runs.in_sessions (runledger._session_mark_run).';

create trigger session_waiters_mark_run after insert on runledger.session_waiters
  for each row execute function runledger._session_mark_run();
comment on trigger session_waiters_mark_run on runledger.session_waiters is
  'A run that queues for a session is marked runs.in_sessions (runledger._session_mark_run).';

create function runledger._run_tenant(p_run_id text) returns text
language sql stable as $$
  select coalesce((select r.tenant_id from runledger.runs r where r.run_id = p_run_id), '')
$$;
comment on function runledger._run_tenant(text) is
  'A run''s tenant as the tenant part of a session''s key: runs.tenant_id, '''' for a run without one.';

create function runledger._session_scope() returns text
language sql stable as $$
  select coalesce(current_setting('runledger.tenant', true), '')
$$;
comment on function runledger._session_scope() is
  'The tenant whose session an operator''s call (session_history, release_session, delete_session) addresses: the setting runledger.tenant of the caller''s session, '''' (runs without a tenant) when it names none. With tenant isolation on, a caller bound to a tenant finds only that tenant''s sessions (the policies).';

insert into runledger.migrations (version, name) values (12, '0012_agents');
