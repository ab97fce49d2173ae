/**
 * `npm run demo:agent`: a durable coding agent, end to end and offline.
 *
 *   1. A worker process runs the agent: it reads the code, fixes the bug (the diff is an
 *      artifact), runs the tests and asks senior.sam to approve the merge. The run waits
 *      in the database, holding no worker; the demo approves it from SQL.
 *   2. The worker merges pull request 7 at the (fake) git provider with the key
 *      pr-7-merge and is SIGKILLed before the outcome is checkpointed.
 *   3. A second worker takes the run over: the merge operation is UNKNOWN, reconcile asks
 *      the provider, which has the merge, so nothing is merged twice; the workspace is
 *      rebuilt from the recorded diff for the final check; verify gates SUCCEEDED.
 *   4. The checks, from the tables: one merge, each tool result once in the session.
 *
 * Same database as `npm run demo` (runledger_demo): DATABASE_URL's server, or an embedded one.
 */
import { fileURLToPath } from 'node:url';
import { existsSync, rmSync } from 'node:fs';
import { dirname } from 'node:path';
import { createEngine } from '../../src/index.js';
import {
  approvalAsked,
  killedWorker,
  openDatabase,
  operationHistory,
  spawnDemoWorker,
  waitFor,
  waitTerminal,
  type DemoDatabase,
} from '../demo-support.js';
import { defineCodingAgent, SENIOR } from './agent.js';
import { startGitProvider } from './git-provider.js';
import { workspaceDir } from './repo.js';

const WORKER = fileURLToPath(new URL('./worker.ts', import.meta.url));
const began = Date.now();
let database: DemoDatabase;
try {
  database = await openDatabase();
} catch (error) {
  console.error(`demo failed: ${(error as Error).message}`);
  process.exit(1);
}
const provider = await startGitProvider();
const engine = createEngine({ connectionString: database.url, log: (level, message) => level === 'error' && console.error(message) });
const children: Array<{ kill(): void }> = [];
const workerPids: number[] = [];
const failures: string[] = [];
const check = (ok: boolean, what: string) => {
  console.log(`   ${ok ? 'ok  ' : 'FAIL'} ${what}`);
  if (!ok) failures.push(what);
};

async function spawnWorker(crash: boolean) {
  const worker = await spawnDemoWorker(WORKER, {
    DATABASE_URL: database.url,
    PROVIDER_URL: provider.url,
    CRASH_AFTER_MERGE: crash ? '1' : '0',
  });
  children.push(worker);
  workerPids.push(worker.pid);
  return worker;
}

let exitCode = 0;
try {
  await engine.migrate();
  const agent = defineCodingAgent(engine, { providerUrl: provider.url });
  // A merge key stands for one merge forever (the ledger keeps it unique), so each demo on
  // the same database works on a new pull request: 7 the first time, then 8, 9...
  const earlier = await engine.pool.query(`select count(*)::int as n from runledger.runs where workflow_name = 'coding-agent'`);
  const PR = 7 + earlier.rows[0].n;

  console.log(`\n1. A worker process runs the coding agent on pull request ${PR}`);
  const first = await spawnWorker(true);
  const handle = await engine.start(agent, { pr: PR, task: `price(999, 19) returns 1188; it should be 1189. Fix it and merge PR ${PR}.` });
  console.log(`   run ${handle.runId} on worker pid ${first.pid}`);
  const request = await approvalAsked(engine, handle.runId);
  const waiting = await engine.getRun(handle.runId);
  console.log(`   the agent asks ${SENIOR} to approve "${request.action}" ${JSON.stringify(request.evidence)}`);
  console.log(`   the run is ${waiting?.status}, holding no worker; ${SENIOR} approves from SQL in a moment`);
  await new Promise((resolve) => setTimeout(resolve, 800));
  await engine.pool.query(`select runledger.decide_approval($1, true, $2, 'LGTM')`, [request.request_id, SENIOR]);

  console.log('\n2. The worker merges, and is killed before the outcome is checkpointed');
  const how = await killedWorker(first);
  console.log(
    `   worker pid ${first.pid} ended by ${how}; the provider has ${provider.merges().length} merge(s) from ${provider.requests()} request(s)`,
  );
  check(how === 'SIGKILL', 'the first worker was SIGKILLed after the merge call');

  console.log('\n3. A second worker takes the run over');
  const second = await spawnWorker(false);
  const run = await waitTerminal(engine, handle.runId, 60_000);
  console.log(`   run ${run.status} (${run.terminationReason}) on worker pid ${second.pid}, ${run.recoveryAttempts} recovery`);

  console.log('\n4. What the tables say');
  check(run.status === 'SUCCEEDED', `the run SUCCEEDED: ${JSON.stringify(run.output)}`);
  const evidence = run.terminationEvidence as { verification?: { merged?: boolean; tests?: string } };
  check(evidence.verification?.merged === true, `verify passed with evidence: ${JSON.stringify(evidence.verification?.tests)}`);
  check(provider.merges().length === 1 && provider.requests() === 1, `merged once at the provider (${provider.requests()} merge request)`);
  const op = await operationHistory(engine, handle.runId, 'tool:merge_pr');
  console.log(`   operation tool:merge_pr: ${JSON.stringify(op)}`);
  check(
    op?.status === 'SUCCEEDED' && op?.idempotency_key === `pr-${PR}-merge` && String(op?.history).includes('operation_unknown'),
    `the merge went through the operation ledger with key pr-${PR}-merge: UNKNOWN after the crash, settled by reconcile`,
  );
  const { rows: entries } = await engine.pool.query(
    `select role, content from runledger.session_entries where session_id = $1 order by seq`,
    [`pr-${PR}`],
  );
  const toolResults = entries.filter((e) => e.role === 'tool').map((e) => e.content.toolCallId as string);
  console.log(`   session pr-${PR}: ${entries.map((e) => e.role).join(', ')}`);
  check(
    toolResults.length === new Set(toolResults).size && toolResults.length === 4,
    `each tool result once in the session (${toolResults.join(', ')})`,
  );
  // The first look at the workspace on the second worker: runAgent's check of the model's `complete`.
  const { rows: finalCheck } = await engine.pool.query(`select output from runledger.steps where run_id = $1 and name = 'check-complete'`, [
    handle.runId,
  ]);
  const final = finalCheck[0]?.output as { rebuiltWorkspace: boolean; pid: number; tests: { passed: boolean } } | undefined;
  check(
    final?.rebuiltWorkspace === true && final.pid === second.pid && final.tests.passed,
    `the second worker (pid ${second.pid}) rebuilt the workspace from the recorded diff, and the tests pass there`,
  );
  // The workspace is the run's environment: reclaimed once the run ended, by the worker that finished it.
  const reclaimed = await waitFor('the workspace environment reclaimed', async () => {
    const { rows } = await engine.pool.query(
      `select count(*) filter (where reclaimed_status = 'SUCCEEDED')::int as done, count(*)::int as made from runledger.environments where run_id = $1`,
      [handle.runId],
    );
    return rows[0].done === rows[0].made && rows[0].made > 0 ? rows[0] : undefined;
  });
  check(
    reclaimed !== undefined && !existsSync(workspaceDir(handle.runId, String(second.pid))),
    `the workspace environment was reclaimed once the run ended (${reclaimed?.made ?? 0} made, all reclaimed), and its directory is gone`,
  );
  const { rows: diff } = await engine.pool.query(`select name, size, sha256 from runledger.artifacts where run_id = $1`, [handle.runId]);
  console.log(`   artifacts: ${diff.map((d) => `${d.name} (${d.size} bytes, sha256 ${String(d.sha256).slice(0, 12)})`).join(', ')}`);
  const { rows: chunks } = await engine.pool.query(
    `select count(*)::int as n from runledger.stream_chunks where run_id = $1 and topic = 'model'`,
    [handle.runId],
  );
  console.log(`   the model's streamed output: ${chunks[0].n} chunks (runledger tail ${handle.runId})`);
  console.log(`\n   psql: select * from runledger.session_history('pr-${PR}');`);
  console.log(`         select * from runledger.run_timeline where run_id = '${handle.runId}' order by at;`);
  if (failures.length > 0) exitCode = 1;
  console.log(
    `\nAgent demo ${failures.length === 0 ? 'finished' : `FAILED (${failures.length} checks)`} in ${((Date.now() - began) / 1000).toFixed(1)} s.`,
  );
} catch (error) {
  console.error('agent demo failed:', error);
  exitCode = 1;
} finally {
  for (const child of children) child.kill();
  // The workspaces of the demo's workers (a cache; the run's history is the truth).
  for (const pid of workerPids) rmSync(dirname(workspaceDir('x', String(pid))), { recursive: true, force: true });
  await engine.close();
  await provider.close();
  await database.stop();
}
process.exit(exitCode);
