-- 0016_langgraph: LangGraph.js checkpoints (runledger/langgraph's RunledgerSaver). A graph's
-- thread is a line of checkpoints; each checkpoint names the version of each channel it holds,
-- a channel's value is stored once per version (graph_blobs), and the writes of the tasks that
-- ran after a checkpoint wait beside it (graph_writes) until the next one. The saver writes
-- through the functions below, one round trip per put; it reads the tables.
--
-- tables: graph_checkpoints, graph_blobs, graph_writes
-- views: graph_threads
-- functions: _graph_put, _graph_put_writes, _graph_delete_thread

create table runledger.graph_checkpoints (
  thread_id text collate "C" not null,
  checkpoint_ns text collate "C" not null default '',
  checkpoint_id text collate "C" not null,
  parent_checkpoint_id text collate "C",
  -- The checkpoint without its channel values (those are in graph_blobs, by channel_versions).
  checkpoint jsonb not null,
  metadata jsonb not null default '{}',
  -- The runledger run that wrote it (runGraph), or null for a saver used on its own.
  run_id text collate "C",
  created_at timestamptz not null default runledger.now(),
  primary key (thread_id, checkpoint_ns, checkpoint_id)
);
comment on table runledger.graph_checkpoints is
  'LangGraph checkpoints written by runledger/langgraph''s RunledgerSaver: one row per checkpoint of a thread (and namespace: '''' for the graph, a path for a subgraph), newest last by checkpoint_id (ids sort by time), with the run that wrote it under runGraph.';

create table runledger.graph_blobs (
  thread_id text collate "C" not null,
  checkpoint_ns text collate "C" not null default '',
  channel text collate "C" not null,
  version text collate "C" not null,
  -- The serializer's type tag ('json', 'bytes' ..., 'empty' for a channel without a value).
  type text collate "C" not null,
  blob bytea,
  primary key (thread_id, checkpoint_ns, channel, version)
);
comment on table runledger.graph_blobs is
  'The value of a LangGraph channel at one version, stored once and shared by every checkpoint of the thread that names that version.';

create table runledger.graph_writes (
  thread_id text collate "C" not null,
  checkpoint_ns text collate "C" not null default '',
  checkpoint_id text collate "C" not null,
  task_id text collate "C" not null,
  idx int not null,
  channel text collate "C" not null,
  type text collate "C",
  blob bytea not null,
  task_path text collate "C" not null default '',
  primary key (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
);
comment on table runledger.graph_writes is
  'Pending writes of LangGraph tasks after a checkpoint (a node''s output, an interrupt, an error): a task whose writes are here is not run again when the thread resumes from that checkpoint.';

create function runledger._graph_put(
  p_thread_id text, p_ns text, p_checkpoint_id text, p_parent_id text, p_checkpoint jsonb, p_metadata jsonb,
  p_channels text[], p_versions text[], p_types text[], p_blobs bytea[], p_run_id text default null, p_token bigint default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_thread_id is null or p_checkpoint_id is null or p_checkpoint is null then
    raise exception using errcode = 'RL003', message = '_graph_put: thread_id, checkpoint_id and checkpoint are required';
  end if;
  if p_token is not null then
    -- Written by a run's execution (runGraph): only while it still holds the run (RL001 otherwise).
    perform runledger._fence(p_run_id, p_token);
  end if;
  insert into runledger.graph_blobs (thread_id, checkpoint_ns, channel, version, type, blob)
  select p_thread_id, coalesce(p_ns, ''), c, v, t, b
    from unnest(p_channels, p_versions, p_types, p_blobs) as u(c, v, t, b)
  on conflict do nothing;
  insert into runledger.graph_checkpoints (thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, checkpoint, metadata, run_id)
  values (p_thread_id, coalesce(p_ns, ''), p_checkpoint_id, p_parent_id, p_checkpoint, coalesce(p_metadata, '{}'), p_run_id)
  on conflict (thread_id, checkpoint_ns, checkpoint_id)
  do update set checkpoint = excluded.checkpoint, metadata = excluded.metadata;
end;
$$;
comment on function runledger._graph_put(text, text, text, text, jsonb, jsonb, text[], text[], text[], bytea[], text, bigint) is
  'RunledgerSaver.put: the channel values of the checkpoint''s new versions (once per version) and the checkpoint, in one transaction; putting the same checkpoint id again replaces its checkpoint and metadata. With p_token (runGraph), fenced: refused with RL001 unless the execution still holds run p_run_id under that token.';

create function runledger._graph_put_writes(
  p_thread_id text, p_ns text, p_checkpoint_id text, p_task_id text, p_task_path text,
  p_idx int[], p_channels text[], p_types text[], p_blobs bytea[], p_replace boolean, p_run_id text default null, p_token bigint default null)
returns void language plpgsql volatile
set enable_seqscan = off set jit = off as $$
begin
  if p_token is not null then
    perform runledger._fence(p_run_id, p_token);
  end if;
  if p_replace then
    insert into runledger.graph_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
    select p_thread_id, coalesce(p_ns, ''), p_checkpoint_id, p_task_id, i, c, t, b, coalesce(p_task_path, '')
      from unnest(p_idx, p_channels, p_types, p_blobs) as u(i, c, t, b)
    on conflict (thread_id, checkpoint_ns, checkpoint_id, task_id, idx)
    do update set channel = excluded.channel, type = excluded.type, blob = excluded.blob;
  else
    insert into runledger.graph_writes (thread_id, checkpoint_ns, checkpoint_id, task_id, idx, channel, type, blob, task_path)
    select p_thread_id, coalesce(p_ns, ''), p_checkpoint_id, p_task_id, i, c, t, b, coalesce(p_task_path, '')
      from unnest(p_idx, p_channels, p_types, p_blobs) as u(i, c, t, b)
    on conflict do nothing;
  end if;
end;
$$;
comment on function runledger._graph_put_writes(text, text, text, text, text, int[], text[], text[], bytea[], boolean, text, bigint) is
  'RunledgerSaver.putWrites: a task''s writes after a checkpoint, in one transaction. A regular write is kept as first written (a task run again writes the same); the special channels (errors, interrupts, resumes: p_replace) replace what was there, as LangGraph asks. With p_token (runGraph), fenced as _graph_put.';

create function runledger._graph_delete_thread(p_thread_id text) returns void
language sql volatile
set enable_seqscan = off set jit = off as $$
  delete from runledger.graph_writes where thread_id = p_thread_id;
  delete from runledger.graph_blobs where thread_id = p_thread_id;
  delete from runledger.graph_checkpoints where thread_id = p_thread_id;
$$;
comment on function runledger._graph_delete_thread(text) is
  'RunledgerSaver.deleteThread: every checkpoint, channel value and pending write of a thread, in every namespace.';

create view runledger.graph_threads as
select c.thread_id,
       count(*)::int as checkpoints,
       max(c.checkpoint_id) as latest_checkpoint_id,
       (array_agg(c.metadata order by c.checkpoint_id desc))[1] as latest_metadata,
       (array_agg(c.run_id order by c.checkpoint_id desc))[1] as latest_run_id,
       (select count(*)::int from runledger.graph_writes w
         where w.thread_id = c.thread_id and w.checkpoint_id = max(c.checkpoint_id) and w.checkpoint_ns = '') as pending_writes,
       max(c.created_at) as updated_at
  from runledger.graph_checkpoints c
 where c.checkpoint_ns = ''
 group by c.thread_id;
comment on view runledger.graph_threads is
  'One row per LangGraph thread (its root namespace): how many checkpoints, the latest one''s id and metadata (source, step), the run that wrote it, the pending writes after it, when it was written.';

insert into runledger.role_functions (role_name, function_name)
select 'runledger_worker', f from unnest(array['_graph_put', '_graph_put_writes', '_graph_delete_thread']) f;

-- The new functions lose PUBLIC's execute, and the granted ones become SECURITY DEFINER with a fixed search_path.
select runledger._secure_functions();

-- The roles read the new tables (worker, operator) and view (all three) once grant_roles() runs
-- again: here, where the migrating role may; elsewhere a DBA runs it, as after 0014.
do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: the graph tables are not granted yet (% may not grant roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (16, '0016_langgraph');
