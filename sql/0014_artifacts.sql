-- 0014_artifacts: what a run produced (a diff, a report, a large tool output), stored
-- once by content. Content lives in artifact_blobs under its sha256, whatever number of
-- runs or rows refer to it; an artifact row names it (or an external reference). Two
-- kinds of rows (src/agents/artifact.ts):
--   'artifact'  ctx.artifact(name, content | { ref }): recorded in a transaction step with
--               its checkpoint, so exactly once per (run, step position);
--   'value'     a large step result stored by reference (storeLarge): the checkpoint holds
--               {"$artifact": sha256, "size": n} and this row keeps the blob referenced
--               for as long as the run exists; once per (run, content).
--
--   runledger.artifact_blobs           content by sha256, stored once
--   runledger.artifacts                a run's artifacts and stored values, naming a blob or an external reference
--   runledger._artifact_blob_held()    true (and the blob kept from deletion) when the content is already stored
--   runledger._record_artifact()       stores the content (unless held) and records the row
--   runledger.prune_artifact_blobs()   public (operator): deletes blobs no artifact row refers to any more
--   runledger.artifact_list            view: artifacts with their run, kind, size and where the content is
--
-- Retention: an artifact row goes with its run (prune(), on delete cascade); the blob stays
-- until prune_artifact_blobs() finds no row referring to it.

create table runledger.artifact_blobs (
  sha256     text primary key,
  size       bigint not null,
  content    bytea  not null,
  created_at timestamptz not null default runledger.now(),
  constraint artifact_blobs_sha256 check (sha256 ~ '^[0-9a-f]{64}$'),
  constraint artifact_blobs_size check (size = octet_length(content))
);
comment on table runledger.artifact_blobs is
  'Artifact content, stored once by its sha256 (hex) however many artifacts, runs or checkpoints refer to it. Read one with select convert_from(content, ''UTF8'') from runledger.artifact_blobs where sha256 = ...';

create table runledger.artifacts (
  artifact_id   text primary key,
  run_id        text not null references runledger.runs (run_id) on delete cascade,
  name          text not null,
  kind          text not null,
  -- The content's sha256: of the stored blob, or as the caller gave it for a reference (may be null then).
  sha256        text,
  size          bigint,
  -- The blob holding the content here (equal to sha256), or null for an external reference.
  blob          text references runledger.artifact_blobs (sha256),
  ref           text,
  step_position int,
  created_at    timestamptz not null default runledger.now(),
  constraint artifacts_kind check (kind in ('artifact', 'value')),
  constraint artifacts_name check (length(name) between 1 and 200),
  constraint artifacts_content_or_ref check ((blob is null) = (ref is not null) and (blob is null or blob = sha256)),
  constraint artifacts_ref check (ref is null or length(ref) between 1 and 2000),
  constraint artifacts_sha256 check (sha256 is null or sha256 ~ '^[0-9a-f]{64}$'),
  constraint artifacts_size check (size is null or size >= 0)
);
-- ctx.artifact: one row per (run, step position); a replay that ran the step again breaks this instead of recording twice.
create unique index artifacts_step on runledger.artifacts (run_id, step_position) where kind = 'artifact';
-- storeLarge: one row per (run, content), however often the value is stored.
create unique index artifacts_value on runledger.artifacts (run_id, blob) where kind = 'value';
-- prune_artifact_blobs asks whether any row still refers to a blob.
create index artifacts_blob on runledger.artifacts (blob) where blob is not null;
comment on table runledger.artifacts is
  'What runs produced: kind artifact (ctx.artifact, recorded with its step''s checkpoint, once per run and step position) or value (a large step result stored by reference, once per run and content). Content is in artifact_blobs (blob = sha256) or elsewhere (ref).';

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

insert into runledger.migrations (version, name) values (14, '0014_artifacts');
