import { fileURLToPath } from 'node:url';
import { describe, expect, it, onTestFailed } from 'vitest';
import { waitFor } from '../../helpers/database.js';
import { useTestEngine } from '../../helpers/test-engine.js';
import { stoppedAfterEach } from '../../helpers/cleanup.js';
import { spawnWorker, type WorkerProcess } from '../../helpers/worker-process.js';

/**
 * Version-1 and version-2 workers side by side with runs of both versions in flight, with
 * real worker processes (test/fixtures/mixed-version-worker.ts): a version-1 worker is
 * SIGKILLed mid-run and another version-1 worker takes over. Every run finishes on its own
 * version's code, each business write of a transaction step exists exactly once, and no
 * run is ever taken by a worker of the other version (which would end it in NON_DETERMINISM:
 * the versions name their steps differently).
 */
const { db } = useTestEngine({
  engine: false,
  prepare: async (db) => {
    // No unique constraint: a write done twice would show as two rows.
    await db.pool.query(`create table mixed_effects (
      effect_id bigserial primary key, run_id text not null, step_name text not null, version text not null,
      pid int not null, at timestamptz not null default clock_timestamp())`);
  },
});
const { processes } = stoppedAfterEach();
const SCRIPT = fileURLToPath(new URL('../../fixtures/mixed-version-worker.ts', import.meta.url));
const RUNS_PER_VERSION = 40;

interface Worker extends WorkerProcess {
  workerId: string;
}

async function mixedWorker(version: string): Promise<Worker> {
  const w = await spawnWorker({ DATABASE_URL: db.url, VERSION: version }, SCRIPT);
  processes.push(w);
  onTestFailed(() => console.error(`--- worker v${version} ${w.pid} ---\n${w.output().slice(-3000)}`));
  return { ...w, workerId: /ready (\S+)/.exec(w.output())![1]! };
}

const stepNames = (version: string) => {
  const suffix = version === '1' ? '' : `-v${version}`;
  return {
    writes: [1, 2, 3].map((i) => `write-${i}${suffix}`),
    checkpoints: [`write-1${suffix}`, `pause-1${suffix}`, `write-2${suffix}`, `pause-2${suffix}`, `write-3${suffix}`],
  };
};

/** True once every run is SUCCEEDED; otherwise throws what is left (shown if waitFor times out). */
async function allSucceeded(runIds: string[]): Promise<boolean> {
  const left = await db.pool.query(
    `select run_id, workflow_version, status, lease_owner, fencing_token, termination_reason,
            (select string_agg(kind, ',' order by event_id) from runledger.events e where e.run_id = r.run_id) as history
       from runledger.runs r where run_id = any($1) and status <> 'SUCCEEDED'`,
    [runIds],
  );
  if (left.rowCount === 0) return true;
  throw new Error(`${left.rowCount} not succeeded, e.g. ${JSON.stringify(left.rows.slice(0, 3))}`);
}

describe('version-1 and version-2 workers with runs in flight', () => {
  it('lose nothing and duplicate nothing when a version-1 worker is SIGKILLed mid-run; each run stays on its version', async () => {
    const [v1, v2] = await Promise.all([mixedWorker('1'), mixedWorker('2')]);

    // 80 runs started from SQL, the versions interleaved: 1, 2, 1, 2, ...
    const started = await db.pool.query<{ ids: string[] }>(
      `select array_agg(runledger.start_run('mixed', jsonb_build_object('n', g),
                                            jsonb_build_object('version', (1 + g % 2)::text)) order by g) as ids
         from generate_series(0, $1 - 1) g`,
      [2 * RUNS_PER_VERSION],
    );
    const runIds = started.rows[0]!.ids;
    expect(runIds).toHaveLength(2 * RUNS_PER_VERSION);

    // Kill version 1's worker while it is inside a run (one of its runs has written some of its
    // effects, not all), once it has finished some of its runs and not all of them.
    await waitFor('some version-1 runs finished and one in flight with some of its effects written', async () => {
      const r = await db.pool.query(
        `select (select count(*)::int from runledger.runs where run_id = any($1) and workflow_version = '1' and status = 'SUCCEEDED') as done,
                exists (select 1 from runledger.runs r
                         where r.run_id = any($1) and r.workflow_version = '1' and r.status = 'RUNNING' and r.lease_owner = $2
                           and (select count(*) from mixed_effects e where e.run_id = r.run_id) between 1 and 2) as in_flight`,
        [runIds, v1.workerId],
      );
      return r.rows[0].in_flight && r.rows[0].done >= 1 && r.rows[0].done < RUNS_PER_VERSION;
    });
    v1.kill('SIGKILL');
    expect((await v1.exited).signal).toBe('SIGKILL');

    // What the killed process left behind: runs it finished, and runs it wrote part of and did not finish.
    const finishedBeforeKill = (
      await db.pool.query<{ run_id: string }>(
        `select run_id from runledger.runs where run_id = any($1) and workflow_version = '1' and status = 'SUCCEEDED'`,
        [runIds],
      )
    ).rows.map((row) => row.run_id);
    expect(finishedBeforeKill.length).toBeGreaterThanOrEqual(1);
    expect(finishedBeforeKill.length).toBeLessThan(RUNS_PER_VERSION);
    const interrupted = (
      await db.pool.query<{ run_id: string }>(
        `select r.run_id from runledger.runs r
          where r.run_id = any($1) and r.workflow_version = '1' and r.status <> 'SUCCEEDED'
            and (select count(*) from mixed_effects e where e.run_id = r.run_id and e.pid = $2) between 1 and 2`,
        [runIds, v1.pid],
      )
    ).rows.map((row) => row.run_id);
    expect(interrupted.length).toBeGreaterThanOrEqual(1);

    const v1b = await mixedWorker('1');
    await waitFor('all 80 runs succeeded', () => allSucceeded(runIds), 60_000);

    // Every run SUCCEEDED on its own version's code.
    const runs = (
      await db.pool.query<{ run_id: string; workflow_version: string; status: string; output: unknown; fencing_token: number }>(
        `select run_id, workflow_version, status, output, fencing_token::int from runledger.runs where run_id = any($1)`,
        [runIds],
      )
    ).rows;
    expect(runs).toHaveLength(2 * RUNS_PER_VERSION);
    const versionOf = new Map(runs.map((r) => [r.run_id, r.workflow_version]));
    expect(runIds.map((id) => versionOf.get(id))).toEqual(runIds.map((_, g) => String(1 + (g % 2))));
    for (const run of runs) {
      expect(run, run.run_id).toMatchObject({ status: 'SUCCEEDED', output: `done on v${run.workflow_version}` });
    }

    // Exactly one effect row per transaction step of every run, all of the run's version.
    const effects = (
      await db.pool.query<{ run_id: string; step_name: string; version: string; pid: number }>(
        `select run_id, step_name, version, pid from mixed_effects order by effect_id`,
      )
    ).rows;
    expect(effects).toHaveLength(3 * 2 * RUNS_PER_VERSION);
    for (const runId of runIds) {
      const version = versionOf.get(runId)!;
      const mine = effects.filter((e) => e.run_id === runId);
      expect(mine.map((e) => e.step_name).sort(), runId).toEqual(stepNames(version).writes);
      expect(new Set(mine.map((e) => e.version)), runId).toEqual(new Set([version]));
    }
    // The checkpoints are version-consistent too: each run recorded its own version's steps, in order.
    const checkpoints = await db.pool.query<{ run_id: string; names: string[] }>(
      `select run_id, array_agg(name order by seq) as names from runledger.steps where run_id = any($1) group by run_id`,
      [runIds],
    );
    expect(checkpoints.rows).toHaveLength(2 * RUNS_PER_VERSION);
    for (const row of checkpoints.rows) expect(row.names, row.run_id).toEqual(stepNames(versionOf.get(row.run_id)!).checkpoints);

    // Nothing dead-lettered (a run replayed on the other version's code would have been, for NON_DETERMINISM).
    const deadLettered = await db.pool.query(
      `select run_id, detail from runledger.events where run_id = any($1) and kind = 'dead_lettered'`,
      [runIds],
    );
    expect(deadLettered.rows).toEqual([]);

    // Version 2's effects were written by the version-2 process alone; version 1's by the two version-1 processes.
    const pids = (version: string) => new Set(effects.filter((e) => e.version === version).map((e) => e.pid));
    expect(pids('2')).toEqual(new Set([v2.pid]));
    expect(pids('1')).toEqual(new Set([v1.pid, v1b.pid]));
    // Each run was claimed only by workers of its version.
    const claims = await db.pool.query<{ run_id: string; worker: string }>(
      `select run_id, detail->>'worker' as worker from runledger.events where run_id = any($1) and kind = 'claimed'`,
      [runIds],
    );
    for (const claim of claims.rows) {
      const allowed = versionOf.get(claim.run_id) === '1' ? [v1.workerId, v1b.workerId] : [v2.workerId];
      expect(allowed, `claim of ${claim.run_id}`).toContain(claim.worker);
    }

    // The kill really interrupted runs in flight: each run the killed process wrote part of was
    // recovered (its lease expired, a new fencing token) and finished by the second version-1 process.
    const expired = await db.pool.query<{ run_id: string; last_owner: string }>(
      `select run_id, detail->>'last_owner' as last_owner from runledger.events where run_id = any($1) and kind = 'lease_expired'`,
      [runIds],
    );
    for (const runId of interrupted) {
      const writers = new Set(effects.filter((e) => e.run_id === runId).map((e) => e.pid));
      expect(writers, `writers of ${runId}`).toEqual(new Set([v1.pid, v1b.pid]));
      expect(runs.find((r) => r.run_id === runId)!.fencing_token, runId).toBeGreaterThanOrEqual(2);
      expect(expired.rows, runId).toContainEqual({ run_id: runId, last_owner: v1.workerId });
    }
    // The runs the killed process had finished were not run again.
    for (const runId of finishedBeforeKill) {
      expect(runs.find((r) => r.run_id === runId)!.fencing_token, runId).toBe(1);
      expect(
        effects.filter((e) => e.run_id === runId).map((e) => e.pid),
        runId,
      ).toEqual([v1.pid, v1.pid, v1.pid]);
    }
    // Only version-1 runs, and only the killed worker's, were recovered; no version-2 run ever changed hands.
    for (const row of expired.rows) {
      expect(versionOf.get(row.run_id), row.run_id).toBe('1');
      expect(row.last_owner, row.run_id).toBe(v1.workerId);
    }
    for (const run of runs.filter((r) => r.workflow_version === '2')) expect(run.fencing_token, run.run_id).toBe(1);
  });
});
