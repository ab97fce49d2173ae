-- 0012_streams: durable streams, a run's partial output (ctx.stream(topic), docs/streams.md).
--
--   runledger.stream_chunks        one row per chunk, PK (run_id, topic, offset): a replay that writes an offset again changes nothing
--   runledger.stream_ends          a closed stream and where it ends (its length)
--   runledger.streams              view: each stream of each run, its length and whether it is closed
--   runledger._stream_write(...)   fenced: a batch of a stream's chunks (and its close), one NOTIFY runledger_stream
--   runledger._stream_poll(...)    what a reader needs in one call: the run's status, the stream's end, the next chunks
--   runledger.read_stream(...)     public: a stream's chunks from an offset, for psql
--
-- "offset" is a reserved word in SQL: quote the column ("offset") when naming it.
-- Chunks and ends go with their run (on delete cascade), so runledger.prune removes them.
-- Error codes: RL001 LEASE_LOST, RL002 NOT_FOUND, RL003 INVALID_INPUT.

create table runledger.stream_chunks (
  run_id        text   not null references runledger.runs (run_id) on delete cascade,
  topic         text   not null check (topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' and length(topic) <= 100),
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
  run_id        text   not null references runledger.runs (run_id) on delete cascade,
  topic         text   not null check (topic ~ '^[A-Za-z0-9][A-Za-z0-9_.:/-]*$' and length(topic) <= 100),
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

insert into runledger.migrations (version, name) values (12, '0012_streams');
