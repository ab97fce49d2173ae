/**
 * Runs ONE measurement (workload × system × repetition) in a fresh process, so that
 * process-wide state (DBOS's singleton, pg patches, JIT, heap) never leaks from one
 * system into another. Prints `RESULT {json}` on stdout.
 *   BENCH_TASK={"workload":"queue","system":"runledger","url":"...","adminUrl":"...","database":"..."}
 */
import { countStatements } from './lib/pg-count.js';
import { systemById } from './systems/index.js';
import { workloadByName } from './workloads/index.js';

countStatements();
const task = JSON.parse(process.env.BENCH_TASK ?? '{}') as {
  workload: string;
  system: string;
  url: string;
  adminUrl: string;
  database: string;
};
const workload = workloadByName(task.workload);
const system = systemById(task.system);
try {
  const result = await workload.run({ system, url: task.url, adminUrl: task.adminUrl, database: task.database });
  console.log(`RESULT ${JSON.stringify(result)}`);
  process.exit(0);
} catch (error) {
  console.error(error);
  console.log(`RESULT ${JSON.stringify({ error: String((error as Error)?.message ?? error) })}`);
  process.exit(1);
}
