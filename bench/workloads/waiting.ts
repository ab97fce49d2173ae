/**
 * The `waiting` workload (100,000 runs parked on a durable wait: worker RSS, bytes per
 * waiting run, resume rate, peak RUNNING) runs on its own, for runledger only, because
 * it takes minutes: `npx tsx bench/waits-100k.ts` (results in bench/results/waits-*.json).
 * None of the peers has a wait that frees the worker to compare it with.
 */
export const WAITING_STATUS = 'see bench/waits-100k.ts (runs separately: npx tsx bench/waits-100k.ts)';

export function waitingNotImplemented(): { status: string; plannedMetrics: string[] } {
  return {
    status: WAITING_STATUS,
    plannedMetrics: [
      'worker RSS with 100,000 waiting runs (MiB)',
      'bytes per waiting run (pg_total_relation_size delta / runs)',
      'resume rate (runs/s)',
    ],
  };
}
