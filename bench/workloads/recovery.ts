import type { ChildProcess } from 'node:child_process';
import { config } from '../lib/config.js';
import { Probe } from '../lib/db.js';
import { inParallel } from '../lib/drain.js';
import { PLANS } from '../lib/plans.js';
import { spawnTs, waitForExit, waitForLine } from '../lib/spawn.js';
import { sleep } from '../lib/stats.js';
import type { Workload } from './types.js';

const plan = PLANS.recovery;
const LAST = plan.steps.length - 1;

export const recovery: Workload = {
  name: 'recovery',
  description: `${config.recoveryRuns.toLocaleString('en')} three-step runs (the middle step sleeps 50 ms) worked by a worker child process (concurrency ${config.concurrency}) that is SIGKILLed once ${Math.round(config.recoveryKillAt * 100)}% of the runs have finished; a new worker process is started at once and timed from its start (ready) until the system's tables show every run complete, capped at ${config.recoveryTimeoutSeconds} s. runledger runs with leaseMs ${config.recoveryLeaseMs} here; the others use their own mechanisms at their defaults (pg-boss: its batched variant, whose default-settings twin is too slow to reach the kill in time; same expiry mechanism). A system not recovered within the cap is not repeated. Step executions are logged by the step bodies, so steps executed twice are counted.`,
  // pg-boss at its defaults (8 jobs/s at concurrency 16) would take minutes just to reach the kill; its batched
  // variant has the same recovery mechanism (active jobs expire after expire_in, default 15 minutes).
  runsOn: (system) => !['graphile-worker-batched', 'pg-boss'].includes(system.id),
  // Not recovered within the cap: the peer's timeout is minutes or hours, another repetition says the same.
  settledBy: (m) => m.error === undefined && m.recoverySeconds === null,
  metrics: [
    { key: 'recoverySeconds', label: 'new worker start → all complete (s)', better: 'lower', digits: 2 },
    { key: 'duplicateSteps', label: 'step executions duplicated', better: 'lower' },
    { key: 'inFlightAtKill', label: 'runs started, not finished at the kill', better: 'lower', noRatio: true },
    { key: 'incomplete', label: 'runs not complete at the cap', better: 'lower', noRatio: true },
  ],
  async run({ system, url }) {
    await system.setup(url, plan);
    const probe = new Probe(url);
    await probe.connect();
    await probe.query(
      'create table bench_exec (id bigserial primary key, unit int not null, step int not null, pid int not null, at timestamptz not null default clock_timestamp())',
    );
    const producer = await system.producer(url, plan, config.poolMax);
    await inParallel(config.recoveryRuns, config.enqueuers, (n) => producer.enqueue(n));
    await producer.close();

    const env = (leaseMs?: number) => ({ BENCH_WORKER: JSON.stringify({ system: system.id, url, plan: plan.name, leaseMs }) });
    const leaseMs = system.id === 'runledger' ? config.recoveryLeaseMs : undefined;
    const finishedUnits = () => probe.scalar(`select count(distinct unit)::int from bench_exec where step = ${LAST}`);
    const children: ChildProcess[] = [];
    try {
      const first = spawnTs('worker-child.ts', env(leaseMs));
      children.push(first);
      await waitForLine(first, 'READY', 60_000);
      const killAt = Math.floor(config.recoveryRuns * config.recoveryKillAt);
      const killDeadline = performance.now() + 120_000;
      while ((await finishedUnits()) < killAt) {
        if (performance.now() > killDeadline) throw new Error(`first worker did not finish ${killAt} runs within 120 s`);
        await sleep(20);
      }
      first.kill('SIGKILL');
      await waitForExit(first, 10_000);
      const inFlightAtKill = await probe.scalar(
        `select count(*)::int from (select unit from bench_exec group by unit having max(step) < ${LAST}) s`,
      );

      const second = spawnTs('worker-child.ts', env(leaseMs));
      children.push(second);
      await waitForLine(second, 'READY', 60_000);
      const t0 = performance.now();
      const capMs = config.recoveryTimeoutSeconds * 1000;
      let pending = await probe.scalar(system.pendingSql(plan));
      while (pending > 0 && performance.now() - t0 < capMs) {
        await sleep(50);
        pending = await probe.scalar(system.pendingSql(plan));
      }
      const seconds = (performance.now() - t0) / 1000;
      second.kill('SIGTERM');
      if (!(await waitForExit(second, 15_000))) second.kill('SIGKILL');

      const duplicateSteps = await probe.scalar('select (count(*) - count(distinct (unit, step)))::int from bench_exec');
      const incomplete = await probe.scalar(system.pendingSql(plan));
      return {
        recoverySeconds: pending === 0 ? seconds : null,
        duplicateSteps,
        inFlightAtKill,
        incomplete,
        note: pending === 0 ? null : `not recovered within ${config.recoveryTimeoutSeconds} s (${pending} still pending)`,
      };
    } finally {
      for (const child of children) if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await probe.end();
    }
  },
};
