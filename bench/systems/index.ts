import { config } from '../lib/config.js';
import { dbos } from './dbos.js';
import { graphileWorker } from './graphile-worker.js';
import { pgBoss } from './pg-boss.js';
import { runledger } from './runledger.js';
import type { System } from './types.js';

/** Every column of the report, in order. Variants share an adapter. */
export const SYSTEMS: System[] = [
  runledger(),
  dbos(),
  dbos({ pollMs: config.dbosFastPollMs }),
  graphileWorker(),
  graphileWorker({ batched: true }),
  pgBoss(),
  pgBoss({ batched: true }),
];

export function systemById(id: string): System {
  const system = SYSTEMS.find((s) => s.id === id);
  if (!system) throw new Error(`unknown system ${id}; known: ${SYSTEMS.map((s) => s.id).join(', ')}`);
  return system;
}
