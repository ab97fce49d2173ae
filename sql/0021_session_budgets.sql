-- 0021_session_budgets: a budget that spans every run that uses a session. A session has at
-- most one holder at a time (0012), so its spending is the sum of what each holder charged
-- while it held it: when a run takes a session that has a budget, the run's own counters are
-- marked, and its limits are tightened so that the session's remainder is all it may spend
-- (the run's own limits still apply, the smaller wins). The run's charges then go through
-- its own budget checks, the group commit's fast path included, and a charge past the
-- session's remainder ends the run TERMINATED (BUDGET) with the session named in the
-- evidence. When the run lets go (release, end, operator), what it charged since the mark is
-- added to the session once, in the transaction that frees it, and its own limits come back.
--
-- columns: sessions.budget_limits, sessions.budget_used, sessions.holder_mark
-- views: session_budgets
-- redefines: _session_free, _charge
-- functions: set_session_budget, _session_budget_hold, _set_session_budget, _session_budget_replace,
--   _session_budget_open, _session_budget_close, _session_budget_caps, _check_budget_amounts, _set_run_limits, _run_amounts,
--   _run_limits, _sub_amounts

alter table runledger.sessions
  add column budget_limits jsonb,
  add column budget_used   jsonb not null default '{}',
  add column holder_mark   jsonb;
comment on column runledger.sessions.budget_limits is
  'The session''s budget per dimension (units, tokens, cost_usd, tool_calls, turns), spanning every run that holds it; null: none. Set by the last openSession(..., { budget }) or by set_session_budget.';
comment on column runledger.sessions.budget_used is
  'What the runs that held the session charged while they held it, added when each let go (the holder''s charges so far are in the view session_budgets).';
comment on column runledger.sessions.holder_mark is
  'While a run holds a session that has a budget: {used: the run''s counters when it took it, cap: the limits the session allows it, base: its limits without any session''s cap}. Null otherwise.';

create function runledger._run_amounts(p_budget_spent numeric, p_budget_used jsonb) returns jsonb
language sql immutable parallel safe as $$
  select coalesce(p_budget_used, '{}'::jsonb) || jsonb_build_object('units', coalesce(p_budget_spent, 0))
$$;
comment on function runledger._run_amounts(numeric, jsonb) is
  'A run''s spending as one object of dimensions: budget_used with units (budget_spent).';

create function runledger._run_limits(p_budget numeric, p_budget_limits jsonb) returns jsonb
language sql immutable parallel safe as $$
  select coalesce(p_budget_limits, '{}'::jsonb)
         || case when p_budget is null then '{}'::jsonb else jsonb_build_object('units', p_budget) end
$$;
comment on function runledger._run_limits(numeric, jsonb) is
  'A run''s limits as one object of dimensions: budget_limits with units (budget); a dimension without a limit is absent.';

create function runledger._sub_amounts(p_a jsonb, p_b jsonb) returns jsonb
language sql immutable as $$
  select coalesce(jsonb_object_agg(k, d), '{}'::jsonb)
    from (select k, coalesce((p_a->>k)::numeric, 0) - coalesce((p_b->>k)::numeric, 0) as d
            from (select jsonb_object_keys(coalesce(p_a, '{}'::jsonb)) union select jsonb_object_keys(coalesce(p_b, '{}'::jsonb))) keys(k)) x
   where d <> 0
$$;
comment on function runledger._sub_amounts(jsonb, jsonb) is 'The difference per key of two objects of numbers (a - b); keys whose difference is 0 are left out.';

create function runledger._session_budget_caps(p_run_id text, p_base jsonb) returns jsonb
language sql stable as $$
  -- Per dimension, the smallest of the run's own limit and the caps of the budgeted sessions it holds.
  select coalesce(jsonb_object_agg(dim, lim), '{}'::jsonb)
    from (select dim, min(lim) as lim
            from (select l.key as dim, l.value::numeric as lim from jsonb_each_text(coalesce(p_base, '{}'::jsonb)) l
                  union all
                  select c.key, c.value::numeric
                    from runledger.sessions s, jsonb_each_text(s.holder_mark->'cap') c
                   where s.holder_run_id = p_run_id and s.holder_mark is not null) x
           group by dim) y
$$;
comment on function runledger._session_budget_caps(text, jsonb) is
  'The limits a run is held to: per dimension the smallest of p_base (its own limits) and the cap of each session with a budget that it holds.';

create function runledger._set_run_limits(p_run_id text, p_limits jsonb) returns runledger.runs
language sql volatile as $$
  update runledger.runs
     set budget = (p_limits->>'units')::numeric, budget_limits = nullif(p_limits - 'units', '{}'::jsonb)
   where run_id = p_run_id
  returning *
$$;
comment on function runledger._set_run_limits(text, jsonb) is
  'Writes a run''s limits from one object of dimensions (units to budget, the others to budget_limits) and returns the row.';

create function runledger._session_budget_open(p_session_id text, p_tenant_id text, p_base jsonb) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
  v_run     runledger.runs;
  v_used    jsonb;
  v_base    jsonb;
  v_cap     jsonb;
begin
  -- The caller holds the session row; its holder takes the session's remainder as a cap.
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = p_tenant_id;
  if v_session.holder_run_id is null or v_session.budget_limits is null or v_session.holder_mark is not null then
    return;
  end if;
  select * into v_run from runledger.runs where run_id = v_session.holder_run_id for update;
  if not found then
    return;
  end if;
  v_used := runledger._run_amounts(v_run.budget_spent, v_run.budget_used);
  -- Its own limits: those recorded with another budgeted session it holds, else its current ones.
  v_base := coalesce(p_base,
                     (select s.holder_mark->'base' from runledger.sessions s
                       where s.holder_run_id = v_run.run_id and s.holder_mark is not null limit 1),
                     runledger._run_limits(v_run.budget, v_run.budget_limits));
  select jsonb_object_agg(l.key, coalesce((v_used->>l.key)::numeric, 0)
                                 + greatest(0, l.value::numeric - coalesce((v_session.budget_used->>l.key)::numeric, 0)))
    into v_cap
    from jsonb_each_text(v_session.budget_limits) l;
  update runledger.sessions
     set holder_mark = jsonb_build_object('used', v_used, 'cap', coalesce(v_cap, '{}'::jsonb), 'base', v_base)
   where session_id = p_session_id and tenant_id = p_tenant_id;
  perform runledger._set_run_limits(v_run.run_id, runledger._session_budget_caps(v_run.run_id, v_base));
end;
$$;
comment on function runledger._session_budget_open(text, text, jsonb) is
  'The holder of a session with a budget (the row locked by the caller) is marked: its counters now, the cap the session''s remainder allows, its own limits (p_base, or found); its limits become the smallest of its own and its sessions'' caps.';

create function runledger._session_budget_close(p_session_id text, p_tenant_id text) returns jsonb
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions;
  v_run     runledger.runs;
begin
  -- The caller holds the session row. What the holder charged since its mark goes to the
  -- session, once: the mark is cleared in the same transaction.
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = p_tenant_id;
  if v_session.holder_mark is null then
    return null;
  end if;
  select * into v_run from runledger.runs where run_id = v_session.holder_run_id;
  update runledger.sessions
     set budget_used = case when v_run.run_id is null then budget_used
                            else runledger._add_amounts(budget_used,
                                   runledger._sub_amounts(runledger._run_amounts(v_run.budget_spent, v_run.budget_used),
                                                          v_session.holder_mark->'used')) end,
         holder_mark = null
   where session_id = p_session_id and tenant_id = p_tenant_id;
  return v_session.holder_mark->'base';
end;
$$;
comment on function runledger._session_budget_close(text, text) is
  'Ends the budget mark of a session''s holder (the row locked by the caller): what it charged since the mark is added to the session''s budget_used, once. Returns the holder''s own limits recorded at the mark (null: no mark) for the caller to give back.';

-- The holder lets go: as in 0012, and its spending is added to the session's budget and its own
-- limits come back.
create or replace function runledger._session_free(p_session_id text, p_tenant_id text, p_reason text) returns text
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_holder text;
  v_base   jsonb;
begin
  select holder_run_id into v_holder from runledger.sessions where session_id = p_session_id and tenant_id = p_tenant_id;
  v_base := runledger._session_budget_close(p_session_id, p_tenant_id);
  update runledger.sessions
     set last_holder_run_id = holder_run_id, holder_run_id = null, held_at = null,
         released_at = runledger.now(), release_reason = p_reason, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = p_tenant_id and holder_run_id is not null;
  -- Its own limits come back, also when it ended: a run brought back by retry_run goes on
  -- under them, not under a cap of a session it no longer holds.
  if v_base is not null then
    perform runledger._set_run_limits(v_holder, runledger._session_budget_caps(v_holder, v_base));
  end if;
  return runledger._session_handoff(p_session_id, p_tenant_id);
end;
$$;
comment on function runledger._session_free(text, text, text) is
  'The holder of the session (locked by the caller) lets go, for p_reason (released, ended, operator): what it charged while holding a session with a budget is added to that budget and its own limits come back; the session goes to the next waiter. Returns the new holder or null.';

create function runledger._session_budget_replace(p_session_id text, p_tenant_id text, p_budget jsonb) returns void
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_base   jsonb := runledger._session_budget_close(p_session_id, p_tenant_id);
  v_holder text;
begin
  -- The caller holds the session row. What the holder spent so far is counted under the old
  -- budget; it is then held to the new one's remainder (or, with none, to its own limits).
  update runledger.sessions set budget_limits = p_budget, updated_at = runledger.now()
   where session_id = p_session_id and tenant_id = p_tenant_id
  returning holder_run_id into v_holder;
  if v_holder is not null and v_base is not null then
    perform runledger._set_run_limits(v_holder, runledger._session_budget_caps(v_holder, v_base));
  end if;
  perform runledger._session_budget_open(p_session_id, p_tenant_id, v_base);
end;
$$;
comment on function runledger._session_budget_replace(text, text, jsonb) is
  'A session''s budget becomes p_budget (null: none); the row is locked by the caller. The holder''s mark is closed (its spending counted) and taken again against the new budget.';

create function runledger._session_budget_hold(p_session_id text, p_run_id text, p_budget jsonb)
returns table (budget numeric, budget_spent numeric, budget_limits jsonb, budget_used jsonb)
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._run_tenant(p_run_id);
  v_session runledger.sessions;
begin
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  if not found or v_session.holder_run_id is distinct from p_run_id then
    raise exception using errcode = 'RL005', message = format('session %s is not held by run %s', p_session_id, p_run_id);
  end if;
  if p_budget is not null then
    perform runledger._check_budget_amounts(p_budget, 'session budget');
  end if;
  if p_budget is not null and p_budget is distinct from v_session.budget_limits then
    perform runledger._session_budget_replace(p_session_id, v_tenant, p_budget);
  else
    perform runledger._session_budget_open(p_session_id, v_tenant, null);
  end if;
  return query select r.budget, r.budget_spent, r.budget_limits, r.budget_used from runledger.runs r where r.run_id = p_run_id;
end;
$$;
comment on function runledger._session_budget_hold(text, text, jsonb) is
  'Inside the transaction step that took the session: p_budget (an object of dimensions; null: keep the session''s) becomes the session''s budget, and the holder is held to the session''s remainder. Returns the run''s budget columns. RL005 when p_run_id does not hold the session; RL003 for a bad budget.';

create function runledger._check_budget_amounts(p_amounts jsonb, p_what text) returns void
language plpgsql immutable as $$
begin
  if jsonb_typeof(p_amounts) <> 'object' or exists (
       select 1 from jsonb_each(p_amounts) e
        where e.key not in ('units', 'tokens', 'cost_usd', 'tool_calls', 'turns')
           or jsonb_typeof(e.value) <> 'number' or (e.value #>> '{}')::numeric < 0) then
    raise exception using errcode = 'RL003',
      message = format('%s: %s is not an object of amounts >= 0 of units, tokens, cost_usd, tool_calls, turns', p_what, left(p_amounts::text, 200));
  end if;
end;
$$;
comment on function runledger._check_budget_amounts(jsonb, text) is
  'RL003 unless p_amounts is an object of numbers >= 0 of the budget dimensions (units, tokens, cost_usd, tool_calls, turns).';

create function runledger._set_session_budget(p_session_id text, p_budget jsonb) returns runledger.sessions
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_tenant  text := runledger._session_scope();
  v_session runledger.sessions;
begin
  perform runledger._session_check_id(p_session_id);
  if p_budget is not null then
    perform runledger._check_budget_amounts(p_budget, 'set_session_budget');
  end if;
  insert into runledger.sessions (session_id, tenant_id) values (p_session_id, v_tenant)
  on conflict (session_id, tenant_id) do nothing;
  perform 1 from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant for update;
  perform runledger._session_budget_replace(p_session_id, v_tenant, p_budget);
  select * into v_session from runledger.sessions where session_id = p_session_id and tenant_id = v_tenant;
  return v_session;
end;
$$;
comment on function runledger._set_session_budget(text, jsonb) is
  'The action behind runledger.set_session_budget (which records it in audit_log).';

create function runledger.set_session_budget(p_session_id text, p_budget jsonb) returns runledger.sessions
language plpgsql volatile
set enable_seqscan = off set jit = off as $$
declare
  v_session runledger.sessions := runledger._set_session_budget(p_session_id, p_budget);
begin
  perform runledger._audit('set_session_budget', v_session.holder_run_id, p_session_id,
                           jsonb_build_object('budget', p_budget, 'tenant_id', nullif(v_session.tenant_id, '')),
                           jsonb_build_object('budget_limits', v_session.budget_limits, 'budget_used', v_session.budget_used));
  return v_session;
end;
$$;
comment on function runledger.set_session_budget(text, jsonb) is
  'Operator action: the budget of a session (of the tenant the caller''s session names; none: the runs without a tenant) across every run that holds it, an object of dimensions ({"tokens": 1000000, "cost_usd": 20}); null removes it. What was spent stays counted; a run holding the session is held to the new remainder at once. Creates the session if it does not exist. Bad budget: RL003. Recorded in audit_log.';

-- As in 0008, and a stop caused by a session's cap names the session in its evidence.
create or replace function runledger._charge(p_run runledger.runs, p_charge jsonb, p_step text, p_seq int) returns runledger.runs
language plpgsql volatile as $$
declare
  v_run    runledger.runs;
  v_charge jsonb := runledger._as_charge(p_charge);
  v_units  numeric := coalesce((v_charge->>'units')::numeric, 0);
  v_other  jsonb := v_charge - 'units';
  v_dim    text;
  v_limit  numeric;
  v_spent  numeric;
  v_evidence jsonb;
  v_session  jsonb;
begin
  -- units stay in budget_spent; the other dimensions add up in budget_used.
  update runledger.runs r
     set budget_spent = r.budget_spent + v_units,
         budget_used = case when v_other = '{}'::jsonb then r.budget_used
                            else runledger._add_amounts(r.budget_used, v_other) end
   where r.run_id = p_run.run_id
  returning * into v_run;
  if v_run.budget is not null and v_run.budget_spent > v_run.budget then
    v_dim := 'units';
    v_evidence := jsonb_build_object('dimension', 'units', 'limit', v_run.budget, 'budget', v_run.budget, 'spent', v_run.budget_spent,
                                     'charge', v_units, 'step', p_step, 'seq', p_seq);
  else
    -- The first dimension (in a fixed order) past its limit names the stop.
    foreach v_dim in array array['tokens', 'cost_usd', 'tool_calls', 'turns'] loop
      v_limit := (v_run.budget_limits->>v_dim)::numeric;
      v_spent := coalesce((v_run.budget_used->>v_dim)::numeric, 0);
      if v_limit is not null and v_spent > v_limit then
        v_evidence := jsonb_build_object('dimension', v_dim, 'limit', v_limit, 'spent', v_spent, 'budget_used', v_run.budget_used,
                                         'charge', coalesce((v_other->>v_dim)::numeric, 0), 'step', p_step, 'seq', p_seq);
        exit;
      end if;
    end loop;
  end if;
  if v_evidence is null then
    return v_run;
  end if;
  -- The limit passed is a session's cap (a session budget), not the run's own: say which.
  select jsonb_build_object('session_id', s.session_id, 'budget', s.budget_limits->(v_dim),
                            'spent_before', coalesce((s.budget_used->>v_dim)::numeric, 0))
    into v_session
    from runledger.sessions s
   where s.holder_run_id = v_run.run_id and s.holder_mark is not null
     and (s.holder_mark->'cap'->>v_dim)::numeric = (v_evidence->>'limit')::numeric
     and (s.holder_mark->'base'->>v_dim) is distinct from (v_evidence->>'limit')
   order by s.session_id limit 1;
  if v_session is not null then
    v_evidence := v_evidence || jsonb_build_object('session', v_session);
  end if;
  perform runledger._terminate_run(v_run.run_id, v_run.fencing_token, 'BUDGET', v_evidence);
  select * into v_run from runledger.runs where run_id = p_run.run_id;
  return v_run;
end;
$$;
comment on function runledger._charge(runledger.runs, jsonb, text, int) is
  'Adds a charge ({"units": n, "tokens": n, "cost_usd": n, "tool_calls": n, "turns": n}, any subset; a bare number is units) to the run: units to budget_spent, the others to budget_used. Past a limit (budget, or a dimension of budget_limits) the run ends TERMINATED (BUDGET) in the same transaction, with evidence naming the dimension, its limit, what was spent, the charge and the step, and the session when the limit is a session budget''s remainder.';

create view runledger.session_budgets as
-- Plain SQL only: a view's function calls are checked against the reader's rights.
select s.session_id, nullif(s.tenant_id, '') as tenant_id, s.budget_limits as budget, x.spent,
       (select coalesce(jsonb_object_agg(l.key, greatest(0, l.value::numeric - coalesce((x.spent->>l.key)::numeric, 0))), '{}'::jsonb)
          from jsonb_each_text(coalesce(s.budget_limits, '{}'::jsonb)) l) as remaining,
       exists (select 1 from jsonb_each_text(coalesce(s.budget_limits, '{}'::jsonb)) l
                where coalesce((x.spent->>l.key)::numeric, 0) >= l.value::numeric) as exhausted,
       s.holder_run_id, s.updated_at
  from runledger.sessions s
  cross join lateral (
    select coalesce(jsonb_object_agg(d.dim, d.amount), '{}'::jsonb) as spent
      from (select a.dim, sum(a.amount) as amount
              from (select e.key as dim, e.value::numeric as amount from jsonb_each_text(s.budget_used) e
                    union all
                    -- The holder's charges since it took the session.
                    select e.key, e.value::numeric - coalesce((s.holder_mark->'used'->>e.key)::numeric, 0)
                      from runledger.runs r, jsonb_each_text(coalesce(r.budget_used, '{}'::jsonb) || jsonb_build_object('units', r.budget_spent)) e
                     where r.run_id = s.holder_run_id and s.holder_mark is not null) a
             group by a.dim
            having sum(a.amount) <> 0) d) x
 where s.budget_limits is not null or s.budget_used <> '{}'::jsonb;
comment on view runledger.session_budgets is
  'Each session with a budget (or spending recorded against one): its budget per dimension, what the runs that held it spent (the holder''s charges so far included), what remains, whether a dimension is used up, and the holder.';

insert into runledger.role_functions (role_name, function_name)
values ('runledger_worker', '_session_budget_hold'), ('runledger_operator', 'set_session_budget');

select runledger._secure_functions();

do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: the view session_budgets is not granted yet (% may not grant roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (21, '0021_session_budgets');
