-- 0026_lean_run_rows: what a new run and its history cost besides the run's own row.
--
-- Defines:
--   runledger._delete_run_history()   trigger function: a statement that deletes runs deletes their steps and events
--   runledger._truncate_run_history() trigger function: TRUNCATE of runs empties steps and events
--   triggers runs_delete_history, runs_truncate_history on runledger.runs
-- Redefines:
--   runledger._new_id()               a ULID from one random draw, without per-character lookups
-- Replaces: the key of events (event_id) and the index events_run (run_id, event_id) by
-- one key, events_pkey (run_id, event_id).
-- Drops: the foreign keys events.run_id and steps.run_id -> runs.run_id.
--
-- Why: every events row checked its run through the foreign key, a query per row that also
-- locks the run's row (FOR KEY SHARE), one more WAL record per event. A start writes one
-- event (two when its worker claims it at once), and every claim, completion, wait and
-- wake-up writes one more. Measured with callgrind on PostgreSQL 15: the check was 18 % of
-- the instructions of a start_runs row and 4 % of a start_run call. Events are written
-- only by runledger's own functions, each in the transaction that changes the run the
-- event names (the run exists and is locked there); what the key still gave was its ON
-- DELETE CASCADE, which the statement-level triggers below keep: deleting runs deletes
-- their events in the same statement, and TRUNCATE of runs (with CASCADE, as the other
-- tables still require) empties events.

alter table runledger.events drop constraint events_run_id_fkey;

-- One index for events, not two. The key was event_id alone, beside events_run (run_id,
-- event_id) for a run's history: every event wrote an entry into each. Nothing reads an
-- event by its id alone: a run's history, its deletion and retention all go by run. The
-- key (run_id, event_id) serves all of them, and event_id (an identity) stays unique on
-- its own. Per event, one index entry fewer (its insert and its WAL record): a start, a
-- claim, a completion, a wait and a wake-up each write an event.
alter table runledger.events drop constraint events_pkey;
drop index runledger.events_run;
alter table runledger.events add constraint events_pkey primary key (run_id, event_id);
comment on constraint events_pkey on runledger.events is
  'The key of an event is its run and its place in that run''s history (event_id, an identity, increases with time): a run''s history is read, deleted and pruned by run.';

-- The same for checkpoints: every steps row checked its run through the foreign key, a query
-- per row (about 43,000 instructions of a drained one-step run's 1.08M, callgrind,
-- PostgreSQL 15; a three-step workflow pays it three times). Checkpoints are written only
-- by runledger's fenced functions, each with the run's row locked (_lock_executing, or the
-- group commit's FOR UPDATE of its runs), or with a run the same transaction inserts (a
-- fork); the triggers below are their ON DELETE CASCADE.
alter table runledger.steps drop constraint steps_run_id_fkey;

create function runledger._delete_run_history() returns trigger
language plpgsql
set enable_seqscan = off as $$
begin
  -- By each table's key (run_id first), whatever the transition table's size: the planner
  -- has no statistics for it, and a plan that reads all of events or steps would cost a
  -- deleted run a table scan.
  delete from runledger.steps s where s.run_id = any (array(select g.run_id from gone g));
  delete from runledger.events e where e.run_id = any (array(select g.run_id from gone g));
  return null;
end;
$$;
comment on function runledger._delete_run_history() is
  'Trigger function of runs_delete_history: deletes the checkpoints (steps) and events of the runs a statement deleted (steps.run_id and events.run_id have no foreign key; this is their ON DELETE CASCADE).';

create trigger runs_delete_history after delete on runledger.runs
  referencing old table as gone
  for each statement execute function runledger._delete_run_history();
comment on trigger runs_delete_history on runledger.runs is
  'Deleting runs deletes their checkpoints and events in the same statement (no foreign key, see runledger._delete_run_history).';

create function runledger._truncate_run_history() returns trigger
language plpgsql as $$
begin
  truncate runledger.steps, runledger.events;
  return null;
end;
$$;
comment on function runledger._truncate_run_history() is
  'Trigger function of runs_truncate_history: TRUNCATE of runs empties steps and events (there is no foreign key to cascade through).';

create trigger runs_truncate_history after truncate on runledger.runs
  for each statement execute function runledger._truncate_run_history();
comment on trigger runs_truncate_history on runledger.runs is
  'TRUNCATE of runs empties steps and events too (no foreign key, see runledger._truncate_run_history).';

-- A ULID made in SQL (start_run without a run_id): 10 characters of milliseconds, then 16
-- of randomness. The randomness is 8 bytes of one gen_random_uuid() written in hex (0-9,
-- A-F are Crockford base32 characters): 64 random bits instead of 80, so two ids of the
-- same millisecond collide with odds of about n^2 / 2^65 for n ids. It was two draws and
-- 26 single-character lookups: 72,000 instructions, 8 % of a start_run call (callgrind,
-- PostgreSQL 15); now about a third of that.
create or replace function runledger._new_id() returns text
language plpgsql volatile as $$
declare
  v_ms   bigint := (extract(epoch from clock_timestamp()) * 1000)::bigint;
  v_rand bytea  := uuid_send(gen_random_uuid());
begin
  -- Bytes 1-6 and 11-12 of a version 4 UUID are all random (7 and 9 carry its version and variant).
  return runledger._base32_10(v_ms) || upper(encode(substring(v_rand from 1 for 6) || substring(v_rand from 11 for 2), 'hex'));
end;
$$;
comment on function runledger._new_id() is
  'A new ULID (26 characters of Crockford base32: 10 of milliseconds, then 16 of randomness written as 64 random bits in hex) for ids created in SQL.';

-- No role calls the new functions (triggers and the constraint call them): PUBLIC's default
-- EXECUTE is revoked, as for every runledger function (0017).
select runledger._secure_functions();

insert into runledger.migrations (version, name) values (26, '0026_lean_run_rows');
