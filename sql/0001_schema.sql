-- 0001_schema: the schema, the migrations ledger, the run state machine type, the clock and the pure helpers every file uses.
--
-- tables: migrations, owner_settings
-- functions: _test_clock_now, now, _caller, is_terminal, run_transitions, termination_reasons, step_kinds,
--   wait_kinds, _max_payload_bytes, _check_whole_number, _check_budget_option, _base32_10, _random_40,
--   _new_id, _check_not_tenant_bound, _transition_pairs, _ms_after, _instant
-- types: run_status

create schema if not exists runledger;
comment on schema runledger is
  'runledger: durable queue-and-workflow engine. Read the tables and views; change state through the functions (\df runledger.*).';

create table runledger.migrations (
  version    int primary key,
  name       text collate "C" not null,
  breaking   boolean not null default false,
  applied_at timestamptz not null default now(),
  checksum   text collate "C"
);
comment on table runledger.migrations is
  'Applied runledger migrations (files sql/NNNN_*.sql). A breaking migration newer than the code makes older code refuse to start.';
comment on column runledger.migrations.checksum is
  'sha256 (hex) of the file''s text as applied, recorded by migrate(); migrate() refuses a database whose applied files differ from its own (null: applied with psql, taken as the running build''s).';

create type runledger.run_status as enum (
  'PENDING', 'RUNNING', 'WAITING', 'CANCELLING',
  'SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER'
);
comment on type runledger.run_status is
  'Run state machine. Terminal: SUCCEEDED, FAILED, CANCELLED, TERMINATED, DEAD_LETTER. See docs/state-machine.md.';

-- What only the schema's owner decides: no role may write a table (0014_security.sql), and no
-- function an operator may call writes this one. One row; a missing row means the defaults.
create table runledger.owner_settings (
  one                boolean primary key default true,
  -- The audit log is kept at least this long, whatever rule an operator sets for audit_log.
  audit_log_min_keep interval not null default interval '365 days',
  constraint owner_settings_one check (one),
  constraint owner_settings_audit_log_min_keep check (audit_log_min_keep >= interval '0'),
  -- The test clock (runledger.now() honours fake_now and clock_offset only while true).
  test_clock         boolean not null default false
);
comment on table runledger.owner_settings is
  'Settings only the schema''s owner changes (with UPDATE; no runledger role may write a table, and no function writes this one), one row: audit_log_min_keep, the floor under the audit_log retention rule (default 365 days: set_retention refuses a shorter one with 42501, and prune_due never removes a younger record); test_clock. Every change is recorded in audit_log (action owner_settings), and those records are never pruned.';
comment on column runledger.owner_settings.test_clock is
  'The test clock: while true, runledger.now() honours the session settings runledger.fake_now and runledger.clock_offset of every session; while false (the default), it is the database''s clock whatever a session sets. For test databases only (runledger/testing switches it on in the ones it makes).';

create function runledger._test_clock_now() returns timestamptz
language plpgsql volatile parallel safe cost 1 as $$
begin
  if coalesce((select s.test_clock from runledger.owner_settings s), false) then
    return coalesce(nullif(current_setting('runledger.fake_now', true), '')::timestamptz,
                    clock_timestamp() + coalesce(nullif(current_setting('runledger.clock_offset', true), '')::interval, interval '0'));
  end if;
  return clock_timestamp();
end;
$$;
comment on function runledger._test_clock_now() is
  'runledger.now() of a session that set runledger.fake_now or runledger.clock_offset: the setting''s time when the schema''s owner switched the test clock on (owner_settings.test_clock), else clock_timestamp(). Every role may call it (now() is inlined into their queries); it runs as the owner.';

-- The database clock is the only clock: every time runledger compares (a step's start
-- with a cancel, deadlines, delayed starts, leases, timers) is read from it, and a worker
-- tells the database durations ("started 120 ms ago"), never its own wall-clock time.
-- Tests move it with `set runledger.fake_now = '2030-01-01T00:00:00Z'` (a frozen
-- instant) instead of sleeping, or make it run ahead of (or behind) the real clock with
-- `set runledger.clock_offset = '5 minutes'` (an interval; '-5 minutes' is behind).
create function runledger.now() returns timestamptz
language sql volatile parallel safe as $$
  select case when coalesce(nullif(pg_catalog.current_setting('runledger.fake_now', true), ''),
                            nullif(pg_catalog.current_setting('runledger.clock_offset', true), '')) is null
              then pg_catalog.clock_timestamp()
              else runledger._test_clock_now() end
$$;
comment on function runledger.now() is
  'Current time for every runledger function: clock_timestamp(). Where the schema''s owner switched the test clock on (owner_settings.test_clock), a session''s setting runledger.fake_now (a frozen instant) or runledger.clock_offset (an interval: a clock running ahead or behind) moves it for that session; elsewhere those settings change nothing. Runs as its caller, so the planner inlines it.';

create function runledger._caller() returns text
language sql stable parallel safe as $$
  -- The role the caller acts as. current_user is the function's owner inside a SECURITY
  -- DEFINER function (every public action is one, 0014_security.sql); the setting `role`
  -- keeps what SET ROLE chose, and is 'none' when the login acts as itself.
  select case when current_setting('role') = 'none' then session_user::text else current_setting('role') end
$$;
comment on function runledger._caller() is
  'The role the calling session acts as (SET ROLE''s role, else the login), also inside SECURITY DEFINER functions where current_user is the owner. Recorded as db_role in audit_log, approvals and approval_votes, and checked against role approvers.';

create function runledger.is_terminal(p_status runledger.run_status) returns boolean
language sql immutable parallel safe as $$
  select p_status in ('SUCCEEDED', 'FAILED', 'CANCELLED', 'TERMINATED', 'DEAD_LETTER')
$$;
comment on function runledger.is_terminal(runledger.run_status) is
  'True for the statuses a run never leaves on its own (retry_run, compensate_run and fork_run are explicit operator actions).';

-- The contract lists, defined once for SQL (src/engine/core/states.ts defines them once for
-- TypeScript; test/contracts.test.ts checks that the two agree). Immutable LANGUAGE sql
-- functions of a constant: the planner folds them where the invariants below use them.
create function runledger.run_transitions()
returns table (from_status runledger.run_status, to_status runledger.run_status, by_whom text)
language sql immutable as $$
  values
    ('PENDING'::runledger.run_status, 'RUNNING'::runledger.run_status, 'a claim (_claim_batch, fencing_token + 1), once admitted'),
    ('PENDING', 'CANCELLED', 'cancel_run'),
    ('PENDING', 'CANCELLING', 'cancel_run, or a deadline, with compensations to run'),
    ('PENDING', 'TERMINATED', 'deadline (_enforce_deadlines, or at claim)'),
    ('RUNNING', 'SUCCEEDED', 'the workflow returned (_complete_run)'),
    ('RUNNING', 'FAILED', 'the workflow threw, or its input is invalid (_fail_run)'),
    ('RUNNING', 'TERMINATED', 'deadline, max steps (_terminate_run); budget, no progress (in a checkpoint)'),
    ('RUNNING', 'DEAD_LETTER', 'NON_DETERMINISM, or past max_recovery_attempts'),
    ('RUNNING', 'PENDING', 'lease expired (+1 recovery attempt), or released'),
    ('RUNNING', 'WAITING', 'sleep, signal, approval, child, durable retry backoff, unknown operation'),
    ('RUNNING', 'CANCELLING', 'cancel_run; a policy stop with compensations to run (_terminate_run)'),
    ('WAITING', 'PENDING', 'timer, signal, decision, child ended, resolve_operation (_wake)'),
    ('WAITING', 'RUNNING', 'a claim of a due timer (_claim_batch, queue without limits)'),
    ('WAITING', 'CANCELLED', 'cancel_run'),
    ('WAITING', 'CANCELLING', 'cancel_run, or a deadline, with compensations to run'),
    ('WAITING', 'TERMINATED', 'deadline (_enforce_deadlines, or at claim)'),
    ('CANCELLING', 'CANCELLED', 'the owner (_finish_cancel), or recovery if it died'),
    ('CANCELLING', 'SUCCEEDED', 'the cancel lost the race with the last step (_finish_run)'),
    ('CANCELLING', 'FAILED', 'the cancel lost the race with a failure (_finish_run)'),
    ('CANCELLING', 'TERMINATED', 'the cancel lost the race with a policy stop (_finish_run)'),
    ('CANCELLING', 'DEAD_LETTER', 'the cancel lost the race with a dead-letter (_finish_run)'),
    ('FAILED', 'PENDING', 'retry_run'),
    ('DEAD_LETTER', 'PENDING', 'retry_run'),
    ('FAILED', 'CANCELLING', 'compensate_run'),
    ('CANCELLED', 'CANCELLING', 'compensate_run'),
    ('TERMINATED', 'CANCELLING', 'compensate_run'),
    ('DEAD_LETTER', 'CANCELLING', 'compensate_run')
$$;
comment on function runledger.run_transitions() is
  'The run state machine: every status change a run may make, and who makes it. The trigger runs_transition refuses any other (docs/state-machine.md draws the same list).';

create function runledger.termination_reasons() returns text[]
language sql immutable as $$
  select array['COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET', 'NO_PROGRESS',
               'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM', 'UNVERIFIED']
$$;
comment on function runledger.termination_reasons() is
  'Why a terminal run stopped (runs.termination_reason); see docs/termination.md for the evidence of each.';

create function runledger.step_kinds() returns text[]
language sql immutable as $$
  select array['step', 'transaction', 'operation', 'sleep', 'signal', 'approval', 'child_start', 'child']
$$;
comment on function runledger.step_kinds() is
  'What a checkpoint records (steps.kind): one per ctx call that takes a step position.';

create function runledger.wait_kinds() returns text[]
language sql immutable as $$
  select array['timer', 'signal', 'approval', 'child', 'retry', 'reconcile']
$$;
comment on function runledger.wait_kinds() is
  'What a WAITING run waits for (runs.wait_kind); see docs/state-machine.md.';

create function runledger._max_payload_bytes() returns int
language sql stable parallel safe as $$
  select coalesce(nullif(current_setting('runledger.max_payload_bytes', true), '')::int, 4194304)
$$;
comment on function runledger._max_payload_bytes() is
  'Largest input/output accepted, in bytes: setting runledger.max_payload_bytes, default 4 MiB.';

create function runledger._check_whole_number(p_opts jsonb, p_key text, p_min int) returns void
language plpgsql immutable as $$
begin
  if p_opts ? p_key and jsonb_typeof(p_opts->p_key) <> 'null'
     and (jsonb_typeof(p_opts->p_key) <> 'number' or (p_opts->>p_key) !~ '^\d{1,9}$' or (p_opts->>p_key)::int < p_min) then
    raise exception using errcode = 'RL003',
      message = format('option %s must be a whole number >= %s, not %s', p_key, p_min, p_opts->p_key);
  end if;
end;
$$;
comment on function runledger._check_whole_number(jsonb, text, int) is 'Raises RL003 unless p_opts->p_key is absent or a whole number >= p_min.';

create function runledger._check_budget_option(p_budget jsonb, p_caller text) returns void
language plpgsql immutable as $$
declare
  v_key text;
  v_amount jsonb;
begin
  if p_budget is null or jsonb_typeof(p_budget) = 'null' then
    return;
  end if;
  if jsonb_typeof(p_budget) = 'number' then
    if (p_budget #>> '{}')::numeric < 0 then
      raise exception using errcode = 'RL003', message = format('%s: budget must be a number >= 0, not %s', p_caller, p_budget);
    end if;
    return;
  end if;
  if jsonb_typeof(p_budget) <> 'object' then
    raise exception using errcode = 'RL003',
      message = format('%s: budget must be a number or an object of dimensions (units, tokens, cost_usd, tool_calls, turns), not %s', p_caller, p_budget);
  end if;
  for v_key, v_amount in select key, value from jsonb_each(p_budget) loop
    if v_key <> all (array['units', 'tokens', 'cost_usd', 'tool_calls', 'turns']) then
      raise exception using errcode = 'RL003',
        message = format('%s: budget has an unknown dimension %L (known: units, tokens, cost_usd, tool_calls, turns)', p_caller, v_key);
    end if;
    if jsonb_typeof(v_amount) <> 'number' or (v_amount #>> '{}')::numeric < 0 then
      raise exception using errcode = 'RL003', message = format('%s: budget %s must be a number >= 0, not %s', p_caller, v_key, v_amount);
    end if;
  end loop;
end;
$$;
comment on function runledger._check_budget_option(jsonb, text) is
  'Raises RL003 unless a budget option is absent, a number >= 0 (units) or an object of dimensions units, tokens, cost_usd, tool_calls, turns, each a number >= 0.';

-- ULIDs generated in SQL so that psql-started runs look like TypeScript-started ones:
-- 48-bit millisecond time + 80 random bits (two halves of 40, from a v4 UUID's random
-- bytes: no pgcrypto needed), Crockford base32. Written as expressions, not a loop over
-- 26 characters: the loop cost 12 us or more per id, most of a bulk start's time.
create function runledger._base32_10(p bigint) returns text
language sql immutable as $$
  select substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 45) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 40) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 35) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 30) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 25) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 20) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 15) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 10) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', ((p >> 5) & 31)::int + 1, 1)
      || substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', (p & 31)::int + 1, 1)
$$;
comment on function runledger._base32_10(bigint) is
  'The low 50 bits of p as 10 Crockford base32 characters (inlined into its caller: a ULID''s time part, or with right(..., 8) 40 of its random bits).';

-- 40 random bits: five random bytes of a v4 UUID (bytes 1-5, or 11-15 with p_second).
create function runledger._random_40(p_second boolean default false) returns bigint
language sql volatile as $$
  select ('x' || encode(substring(uuid_send(gen_random_uuid()) from case when p_second then 11 else 1 end for 5), 'hex'))::bit(40)::bigint
$$;
comment on function runledger._random_40(boolean) is 'A random whole number below 2^40 (from gen_random_uuid).';

-- A ULID made in SQL (start_run without a run_id): 10 characters of milliseconds, then 16
-- of randomness. The randomness is 8 bytes of one gen_random_uuid() written in hex (0-9,
-- A-F are Crockford base32 characters): 64 random bits instead of 80, so two ids of the
-- same millisecond collide with odds of about n^2 / 2^65 for n ids. One draw and no
-- per-character lookups: an id is made for every run started from SQL.
create function runledger._new_id() returns text
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

create function runledger._check_not_tenant_bound(p_action text) returns void
language plpgsql stable as $$
begin
  if (select c.relrowsecurity from pg_class c where c.oid = 'runledger.runs'::regclass) and not runledger._tenant_unbound() then
    raise exception using errcode = '42501',
      message = format('%s: acts on every tenant; with tenant isolation on it needs an operator that is not bound to a tenant (the schema''s owner, or a BYPASSRLS role)', p_action);
  end if;
end;
$$;
comment on function runledger._check_not_tenant_bound(text) is
  'Refuses (42501) an action on what all tenants share (set_queue, set_retention, clear_retention, prune_due, prune, prune_artifact_blobs) when tenant isolation is on and the caller is bound to a tenant.';

-- The check is one expression against a constant: _transition_pairs() (IMMUTABLE, no
-- arguments) is evaluated once when PL/pgSQL plans the expression, and the expression is
-- then evaluated without starting an executor. (Written into the trigger's WHEN clause
-- instead, the list is a constant that PostgreSQL parses again from its stored text for every
-- statement that changes a status.)
-- A migration that changes run_transitions() must also `create or replace` this function:
-- sessions keep the folded constant in their cached plan of the trigger's check, and only a
-- change to _transition_pairs() itself (whose folding the plan depends on) invalidates it.
create function runledger._transition_pairs() returns text[]
language sql immutable as $$
  select array_agg(t.from_status::text || '>' || t.to_status::text order by t.from_status, t.to_status)
    from runledger.run_transitions() t
$$;
comment on function runledger._transition_pairs() is
  'run_transitions() as from>to pairs (''RUNNING>SUCCEEDED''), for _check_run (the trigger runs_invariants).';

create function runledger._ms_after(p_from timestamptz, p_ms numeric, p_what text) returns timestamptz
language plpgsql stable as $$
begin
  if p_ms is null then
    return null;
  end if;
  -- NaN compares above every number, so it fails the upper bound. 2^53 - 1 is the largest
  -- whole number a JSON number (a JavaScript one) holds exactly: about 285,000 years.
  if not (p_ms >= 0 and p_ms <= 9007199254740991) then
    raise exception using errcode = 'RL003',
      message = format('%s: %s ms is not a duration (milliseconds from 0 to 9007199254740991, about 285,000 years)', p_what, p_ms);
  end if;
  -- make_interval does not check its range on every server: the bound is checked here,
  -- against the last instant timestamptz holds (294276-12-31, 9224318016000 s after 1970).
  if extract(epoch from p_from) * 1000 + p_ms >= 9224318016000000 then
    raise exception using errcode = 'RL003',
      message = format('%s: %s ms after %s is later than any time PostgreSQL holds (294276-12-31)', p_what, p_ms, p_from);
  end if;
  return p_from + make_interval(secs => p_ms / 1000.0);
end;
$$;
comment on function runledger._ms_after(timestamptz, numeric, text) is
  'p_from plus p_ms milliseconds (null for a null p_ms). RL003, naming p_what, for a p_ms that is negative, NaN or over 9007199254740991 (2^53 - 1), or a result past the last time timestamptz holds (294276-12-31): every duration the engine turns into a time goes through it.';

create function runledger._instant(p_value text, p_what text) returns timestamptz
language plpgsql stable as $$
declare
  v_at timestamptz;
begin
  if p_value is null then
    return null;
  end if;
  begin
    v_at := p_value::timestamptz;
  exception when data_exception then
    raise exception using errcode = 'RL003', message = format('%s: %L is not a timestamp', p_what, p_value);
  end;
  if not isfinite(v_at) then
    raise exception using errcode = 'RL003',
      message = format('%s: %L is not a finite timestamp (infinity and -infinity are refused)', p_what, p_value);
  end if;
  return v_at;
end;
$$;
comment on function runledger._instant(text, text) is
  'p_value read as a timestamptz (null for null). RL003, naming p_what, for text that is not a timestamp and for infinity and -infinity.';

-- One row; a missing row means the defaults.
insert into runledger.owner_settings default values;

insert into runledger.migrations (version, name) values (1, '0001_schema');
