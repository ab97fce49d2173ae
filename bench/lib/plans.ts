import type { Plan } from '../systems/types.js';

export const PLANS = {
  /** queue: one no-op step per job. */
  one: { name: 'one', steps: [{ name: 'a', kind: 'noop' }] },
  /** workflow3: three no-op steps, each checkpointed (or three chained jobs). */
  three: {
    name: 'three',
    steps: [
      { name: 'a', kind: 'noop' },
      { name: 'b', kind: 'noop' },
      { name: 'c', kind: 'noop' },
    ],
  },
  /** txstep: one transaction step inserting one business row. */
  tx: { name: 'tx', steps: [{ name: 'insert', kind: 'tx' }] },
  /** recovery: the middle step sleeps so that runs are caught inside it by the SIGKILL. */
  recovery: {
    name: 'recovery',
    steps: [
      { name: 'a', kind: 'noop' },
      { name: 'b', kind: 'sleep', ms: 50 },
      { name: 'c', kind: 'noop' },
    ],
  },
} satisfies Record<string, Plan>;

export type PlanName = keyof typeof PLANS;
