import { beforeAll, describe, expect, it } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { insertRun } from '../../helpers/run-factory.js';
import { runCli } from '../../helpers/cli.js';
import type { Engine } from '../../../src/index.js';

/**
 * Retention (sql/0013_retention.sql, docs/retention.md): runledger.prune_due applies the
 * rules of runledger.retention per kind and per workflow, in batches, and never removes a
 * run that is not finished, the source of a live fork lineage, the parent or child of a
 * live run, or a run whose idempotency key a rule still holds. The workers apply it on
 * their own, one worker per pass.
 */
const t = useTestEngine({ engine: false });
const { db } = t;
const q = (sql: string, params: unknown[] = []) => db.pool.query(sql, params);
const count = async (sql: string, params: unknown[] = []) => Number((await q(sql, params)).rows[0].n);
const DAY = 86_400_000;
const ago = (days: number) => new Date(Date.now() - days * DAY);

async function prune(batch: number, dryRun = false): Promise<Record<string, number>> {
  const { rows } = await q('select kind, removed from runledger.prune_due(p_batch => $1, p_dry_run => $2)', [batch, dryRun]);
  return Object.fromEntries(rows.map((r) => [r.kind, Number(r.removed)]));
}
/** prune_due until no kind fills a batch; the calls' results in order. */
async function pruneAll(batch: number): Promise<Array<Record<string, number>>> {
  const calls: Array<Record<string, number>> = [];
  for (;;) {
    const result = await prune(batch);
    calls.push(result);
    if (Object.values(result).every((n) => n < batch)) return calls;
  }
}

async function finished(workflow: string, daysAgo: number, columns: Record<string, unknown> = {}): Promise<string> {
  return insertRun(db.pool, {
    workflow,
    status: 'SUCCEEDED',
    finishedAt: ago(daysAgo),
    columns: { created_at: ago(daysAgo + 1), ...columns },
  });
}
async function addEvents(runId: string, n: number, daysAgo = 50): Promise<void> {
  for (let i = 0; i < n; i++) await q(`insert into runledger.events (run_id, kind, at) values ($1, 'note', $2)`, [runId, ago(daysAgo)]);
}
async function addSteps(runId: string, n: number): Promise<void> {
  for (let i = 0; i < n; i++) {
    await q(
      `insert into runledger.steps (run_id, seq, name, kind, status, output, started_at, fencing_token) values ($1, $2, $3, 'step', 'SUCCEEDED', '1', now(), 1)`,
      [runId, i, `s${i}`],
    );
  }
}
async function addSignal(runId: string, consumed: boolean): Promise<void> {
  await q(
    `insert into runledger.signals (signal_id, run_id, topic, payload, consumed_seq, consumed_at) values ($1, $2, 'go', '1', $3, $4)`,
    [`sig-${runId}-${consumed}`, runId, consumed ? 0 : null, consumed ? new Date() : null],
  );
}
async function addStream(runId: string, chunks: number, closed: boolean): Promise<void> {
  for (let i = 0; i < chunks; i++) {
    await q(
      `insert into runledger.stream_chunks (run_id, topic, "offset", chunk, seq, attempt, fencing_token) values ($1, 'out', $2, '"x"', 0, 1, 1)`,
      [runId, i],
    );
  }
  if (closed)
    await q(`insert into runledger.stream_ends (run_id, topic, end_offset, seq, fencing_token) values ($1, 'out', $2, 0, 1)`, [
      runId,
      chunks,
    ]);
}
async function addSession(id: string, entries: number, idleDays: number, holder: string | null = null): Promise<void> {
  await q(`insert into runledger.sessions (session_id, holder_run_id, held_at, entry_count, updated_at) values ($1, $2, $3, $4, $5)`, [
    id,
    holder,
    holder ? ago(idleDays) : null,
    entries,
    ago(idleDays),
  ]);
  for (let i = 1; i <= entries; i++) {
    await q(
      `insert into runledger.session_entries (session_id, seq, role, content, run_id, step_position, entry_index) values ($1, $2, 'user', '"hi"', $3, 0, $2)`,
      [id, i, `run-of-${id}`],
    );
  }
}
const exists = async (runId: string) => (await count('select count(*) as n from runledger.runs where run_id = $1', [runId])) === 1;

beforeAll(async () => {
  for (const name of ['w', 'pay', 'keep-long', 'short', 'bulk', 'live']) {
    await q(
      `insert into runledger.workflows (workflow_name, workflow_version, queue_name, max_recovery_attempts) values ($1, '1', 'default', 3)`,
      [name],
    );
  }
});

describe('prune_due', () => {
  // The runs, by what retention should do with them.
  const r = {} as Record<string, string>;
  const sums = async () => ({
    runs: await count('select count(*) as n from runledger.runs'),
    events: await count('select count(*) as n from runledger.events'),
    steps: await count('select count(*) as n from runledger.steps'),
    signals: await count('select count(*) as n from runledger.signals'),
    chunks: await count('select count(*) as n from runledger.stream_chunks'),
    ends: await count('select count(*) as n from runledger.stream_ends'),
    keys: await count('select count(*) as n from runledger.runs where idempotency_key is not null'),
    entries: await count('select count(*) as n from runledger.session_entries'),
    sessions: await count('select count(*) as n from runledger.sessions'),
    audit: await count('select count(*) as n from runledger.audit_log'),
  });

  beforeAll(async () => {
    await q(`delete from runledger.retention`);
    for (const [kind, keep, workflow] of [
      ['runs', '30 days', null],
      ['runs', '1 year', 'keep-long'],
      ['runs', '1 day', 'short'],
      ['events', '7 days', null],
      ['signals', '7 days', null],
      ['streams', '7 days', null],
      ['idempotency', '10 days', null],
      ['idempotency', null, 'pay'],
      ['session_entries', '30 days', null],
      // The floor the owner set (365 days by default) is the shortest an audit_log rule may be.
      ['audit_log', '400 days', null],
    ] as const) {
      await q('select runledger.set_retention(p_kind => $1, p_keep => $2::interval, p_workflow_name => $3)', [kind, keep, workflow]);
    }
    // Due for everything: goes whole.
    r.old = await finished('w', 40);
    await addSteps(r.old, 2);
    await addEvents(r.old, 3);
    await addSignal(r.old, true);
    await addStream(r.old, 2, true);
    // Past events, signals and streams but not runs: those go, the run and its steps stay.
    r.mid = await finished('w', 8);
    await addSteps(r.mid, 1);
    await addEvents(r.mid, 2);
    await addSignal(r.mid, true);
    await addSignal(r.mid, false);
    await addStream(r.mid, 1, true);
    // Nothing due.
    r.recent = await finished('w', 1);
    await addEvents(r.recent, 2);
    await addSignal(r.recent, true);
    await addStream(r.recent, 1, false);
    // Its key expired (10 days), its run not (30 days).
    r.keyed = await finished('w', 20, { idempotency_key: 'k1' });
    // Its workflow keeps keys forever: the run stays past 30 days, with its key.
    r.held = await finished('pay', 40, { idempotency_key: 'k2' });
    // Its workflow keeps runs a year; the default events rule still applies to it.
    r.long = await finished('keep-long', 40);
    await addEvents(r.long, 1);
    // Its workflow keeps runs a day, shorter than the default.
    r.short = await finished('short', 2);
    // Not finished, however old: stay, with their events.
    r.waiting = await insertRun(db.pool, { workflow: 'w', status: 'WAITING', columns: { created_at: ago(100) } });
    await addEvents(r.waiting, 2);
    await addSignal(r.waiting, true);
    r.running = await insertRun(db.pool, { workflow: 'w', status: 'RUNNING', columns: { created_at: ago(100) } });
    // A live fork of an old finished run; a live fork of a finished fork of another one.
    r.forkSource = await finished('w', 40);
    r.fork = await insertRun(db.pool, {
      workflow: 'w',
      status: 'PENDING',
      columns: { version_manifest: JSON.stringify({ forked_from: r.forkSource, from_step: 0 }) },
    });
    r.lineageRoot = await finished('w', 40);
    r.lineageMid = await finished('w', 40, { version_manifest: JSON.stringify({ forked_from: r.lineageRoot, from_step: 0 }) });
    r.lineageLive = await insertRun(db.pool, {
      workflow: 'w',
      status: 'WAITING',
      columns: { version_manifest: JSON.stringify({ forked_from: r.lineageMid, from_step: 0 }) },
    });
    // A finished run whose child is live; a finished child whose parent is live.
    r.parent = await finished('w', 40);
    r.liveChild = await insertRun(db.pool, { workflow: 'w', status: 'WAITING', columns: { parent_run_id: r.parent } });
    r.liveParent = await insertRun(db.pool, { workflow: 'w', status: 'WAITING', waitKind: 'child' });
    r.child = await finished('w', 40, { parent_run_id: r.liveParent });
    // Sessions: idle and free (goes), idle but held by a live run, free but recent.
    await addSession('idle', 3, 40);
    await addSession('held', 2, 40, r.running);
    await addSession('fresh', 1, 2);
    // Audit records: two old, the rest (the set_retention calls above) new.
    await q(`insert into runledger.audit_log (action, at) values ('old-action', $1), ('old-action', $1)`, [ago(500)]);
  });

  it('dry-run counts per kind what is due and changes nothing', async () => {
    const before = await sums();
    const due = await prune(1000, true);
    expect(due).toEqual({
      idempotency: 1, // keyed
      // old 3, mid 2, long 1 (not recent's, not the waiting run's)
      events: 6,
      // old 1, mid 2
      signals: 3,
      // old: 2 chunks + 1 end, mid: 1 chunk + 1 end
      streams: 5,
      // old and short; not held, long, forkSource, lineageRoot, lineageMid, parent, child
      runs: 2,
      session_entries: 3,
      audit_log: 2,
    });
    expect(await sums()).toEqual(before);
  });

  it('removes exactly what is due, in batches, and keeps what a live run or a held key needs', async () => {
    const before = await sums();
    const calls = await pruneAll(2);
    // A batch never removes more than its size per kind, so it took several calls.
    expect(calls.length).toBeGreaterThanOrEqual(3);
    for (const call of calls) {
      for (const [kind, n] of Object.entries(call)) {
        // A batch takes whole idle sessions: the first one whatever its length (3 entries here).
        expect(n, kind).toBeLessThanOrEqual(kind === 'session_entries' ? 3 : 2);
      }
    }
    const total = (kind: string) => calls.reduce((sum, call) => sum + call[kind]!, 0);
    expect(total('runs')).toBe(2);
    expect(total('idempotency')).toBe(1);
    // What went of a run's parts, counted under their kind, or with their run (old's, once
    // the runs kind took it in a batch before the events kind had taken them all).
    expect(total('events')).toBeGreaterThanOrEqual(3);
    expect(total('events')).toBeLessThanOrEqual(6);
    expect(total('signals')).toBeGreaterThanOrEqual(2);
    expect(total('signals')).toBeLessThanOrEqual(3);
    expect(total('streams')).toBeGreaterThanOrEqual(2);
    expect(total('streams')).toBeLessThanOrEqual(5);
    expect(total('session_entries')).toBe(3);
    // The two old records; the prune_due calls record themselves.
    expect(await count(`select count(*) as n from runledger.audit_log where action = 'old-action'`)).toBe(0);
    expect(await count(`select count(*) as n from runledger.audit_log where action = 'prune_due'`)).toBe(
      calls.filter((c) => Object.values(c).some((n) => n > 0)).length,
    );

    expect(await exists(r.old!)).toBe(false);
    expect(await exists(r.short!)).toBe(false);
    for (const kept of [
      'mid',
      'recent',
      'keyed',
      'held',
      'long',
      'waiting',
      'running',
      'forkSource',
      'fork',
      'lineageRoot',
      'lineageMid',
      'lineageLive',
      'parent',
      'liveChild',
      'liveParent',
      'child',
    ]) {
      expect(await exists(r[kept]!), kept).toBe(true);
    }
    const after = await sums();
    expect(after.runs).toBe(before.runs - 2);
    // Exactly the due rows are gone, whoever counted them.
    expect(after.events).toBe(before.events - 6);
    expect(after.signals).toBe(before.signals - 3);
    expect(after.chunks).toBe(before.chunks - 3);
    expect(after.ends).toBe(before.ends - 2);
    expect(after.keys).toBe(before.keys - 1);
    // old's 2 steps went with it; mid's stays.
    expect(after.steps).toBe(before.steps - 2);
    expect(await count('select count(*) as n from runledger.steps where run_id = $1', [r.mid])).toBe(1);
    for (const table of ['events', 'signals', 'stream_chunks', 'stream_ends']) {
      expect(await count(`select count(*) as n from runledger.${table} where run_id = $1`, [r.mid]), table).toBe(0);
    }
    expect(await count('select count(*) as n from runledger.events where run_id = $1', [r.recent])).toBe(2);
    expect(await count('select count(*) as n from runledger.signals where run_id = $1', [r.recent])).toBe(1);
    expect(await count('select count(*) as n from runledger.stream_chunks where run_id = $1', [r.recent])).toBe(1);
    expect(await count('select count(*) as n from runledger.events where run_id = $1', [r.waiting])).toBe(2);
    expect(await count('select count(*) as n from runledger.signals where run_id = $1', [r.waiting])).toBe(1);
    expect(await count('select count(*) as n from runledger.events where run_id = $1', [r.long])).toBe(0);
    // Keys: the expired one is cleared, the held one kept.
    const key = async (runId: string) =>
      (await q('select idempotency_key from runledger.runs where run_id = $1', [runId])).rows[0].idempotency_key;
    expect(await key(r.keyed!)).toBeNull();
    expect(await key(r.held!)).toBe('k2');
    // Sessions: only the idle free one went, with its entries.
    const sessions = (await q('select session_id from runledger.sessions order by session_id')).rows.map((s) => s.session_id);
    expect(sessions).toEqual(['fresh', 'held']);
    expect(after.entries).toBe(before.entries - 3);
    // Nothing is due any more.
    expect(Object.values(await prune(1000, true)).every((n) => n === 0)).toBe(true);
  });

  it('after its key expired, a start with the same key makes a new run; a held key returns its run', async () => {
    const again = (await q(`select runledger.start_run('w', '{}', '{"idempotency_key": "k1"}') as id`)).rows[0].id;
    expect(again).not.toBe(r.keyed);
    const same = (await q(`select runledger.start_run('pay', '{}', '{"idempotency_key": "k2"}') as id`)).rows[0].id;
    expect(same).toBe(r.held);
    await q('delete from runledger.runs where run_id = $1', [again]);
  });

  it('a batch size is respected across many runs', async () => {
    const ids: string[] = [];
    for (let i = 0; i < 25; i++) ids.push(await finished('bulk', 60));
    await q(`select runledger.set_retention('runs', '1 day', 'bulk')`);
    expect((await prune(10, true)).runs).toBe(25);
    const runs = (await pruneAll(10)).map((call) => call.runs);
    expect(runs).toEqual([10, 10, 5]);
    expect(await count(`select count(*) as n from runledger.runs where workflow_name = 'bulk'`)).toBe(0);
  });

  it('refuses a bad rule with RL003', async () => {
    const code = async (sql: string) =>
      q(sql).then(
        () => 'ok',
        (error: { code?: string }) => error.code,
      );
    expect(await code(`select runledger.set_retention('nonsense', '1 day')`)).toBe('RL003');
    expect(await code(`select runledger.set_retention('runs', '-1 day')`)).toBe('RL003');
    expect(await code(`select runledger.set_retention('audit_log', '1 day', 'w')`)).toBe('RL003');
    expect(await code(`select runledger.prune_due(0)`)).toBe('RL003');
  });
});

describe('the audit log is not erasable by the operators it records', () => {
  const code = (sql: string) =>
    q(sql).then(
      () => 'ok',
      (error: { code?: string }) => error.code,
    );

  it('an audit_log rule shorter than the floor is refused (42501), and only the owner lowers the floor', async () => {
    expect((await q('select audit_log_min_keep::text as floor from runledger.owner_settings')).rows[0].floor).toBe('365 days');
    const rulesBefore = (await q(`select keep::text from runledger.retention where kind = 'audit_log'`)).rows;
    for (const keep of ['0', '1 day', '364 days', '11 months']) {
      expect(await code(`select runledger.set_retention('audit_log', '${keep}')`), keep).toBe('42501');
    }
    expect((await q(`select keep::text from runledger.retention where kind = 'audit_log'`)).rows).toEqual(rulesBefore);
    // Longer, or forever, is anyone's to set.
    expect(await code(`select runledger.set_retention('audit_log', '366 days')`)).toBe('ok');
    expect(await code(`select runledger.set_retention('audit_log', null)`)).toBe('ok');
    // The owner lowers the floor (recorded), then a shorter rule is accepted.
    await q(`update runledger.owner_settings set audit_log_min_keep = '30 days'`);
    const change = (
      await q(`select db_user, arguments from runledger.audit_log where action = 'owner_settings' order by audit_id desc limit 1`)
    ).rows[0];
    expect(change.arguments).toMatchObject({ old: { audit_log_min_keep: '365 days' }, new: { audit_log_min_keep: '30 days' } });
    expect(await code(`select runledger.set_retention('audit_log', '30 days')`)).toBe('ok');
    expect(await code(`select runledger.set_retention('audit_log', '29 days')`)).toBe('42501');
    await q(`update runledger.owner_settings set audit_log_min_keep = '365 days'`);
    await q(`select runledger.clear_retention('audit_log')`);
  });

  it('prune_due keeps every record younger than the floor, whatever the rule, and the records of retention changes forever', async () => {
    await q(`delete from runledger.audit_log`);
    await q(`delete from runledger.retention`);
    // A rule set while the owner had lowered the floor, and the floor raised again since.
    await q(`update runledger.owner_settings set audit_log_min_keep = '0'`);
    await q(`select runledger.set_retention('audit_log', '0')`);
    await q(`update runledger.owner_settings set audit_log_min_keep = '365 days'`);
    await q(`insert into runledger.audit_log (action, at) values ('cancel_run', $1), ('cancel_run', $2), ('cancel_run', now())`, [
      ago(400),
      ago(300),
    ]);
    // The records of rule changes, old enough for any rule: kept.
    await q(
      `insert into runledger.audit_log (action, target, at) values ('set_retention', 'audit_log', $1), ('clear_retention', 'runs', $1), ('owner_settings', null, $1)`,
      [ago(900)],
    );
    const before = (await q(`select action, at from runledger.audit_log order by audit_id`)).rows;
    expect((await prune(1000, true)).audit_log).toBe(1);
    expect((await prune(1000)).audit_log).toBe(1);
    const left = (await q(`select action, at from runledger.audit_log where action <> 'prune_due' order by audit_id`)).rows;
    // Only the cancel of 400 days ago went: the one of 300 days is younger than the floor.
    expect(left).toEqual(before.filter((r) => !(r.action === 'cancel_run' && r.at.getTime() < ago(399).getTime())));
    expect(left.map((r) => r.action).filter((a) => a !== 'cancel_run')).toEqual([
      'owner_settings',
      'set_retention',
      'owner_settings',
      'set_retention',
      'clear_retention',
      'owner_settings',
    ]);
    await q(`select runledger.clear_retention('audit_log')`);
  });
});

describe('the cluster-wide lease', () => {
  it('lets one worker at a time run a pass, once per interval', async () => {
    const begin = async (worker: string, everyMs: number) =>
      (await q(`select runledger._maintenance_begin('lease-test', $1, $2, 60000) as ok`, [worker, everyMs])).rows[0].ok;
    const end = async (worker: string) => (await q(`select runledger._maintenance_end('lease-test', $1, '{}') as ok`, [worker])).rows[0].ok;
    expect(await begin('a', 0)).toBe(true);
    // a holds the lease: b is refused even when the task is due.
    expect(await begin('b', 0)).toBe(false);
    expect(await end('b')).toBe(false);
    expect(await end('a')).toBe(true);
    // Not due within the interval, for anyone; due again once it passed (0 here).
    expect(await begin('b', 3_600_000)).toBe(false);
    expect(await begin('a', 3_600_000)).toBe(false);
    expect(await begin('b', 0)).toBe(true);
    expect(await end('b')).toBe(true);
  });
});

describe('the workers', () => {
  it('apply retention on their own, one worker per pass', async () => {
    await q(`delete from runledger.retention`);
    await q(`delete from runledger.maintenance`);
    const ids: string[] = [];
    for (let i = 0; i < 5; i++) ids.push(await finished('live', 40));
    await q(`select runledger.set_retention('runs', '30 days', 'live')`);
    const logs: Array<{ engine: number; message: string; meta?: Record<string, unknown> }> = [];
    const engines: Engine[] = [0, 1].map((n) =>
      t.newEngine({ log: (_level, message, meta) => logs.push({ engine: n, message, ...(meta ? { meta } : {}) }) }),
    );
    for (const engine of engines) engine.workflow({ name: 'live', queue: 'retention-test' }, async () => 1);
    // Both ask at start; the lease and the hour-long interval let exactly one of them prune.
    const workers = await Promise.all(
      engines.map((engine, n) =>
        engine.runWorker({ workerId: `retention-${n}`, retentionIntervalMs: 3_600_000, queues: ['retention-test'] }),
      ),
    );
    await waitFor('the old runs pruned', async () =>
      (await count(`select count(*) as n from runledger.runs where run_id = any($1)`, [ids])) === 0 ? true : undefined,
    );
    const row = await waitFor('the pass recorded', async () => {
      const found = (await q(`select * from runledger.maintenance where task = 'retention' and finished_at is not null`)).rows[0];
      return found;
    });
    expect(['retention-0', 'retention-1']).toContain(row.worker_id);
    expect(row.last_result.removed.runs).toBe(5);
    // The worker logs its pass after it recorded it: wait for the line, not only the row.
    await waitFor('the pass logged', async () => logs.some((l) => l.message.startsWith('retention: removed')));
    const passes = logs.filter((l) => l.message.startsWith('retention: removed'));
    expect(passes).toHaveLength(1);
    expect(passes[0]!.engine).toBe(row.worker_id === 'retention-0' ? 0 : 1);
    expect(passes[0]!.message).toBe('retention: removed 5 runs in 1 batch(es)');
    expect(logs.filter((l) => l.message.includes('retention pass failed'))).toEqual([]);
    await Promise.all(workers.map((w) => w.stop()));
  });

  it('leave it alone with retentionIntervalMs 0', async () => {
    await q(`delete from runledger.maintenance`);
    const old = await finished('live', 40);
    const engine = t.newEngine();
    const flow = engine.workflow({ name: 'live', queue: 'retention-off' }, async () => 1);
    const worker = await engine.runWorker({ retentionIntervalMs: 0, queues: ['retention-off'] });
    // The worker has claimed and finished a run since it started: it ran, and pruned nothing.
    const handle = await engine.start(flow, undefined);
    expect(await handle.result()).toBe(1);
    await worker.stop();
    expect(await exists(old)).toBe(true);
    expect(await count('select count(*) as n from runledger.maintenance')).toBe(0);
    await q('delete from runledger.runs where run_id = $1', [old]);
  });

  it('rejects a bad retentionIntervalMs', async () => {
    const engine = t.newEngine();
    engine.workflow({ name: 'live', queue: 'retention-test' }, async () => 1);
    await expect(engine.runWorker({ retentionIntervalMs: 5 })).rejects.toThrow(/retentionIntervalMs/);
    await expect(engine.runWorker({ retentionIntervalMs: -1 })).rejects.toThrow(/retentionIntervalMs/);
  });
});

describe('the CLI', () => {
  it('sets, shows and clears rules; prune --dry-run prints per kind what would go', async () => {
    await q(`delete from runledger.retention`);
    let result = await runCli(db.url, ['retention']);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('no retention rules');
    result = await runCli(db.url, ['retention', 'set', 'runs', '30 days']);
    expect(result.code).toBe(0);
    result = await runCli(db.url, ['retention', 'set', 'idempotency', 'forever', '--workflow', 'pay']);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain('kept forever');
    result = await runCli(db.url, ['retention', '--json']);
    expect(result.code).toBe(0);
    const rules = JSON.parse(result.stdout) as Array<{ kind: string; workflow_name: string | null; keep: string | null }>;
    expect(rules.map(({ kind, workflow_name, keep }) => ({ kind, workflow_name, keep }))).toEqual([
      { kind: 'idempotency', workflow_name: 'pay', keep: null },
      { kind: 'runs', workflow_name: null, keep: '30 days' },
    ]);
    result = await runCli(db.url, ['retention']);
    expect(result.stdout).toMatch(/runs\s+\(default\)\s+30 days/);

    // The runs of the tests above that no rule protects now (no idempotency rule: a key lives with its run), and this one.
    const old = await finished('w', 45);
    const due = (await prune(1000, true)).runs!;
    expect(due).toBeGreaterThanOrEqual(1);
    result = await runCli(db.url, ['prune', '--dry-run']);
    expect(result.code).toBe(0);
    expect(result.stdout).toMatch(new RegExp(`runs\\s+${due}\\n`));
    expect(result.stdout).toContain('nothing was removed');
    expect(await exists(old)).toBe(true);
    result = await runCli(db.url, ['prune', '--dry-run', '--json']);
    expect(JSON.parse(result.stdout)).toMatchObject({ dryRun: true, removed: { runs: due } });
    result = await runCli(db.url, ['prune', '--json']);
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ dryRun: false, batches: 1, removed: { runs: due } });
    expect(await exists(old)).toBe(false);
    expect(result.stderr).toBe('');

    // A prune of several batches says how far it got, on stderr (stdout stays one JSON document).
    const three = [await finished('w', 45), await finished('w', 46), await finished('w', 47)];
    result = await runCli(db.url, ['prune', '--batch', '1', '--json']);
    expect(result.code).toBe(0);
    expect(JSON.parse(result.stdout)).toMatchObject({ dryRun: false, batches: 4, removed: { runs: 3 } });
    expect(result.stderr).toMatch(/^prune: 1 batch\(es\) so far, removed runs 1(, \w+ \d+)*; going on\n/);
    for (const id of three) expect(await exists(id)).toBe(false);

    // --older-than still works, with a dry run of its own.
    // It removes every finished run older than that, rules or not (the protected ones above too).
    const older = await finished('w', 3);
    const terminalOlder = `select count(*) as n from runledger.runs where runledger.is_terminal(status) and finished_at < now() - interval '2 days'`;
    const n = await count(terminalOlder);
    expect(n).toBeGreaterThan(1);
    result = await runCli(db.url, ['prune', '--older-than', '2 days', '--dry-run']);
    expect(result.stdout).toContain(`would remove ${n} finished run(s)`);
    expect(await exists(older)).toBe(true);
    result = await runCli(db.url, ['prune', '--older-than', '2 days']);
    expect(result.stdout).toContain(`removed ${n} finished run(s)`);
    expect(await exists(older)).toBe(false);
    expect(await count(terminalOlder)).toBe(0);

    result = await runCli(db.url, ['retention', 'clear', 'runs']);
    expect(result.stdout).toContain('cleared the runs rule of the default');
    expect(await count('select count(*) as n from runledger.retention')).toBe(1);
  });

  it('usage errors exit 2; --help shows the examples', async () => {
    let result = await runCli(db.url, ['retention', 'set', 'nonsense', '1 day']);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('KIND must be one of');
    result = await runCli(db.url, ['retention', 'set', 'runs', 'soon']);
    expect(result.code).toBe(2);
    expect(result.stderr).toContain('is not a PostgreSQL interval');
    result = await runCli(db.url, ['retention', 'set', 'audit_log', '1 day', '--workflow', 'w']);
    expect(result.code).toBe(2);
    result = await runCli(db.url, ['prune', '--older-than', '1 day', '--batch', '5']);
    expect(result.code).toBe(2);
    result = await runCli(db.url, ['retention', '--help']);
    expect(result.code).toBe(0);
    expect(result.stdout).toContain("runledger retention set runs '30 days'");
    result = await runCli(db.url, ['prune', '--help']);
    expect(result.stdout).toContain('runledger prune --dry-run');
  });
});
