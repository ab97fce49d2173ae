-- 0019_governance: what a workflow's runs cost, and the runs a policy stopped. The policy
-- (engine.workflow({ policy })) is asked before each tool call, operation and ctx.exec is
-- first taken; a refusal ends the run TERMINATED with the reason POLICY, its record holding
-- the action, the reason and the evidence (through _terminate_run, as DEADLINE and MAX_STEPS
-- are). The view cost_stats puts each workflow version's spend beside its verified
-- successful runs.
--
-- redefines: termination_reasons
-- views: cost_stats

create or replace function runledger.termination_reasons() returns text[]
language sql immutable as $$
  select array['COMPLETED', 'FAILED', 'CANCELLED', 'DEADLINE', 'MAX_STEPS', 'BUDGET', 'NO_PROGRESS',
               'MAX_RECOVERY_ATTEMPTS', 'NON_DETERMINISM', 'UNVERIFIED', 'POLICY']
$$;
comment on function runledger.termination_reasons() is
  'Why a terminal run stopped (runs.termination_reason); see docs/termination.md for the evidence of each.';

-- Per run first (its spend, its time waiting, what it stores), then per bucket: a run is
-- counted once whatever it holds. It reads every run and its history: a report, not a
-- dashboard query for every second.
create view runledger.cost_stats as
with per_run as (
  select r.workflow_name, r.workflow_version,
         r.version_manifest->>'runtime' as runtime_version,
         r.version_manifest->>'checkpointSchema' as checkpoint_schema_version,
         coalesce(r.version_manifest->'manifest', '{}') as manifest,
         r.status, r.termination_reason,
         r.status = 'SUCCEEDED' and r.termination_evidence ? 'verification' as verified,
         r.budget_spent as units,
         coalesce((r.budget_used->>'tokens')::numeric, 0) as tokens,
         coalesce((r.budget_used->>'cost_usd')::numeric, 0) as cost_usd,
         coalesce((r.budget_used->>'tool_calls')::numeric, 0) as tool_calls,
         coalesce((r.budget_used->>'turns')::numeric, 0) as turns,
         (select coalesce(sum(extract(epoch from
                   case when s.status = 'WAITING' then runledger.now() else s.finished_at end - s.started_at)), 0)
            from runledger.steps s
           where s.run_id = r.run_id and s.kind in ('sleep', 'signal', 'approval', 'child')) / 86400.0 as waiting_days,
         coalesce(pg_column_size(r.input), 0) + coalesce(pg_column_size(r.output), 0) + coalesce(pg_column_size(r.error), 0)
           + (select coalesce(sum(coalesce(pg_column_size(s.output), 0) + coalesce(pg_column_size(s.error), 0)), 0)
                from runledger.steps s where s.run_id = r.run_id)
           + (select coalesce(sum(pg_column_size(c.chunk)), 0) from runledger.stream_chunks c where c.run_id = r.run_id)
           + (select coalesce(sum(a.size), 0) from runledger.artifacts a where a.run_id = r.run_id and a.blob is not null)
           as bytes
    from runledger.runs r
)
select p.workflow_name, p.workflow_version, p.runtime_version, p.checkpoint_schema_version, p.manifest,
       count(*)::bigint as runs,
       count(*) filter (where p.status = 'SUCCEEDED')::bigint as succeeded,
       count(*) filter (where p.verified)::bigint as verified_succeeded,
       count(*) filter (where p.status in ('FAILED', 'TERMINATED', 'DEAD_LETTER', 'CANCELLED'))::bigint as not_succeeded,
       count(*) filter (where p.termination_reason = 'POLICY')::bigint as stopped_by_policy,
       sum(p.units) as units, sum(p.tokens) as tokens, sum(p.cost_usd) as cost_usd,
       sum(p.tool_calls) as tool_calls, sum(p.turns) as turns,
       -- The spend of every run, failed ones included, over the runs that delivered: what one
       -- verified success costs.
       sum(p.cost_usd) / nullif(count(*) filter (where p.verified), 0) as cost_usd_per_verified_run,
       sum(p.tokens) / nullif(count(*) filter (where p.verified), 0) as tokens_per_verified_run,
       sum(p.cost_usd) / nullif(count(*) filter (where p.status = 'SUCCEEDED'), 0) as cost_usd_per_succeeded_run,
       sum(p.waiting_days) as waiting_run_days,
       count(*) filter (where p.status = 'WAITING')::bigint as waiting_now,
       (sum(p.bytes) / count(*))::bigint as bytes_per_run
  from per_run p
 group by p.workflow_name, p.workflow_version, p.runtime_version, p.checkpoint_schema_version, p.manifest;
comment on view runledger.cost_stats is
  'What runs cost, per workflow, version, runtime version, checkpoint schema version and version manifest (the user''s manifest: agent, prompt, tool versions): runs, succeeded and verified succeeded runs (SUCCEEDED with the evidence of a verify), runs that did not succeed and those a policy stopped; spend per budget dimension (units, tokens, cost_usd, tool_calls, turns); cost and tokens per verified successful run (the spend of every run, failed ones included, over the verified ones) and cost per succeeded run; run-days spent in durable waits (sleep, signal, approval, child; ongoing waits counted to now) and runs waiting now; bytes stored per run (input, output, error, checkpoints, stream chunks, stored artifacts). Reads every run and its history.';

-- The redefined function keeps its settings; the view is read by the three roles once grant_roles() runs.
select runledger._secure_functions();

do $$
begin
  if exists (select from pg_roles where rolname = current_user and (rolsuper or rolcreaterole)) then
    perform runledger.grant_roles();
  else
    raise notice 'runledger: the view cost_stats is not granted yet (% may not grant roles); a DBA runs: select runledger.grant_roles();', current_user;
  end if;
end;
$$;

insert into runledger.migrations (version, name) values (19, '0019_governance');
