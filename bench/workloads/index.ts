import { bulkEnqueue } from './bulk-enqueue.js';
import { closedLoop, closedLoopHistory } from './closedloop.js';
import { queueHistory, txstepHistory, workflow3History } from './history.js';
import { latency, latencyHistory } from './latency.js';
import { queue } from './queue.js';
import { recovery } from './recovery.js';
import { txstep } from './txstep.js';
import type { Workload } from './types.js';
import { workflow3 } from './workflow3.js';

/** Workloads that run once per system, each repetition in a child process on a fresh database. */
export const WORKLOADS: Workload[] = [
  queue,
  workflow3,
  txstep,
  latency,
  recovery,
  queueHistory,
  workflow3History,
  txstepHistory,
  latencyHistory,
  closedLoop,
  closedLoopHistory,
  bulkEnqueue,
];

export function workloadByName(name: string): Workload {
  const workload = WORKLOADS.find((w) => w.name === name);
  if (!workload) throw new Error(`unknown workload ${name}`);
  return workload;
}
