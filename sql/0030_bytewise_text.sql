-- 0030_bytewise_text: every text column of runledger's tables compares bytewise (COLLATE "C").
--
-- Redefines: the collation of each text and text[] column of the tables in schema runledger
-- (run ids, workflow, queue and session names, keys, statuses written as text, ...), and so
-- every index on them. The views, row-level policies and the trigger that name those
-- columns are dropped and made again from their own stored definitions, with their
-- comments and grants (PostgreSQL refuses to change a column's type under them).
--
-- Why: an index on text compares its keys with the column's collation, and a column takes
-- the database's default. Under a linguistic collation (en_US.UTF-8, the default of the
-- official Docker image and of many installers) each comparison is a strcoll() that walks
-- the locale's tables; under "C" it is a memcmp. The engine's keys are identifiers (ULIDs,
-- names), never sorted for people, and a run's row and its history are found by them at
-- every start, claim and completion. Callgrind, PostgreSQL 15, the same build, by the
-- database's collation:
--
--   | server instructions                    | C.UTF-8 | en_US.UTF-8 | C       |
--   | a start_runs row (batches of 1,000)    | 118,021 | 249,796     | 112,757 |
--   | a drained one-step run (batches of 16) | 895,458 | 1,689,247   | 865,148 |
--
-- With this migration every database gets the last column, whatever its default. Order
-- changes only where it is by one of these columns and the database's collation is not
-- bytewise: run ids then sort as ULIDs are meant to (byte order), as they already did under
-- C.UTF-8. Equality is the same under every deterministic collation, so no lookup changes.
-- A user's own table joined to these columns compares under "C" too, and an index of its
-- built under another collation no longer serves that comparison: docs/psql.md ("Tables")
-- says to declare such a column collate "C" (or index it so).
--
-- Cost on an existing database: each table's indexes on these columns are built again
-- while the migration holds the table's lock: 10.4 s on PostgreSQL 15 for a database of
-- 1,010,000 runs, 3,020,000 steps and 3,030,000 events (1.7 GB). A view of another schema
-- that reads these columns stops the migration, named in its error, before anything is
-- changed: PostgreSQL cannot change a column under it, and dropping a user's view is not
-- this migration's to do.
--
-- test/sql/collation.test.ts checks that every text column of the schema is "C" (a new
-- column must say `collate "C"`), and that the rebuilt views, policies and trigger are the
-- ones the earlier migrations made.

do $migration$
declare
  v_foreign text;
  v_sql text;
  v_left int;
  v_before int;
  v_view record;
begin
  select string_agg(distinct format('%I.%I', vn.nspname, v.relname), ', ') into v_foreign
    from pg_depend d
    join pg_rewrite rw on rw.oid = d.objid and d.classid = 'pg_rewrite'::regclass
    join pg_class v on v.oid = rw.ev_class
    join pg_namespace vn on vn.oid = v.relnamespace
    join pg_class t on t.oid = d.refobjid and d.refclassid = 'pg_class'::regclass
   where t.relnamespace = 'runledger'::regnamespace and v.relnamespace <> 'runledger'::regnamespace;
  if v_foreign is not null then
    raise exception using errcode = 'RL003',
      message = format('migration 0030 changes the collation of runledger''s text columns, and these views of other schemas read them: %s', v_foreign),
      hint = 'Drop them, run the migration, and create them again (pg_get_viewdef gives their definitions).';
  end if;

  -- What is made again afterwards, each with the statements that make it, in that order.
  create temp table runledger_0030_rebuild (kind text, name text, statements text[]) on commit drop;

  insert into runledger_0030_rebuild
  select 'view', c.relname,
         array[format('create view runledger.%I%s as %s', c.relname,
                      coalesce(' with (' || array_to_string(c.reloptions, ', ') || ')', ''), pg_get_viewdef(c.oid)),
               format('comment on view runledger.%I is %L', c.relname, obj_description(c.oid, 'pg_class'))]
         || coalesce((select array_agg(format('comment on column runledger.%I.%I is %L', c.relname, a.attname, d.description))
                        from pg_description d join pg_attribute a on a.attrelid = d.objoid and a.attnum = d.objsubid
                       where d.objoid = c.oid and d.classoid = 'pg_class'::regclass and d.objsubid > 0), '{}')
         || coalesce((select array_agg(format('grant %s on runledger.%I to %s', acl.privilege_type, c.relname,
                                              case when acl.grantee = 0 then 'public' else acl.grantee::regrole::text end))
                        from aclexplode(c.relacl) acl
                       where acl.grantee <> c.relowner), '{}')
    from pg_class c
   where c.relnamespace = 'runledger'::regnamespace and c.relkind = 'v';

  insert into runledger_0030_rebuild
  select 'policy', format('%s on %s', p.polname, p.polrelid::regclass),
         array[format('create policy %I on %s as %s for %s to %s%s%s', p.polname, p.polrelid::regclass,
                      case when p.polpermissive then 'permissive' else 'restrictive' end,
                      case p.polcmd when 'r' then 'select' when 'a' then 'insert' when 'w' then 'update' when 'd' then 'delete' else 'all' end,
                      (select coalesce(string_agg(case when r = 0 then 'public' else r::regrole::text end, ', '), 'public')
                         from unnest(p.polroles) r),
                      coalesce(' using (' || pg_get_expr(p.polqual, p.polrelid) || ')', ''),
                      coalesce(' with check (' || pg_get_expr(p.polwithcheck, p.polrelid) || ')', ''))]
         || coalesce((select array[format('comment on policy %I on %s is %L', p.polname, p.polrelid::regclass, d.description)]
                        from pg_description d where d.objoid = p.oid and d.classoid = 'pg_policy'::regclass), '{}')
    from pg_policy p join pg_class c on c.oid = p.polrelid
   where c.relnamespace = 'runledger'::regnamespace;

  -- Triggers that name a column (UPDATE OF, or their WHEN clause): the others are not in the way.
  insert into runledger_0030_rebuild
  select 'trigger', format('%s on %s', t.tgname, t.tgrelid::regclass),
         array[pg_get_triggerdef(t.oid)]
         || coalesce((select array[format('comment on trigger %I on %s is %L', t.tgname, t.tgrelid::regclass, d.description)]
                        from pg_description d where d.objoid = t.oid and d.classoid = 'pg_trigger'::regclass), '{}')
    from pg_trigger t join pg_class c on c.oid = t.tgrelid
   where c.relnamespace = 'runledger'::regnamespace and not t.tgisinternal
     and (t.tgattr::int2[] <> '{}' or t.tgqual is not null);

  for v_sql in select format('drop trigger %I on %s', t.tgname, t.tgrelid::regclass)
                 from pg_trigger t join pg_class c on c.oid = t.tgrelid
                where c.relnamespace = 'runledger'::regnamespace and not t.tgisinternal
                  and (t.tgattr::int2[] <> '{}' or t.tgqual is not null)
               union all
               select format('drop policy %I on %s', p.polname, p.polrelid::regclass)
                 from pg_policy p join pg_class c on c.oid = p.polrelid
                where c.relnamespace = 'runledger'::regnamespace loop
    execute v_sql;
  end loop;
  -- Views that read other views go first: drop what nothing depends on, until none is left.
  loop
    v_before := (select count(*) from pg_class where relnamespace = 'runledger'::regnamespace and relkind = 'v');
    exit when v_before = 0;
    for v_view in select relname from pg_class where relnamespace = 'runledger'::regnamespace and relkind = 'v' loop
      begin
        execute format('drop view runledger.%I', v_view.relname);
      exception when dependent_objects_still_exist then
        null;
      end;
    end loop;
    if (select count(*) from pg_class where relnamespace = 'runledger'::regnamespace and relkind = 'v') = v_before then
      raise exception 'migration 0030: the views of schema runledger could not be dropped (something else depends on them)';
    end if;
  end loop;

  -- One ALTER TABLE per table: each of its indexes is built once.
  for v_sql in
    select format('alter table %s %s', a.attrelid::regclass,
                  string_agg(format('alter column %I type %s collate "C"', a.attname, format_type(a.atttypid, a.atttypmod)), ', ' order by a.attnum))
      from pg_attribute a join pg_class c on c.oid = a.attrelid
     where c.relnamespace = 'runledger'::regnamespace and c.relkind in ('r', 'p')
       and a.attnum > 0 and not a.attisdropped and a.attcollation not in (0, 'pg_catalog."C"'::regcollation)
     group by a.attrelid
     order by a.attrelid::regclass::text
  loop
    execute v_sql;
  end loop;

  -- Views in an order their dependencies allow: create what can be, until all are made.
  loop
    v_left := (select count(*) from runledger_0030_rebuild where kind = 'view');
    exit when v_left = 0;
    for v_view in select name, statements from runledger_0030_rebuild where kind = 'view' loop
      begin
        execute v_view.statements[1];
        delete from runledger_0030_rebuild where kind = 'view' and name = v_view.name;
        for v_sql in select s from unnest(v_view.statements[2:]) s loop
          execute v_sql;
        end loop;
      exception when undefined_table then
        null;
      end;
    end loop;
    if (select count(*) from runledger_0030_rebuild where kind = 'view') = v_left then
      raise exception 'migration 0030: the views of schema runledger could not be made again';
    end if;
  end loop;
  for v_sql in select s from runledger_0030_rebuild, unnest(statements) s where kind in ('policy', 'trigger') loop
    execute v_sql;
  end loop;
end;
$migration$;

insert into runledger.migrations (version, name) values (30, '0030_bytewise_text');
