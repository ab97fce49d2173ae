/**
 * `npm run demo:agents-sdk`: an agent written with the OpenAI Agents SDK, made durable by
 * runledger/openai-agents, offline. The agent (its tools, its approval) is the SDK's own;
 * runledger's part is runAgentDurably and runledgerSession. The refund tool needs an
 * approval: the run waits in the database holding no worker, is approved from SQL, and
 * goes on; the session's history is read from SQL at the end.
 *
 * The model is a scripted fake so that it runs without a key. With `@openai/agents`
 * installed and OPENAI_API_KEY set, `model: 'gpt-4.1'` in the Agent is the only change
 * (the SDK's default provider resolves the name).
 *
 * Same database as `npm run demo` (runledger_demo): DATABASE_URL's server, or an embedded one.
 */
import { Agent, tool, Usage, type Model, type ModelRequest, type ModelResponse } from '@openai/agents-core';
import { z } from 'zod';
import { createEngine } from '../../src/index.js';
import { runAgentDurably, runledgerSession } from '../../src/openai-agents/index.js';
import { openDatabase, waitFor, waitTerminal } from '../demo-support.js';

process.env.OPENAI_AGENTS_DISABLE_TRACING = '1';

// ---- the team's Agents SDK code, unchanged ----
const supportAgent = new Agent({
  name: 'support',
  instructions: 'Look the order up, then refund it.',
  model: scriptedModel(),
  tools: [
    tool({
      name: 'lookup_order',
      description: 'Looks an order up',
      parameters: z.object({ orderId: z.string() }),
      execute: async ({ orderId }) => `order ${orderId}: headphones, paid 49 EUR`,
    }),
    tool({
      name: 'refund',
      description: 'Refunds an order',
      parameters: z.object({ orderId: z.string(), amount: z.number() }),
      needsApproval: true,
      execute: async ({ orderId, amount }) => `refunded ${amount} EUR on ${orderId}`,
    }),
  ],
});
// ---- end ----

const database = await openDatabase();
const engine = createEngine({ connectionString: database.url, log: (level, message) => level === 'error' && console.error(message) });
let exitCode = 0;
try {
  await engine.migrate();
  // runledger's part: the workflow around the SDK's run, and the session it keeps in PostgreSQL.
  const support = engine.workflow(
    { name: 'agents-sdk-support', queue: 'agents-sdk-demo' },
    async (ctx, input: { user: string; message: string }) => {
      const session = runledgerSession(ctx, `user-${input.user}`);
      const result = await runAgentDurably(ctx, supportAgent, input.message, { session, approvers: ['finance.fay'] });
      await session.release();
      return result.finalOutput as string;
    },
  );
  const worker = await engine.runWorker({ queues: ['agents-sdk-demo'], pollIntervalMs: 100 });
  const user = `u${Date.now()}`;
  const handle = await engine.start(support, { user, message: 'Please refund order A-7, it broke.' });
  console.log(`run ${handle.runId}: the agent looks the order up and asks to refund it`);
  const request = await waitFor('the approval request', async () => {
    const { rows } = await engine.pool.query(
      `select request_id, action, evidence from runledger.approvals where run_id = $1 and decision is null`,
      [handle.runId],
    );
    return rows[0] as { request_id: string; action: string; evidence: unknown } | undefined;
  });
  console.log(`the run waits for an approval of "${request.action}" ${JSON.stringify(request.evidence)}, holding no worker`);
  await engine.pool.query(`select runledger.decide_approval($1, true, 'finance.fay', 'ok')`, [request.request_id]);
  const run = await waitTerminal(engine, handle.runId, 30_000);
  console.log(`run ${run.status}: ${JSON.stringify(run.output)}`);
  const { rows } = await engine.pool.query(`select seq, role, content->'item'->>'type' as item from runledger.session_history($1)`, [
    `user-${user}`,
  ]);
  console.log(`session user-${user}: ${rows.map((r) => `${r.role}${r.item ? `/${r.item}` : ''}`).join(', ')}`);
  const { rows: steps } = await engine.pool.query(`select name from runledger.steps where run_id = $1 order by seq`, [handle.runId]);
  console.log(`steps: ${steps.map((s) => s.name).join(', ')}`);
  if (run.status !== 'SUCCEEDED' || run.output !== 'Refunded 49 EUR on A-7.') exitCode = 1;
  await worker.stop();
} catch (error) {
  console.error('Agents SDK demo failed:', error);
  exitCode = 1;
} finally {
  await engine.close();
  await database.stop();
}
console.log(exitCode === 0 ? 'Agents SDK demo finished.' : 'Agents SDK demo FAILED.');
process.exit(exitCode);

/** A fake model: a function call per turn from a script, then the answer. Offline; a real one is a model name. */
function scriptedModel(): Model {
  const usage = () => new Usage({ requests: 1, inputTokens: 80, outputTokens: 20, totalTokens: 100 });
  return {
    async getResponse(request: ModelRequest): Promise<ModelResponse> {
      const items = Array.isArray(request.input) ? request.input : [];
      const calls = items.filter((item) => (item as { type?: string }).type === 'function_call').length;
      const call = (callId: string, name: string, args: unknown): ModelResponse => ({
        usage: usage(),
        output: [{ type: 'function_call', callId, name, arguments: JSON.stringify(args), status: 'completed' }],
      });
      if (calls === 0) return call('call_1', 'lookup_order', { orderId: 'A-7' });
      if (calls === 1) return call('call_2', 'refund', { orderId: 'A-7', amount: 49 });
      return {
        usage: usage(),
        output: [
          { type: 'message', role: 'assistant', status: 'completed', content: [{ type: 'output_text', text: 'Refunded 49 EUR on A-7.' }] },
        ],
      };
    },
    // eslint-disable-next-line require-yield
    async *getStreamedResponse() {
      throw new Error('this fake model does not stream');
    },
  };
}
